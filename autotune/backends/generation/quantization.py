"""Generation's precisions: torchao weight-only and dynamic int8/int4, SmoothQuant and bf16, applied to a
causal language model in place, and which of them this runtime's torch/torchao can run on CPU. Imports
torch and torchao inside functions only, so the registry loads in any runtime."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.backends.base import BackendOptions, choice
from autotune.backends.generation.sensitivity import SHARES
from autotune.backends.precision import bucket_of, judge, judge_mix

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig
    from autotune.backends.generation.sensitivity import Sensitivity, WeightFormat
    from autotune.backends.precision import ExecutedPrecision

PRECISIONS = ("fp32", "bf16", "woq_int8", "da8w8", "woq_int4", "da8w4", "smoothquant_int8")
INT4 = ("woq_int4", "da8w4")
# Weight-only precisions: the GEMMs take the activations in the model's float dtype. bf16 is what the
# write-ups' A16W8 / A16W4 mean; torchao's CPU int4 kernel has no fast path for fp32 activations (a
# 100M decoder's 512-token prefill took 32.7 s with fp32 activations against 0.51 s with bf16 ones on a
# Xeon with AMX, docs/manual/benchmarks-log.md), so fp32 is an option, not the default.
WEIGHT_ONLY = ("woq_int8", "woq_int4")
MIXABLE = ("woq_int8", "da8w8", *INT4)  # the precisions compressed_share mixes with a wider one (MIX_KEPT)


@dataclass(frozen=True)
class TorchGenerateOptions(BackendOptions):
    """The options of the engines that decode in PyTorch at a torchao precision (eager, inductor): the
    decode loop's KV cache and the quantization's own."""

    kv_cache: str = choice("dynamic", "static")
    group_size: int = choice(128, 64, 32, precisions=INT4)
    alpha: float = choice(0.5, 0.25, 0.75, precisions=("smoothquant_int8",))
    # fp32 where a config predates the option, as it was measured then; bf16 first in the space
    activations: str = choice("bf16", "fp32", precisions=WEIGHT_ONLY, default="fp32")
    # the share of the blocks' weights (least sensitive matrices first, generation/sensitivity.py) in the
    # precision, the rest and the output layer in the one above it (MIX_KEPT); torchao's filter_fn picks them.
    # Never sampled: the mix search bisects for it (tuning/mix_search.py)
    compressed_share: float = choice(*SHARES, precisions=MIXABLE)


# Quantized once by the prepare process, cached, and loaded by every trial with the same numerics.
QUANTIZED = ("woq_int8", "da8w8", "woq_int4", "da8w4", "smoothquant_int8")
CALIBRATION_LENGTH = 128  # tokens per SmoothQuant calibration window (fewer when the prompt is shorter)


def quantization_config(precision: str, group_size: int) -> Any:
    """torchao's config for a precision (int4's with its group size), in the API of the torchao this
    runtime has. Raises RuntimeError saying why when this torchao cannot run it on CPU."""
    from torchao.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
    )

    group_size = int(group_size)
    if precision == "woq_int8":
        return Int8WeightOnlyConfig()
    if precision == "da8w8":
        return Int8DynamicActivationInt8WeightConfig()
    if precision == "woq_int4":
        try:  # torchao <= 0.13: the CPU packing is a layout
            from torchao.dtypes import Int4CPULayout

            return Int4WeightOnlyConfig(group_size=group_size, layout=Int4CPULayout(), version=1)
        except (ImportError, TypeError):
            pass
        try:  # torchao 0.18: the CPU packing (Int4OpaqueTensor) lives in the prototype workflow
            from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

            return PrototypeInt4WeightOnlyConfig(group_size=group_size)
        except ImportError:
            pass
        import inspect

        formats = inspect.signature(Int4WeightOnlyConfig).parameters.get("int4_packing_format")
        if formats is not None:
            for name in ("opaque", "tile_packed_to_4d"):
                try:
                    return Int4WeightOnlyConfig(group_size=group_size, int4_packing_format=name)
                except (ValueError, TypeError, AttributeError):
                    continue
        raise RuntimeError("this torchao has no CPU packing for int4 weights (Int4CPULayout / 'opaque')")
    if precision == "da8w4":
        try:  # torchao 0.18: a prototype config; it asserts when the wheel lacks the CPU kernel
            from torchao.prototype.quantization.int4 import Int8DynamicActivationInt4WeightConfig as Prototype
            from torchao.quantization.quant_primitives import MappingType

            return Prototype(group_size=group_size, act_mapping_type=MappingType.SYMMETRIC)
        except ImportError:
            pass
        try:
            from torchao.dtypes import Int8DynamicActInt4WeightCPULayout
            from torchao.quantization import Int8DynamicActivationInt4WeightConfig
            from torchao.quantization.quant_primitives import MappingType
        except ImportError as exc:
            raise RuntimeError(f"this torchao has no CPU layout for DA8W4 ({exc})") from None
        import torch

        if not hasattr(torch.ops.torchao, "da8w4_linear_prepack_cpu"):
            raise RuntimeError("the torchao wheel has no DA8W4 CPU kernel (torchao::da8w4_linear_prepack_cpu)")
        return Int8DynamicActivationInt4WeightConfig(
            group_size=group_size, layout=Int8DynamicActInt4WeightCPULayout(), act_mapping_type=MappingType.SYMMETRIC
        )
    raise RuntimeError(f"precision {precision} is not a torchao quantize_ config")


def activations_of(precision: str, options: Mapping[str, Any]) -> str:
    """The float dtype a precision's activations run in: a weight-only precision's `activations` option
    (fp32 where a config predates it, as it was measured then), bf16 for bf16, fp32 otherwise."""
    if precision in WEIGHT_ONLY:
        value = str(TorchGenerateOptions.from_json(dict(options)).activations)
        allowed = TorchGenerateOptions.choices()["activations"]
        if value not in allowed:
            raise ValueError(f"activations {value!r} is not one of {list(allowed)}")
        return value
    return "bf16" if precision == "bf16" else "fp32"


def precision_variant(precision: str, options: Mapping[str, Any]) -> str:
    """A precision as its kernels see it: a weight-only one with its activations (`woq_int4/fp32`), since
    fp32 activations take another path (torchao's CPU int4 kernel: 35x slower), so what one of them cost
    or how it lost says nothing of the other; any other precision as it is named."""
    return f"{precision}/{activations_of(precision, options)}" if precision in WEIGHT_ONLY else precision


def mix_format(precision: str, group_size: int) -> WeightFormat:
    """The rounding a torchao precision does to a weight, as the sensitivity ranking models it: int8 per
    output channel, symmetric; int4 in groups, asymmetric (weight-only) or symmetric (dynamic activations)."""
    from autotune.backends.generation.sensitivity import WeightFormat

    if precision in INT4:
        return WeightFormat(4, int(group_size), precision == "da8w4")
    return WeightFormat(8, None, True)


def apply_precision(
    model: Any, precision: str, options: Mapping[str, Any], calibration: Any = None, ranking: Sensitivity | None = None
) -> dict[str, Any]:
    """Convert the model in place to `precision` (a configuration's options: TorchGenerateOptions); returns
    what was done and how long it took. A mix (compressed_share below 1) ranks the matrices on the
    calibration text first (or takes `ranking`, measured before on these weights)."""
    import torch

    t0 = time.monotonic()
    chosen = TorchGenerateOptions.from_json(dict(options))
    activations = activations_of(precision, options)
    converted = linear_projections(model) if precision in QUANTIZED else 0
    share = float(chosen.compressed_share)
    if share != 1.0 and ranking is None:
        if calibration is None:
            raise ValueError("a mix (compressed_share below 1) needs the calibration text to rank the layers")
        from autotune.backends.generation.sensitivity import rank_layers

        ranking = rank_layers(model.eval(), calibration, precision, mix_format(precision, chosen.group_size))
    if activations == "bf16":  # a weight-only precision quantizes the bf16 model's weights
        model.to(torch.bfloat16)
    mixed: dict[str, Any] = {}
    if precision == "smoothquant_int8":
        smoothquant(model, float(chosen.alpha), calibration)
    elif precision not in ("fp32", "bf16"):
        from torchao.quantization import quantize_

        config = quantization_config(precision, chosen.group_size)
        if ranking is None or share == 1.0:
            quantize_(model, config)
        else:
            compressed = set(ranking.compressed(share))
            quantize_(model, config, filter_fn=lambda module, name: _linear(module) and name in compressed)
            kept_type = MIX_KEPT.get(precision) or activations
            if kept_type in QUANTIZED:  # int4's kept matrices and every other Linear (the output) in int8
                quantize_(
                    model,
                    quantization_config(kept_type, chosen.group_size),
                    filter_fn=lambda module, name: _linear(module) and name not in compressed,
                )
            mixed = ranking.mix_details(share, kept_type)
    details: dict[str, Any] = {"precision": precision, "activations": activations, **mixed}
    if converted:
        details["conv1d_as_linear"] = converted
    return {**details, "quantize_s": time.monotonic() - t0}


# The precision a mix keeps its sensitive matrices (and the output layer) in: int8 under int4, the
# activations' float type under int8 (weight-only: bf16 or fp32; dynamic int8: fp32).
MIX_KEPT = {"woq_int4": "woq_int8", "da8w4": "da8w8"}


def _linear(module: Any) -> bool:
    """A plain nn.Linear whose weight is not quantized yet (what torchao's own default filter takes)."""
    import torch

    return isinstance(module, torch.nn.Linear) and type(module.weight) in (torch.Tensor, torch.nn.Parameter)


def needs_calibration(config: BackendConfig) -> bool:
    """Whether building the config's weights reads text: SmoothQuant's scales, a mix's layer ranking
    (generation/sensitivity.py), llama.cpp's importance matrix, NNCF's data-aware int4; so the calibration
    text is in the artifact's key."""
    options = config.options
    return (
        config.precision == "smoothquant_int8"
        or float(options.get("compressed_share", 1.0)) != 1.0
        or bool(options.get("imatrix", False))
        or options.get("data_aware", "none") != "none"
    )


def linear_projections(model: Any) -> int:
    """Replace transformers' `Conv1D` projections (GPT-2's attention and MLP: a Linear with its weight
    stored transposed) by the equivalent `nn.Linear`, so torchao's `quantize_` and SmoothQuant, which
    look for `nn.Linear`, quantize them too; returns how many were replaced. The loader of a quantized
    artifact does the same first, so the saved state dict's modules match."""
    import torch

    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ != "Conv1D" or not hasattr(child, "nf"):
                continue
            weight = child.weight
            linear = torch.nn.Linear(weight.shape[0], weight.shape[1], bias=child.bias is not None)
            linear.to(device=weight.device, dtype=weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(weight.detach().t())
                if child.bias is not None:
                    linear.bias.copy_(child.bias.detach())
            setattr(parent, name, linear)
            replaced += 1
    return replaced


def smoothquant(model: Any, alpha: float, calibration: Any) -> None:
    """torchao's SmoothQuant: observers on every Linear, calibrated on `calibration` (token ids), then
    int8 dynamic-activation weights with the smoothing factors folded in."""
    import torch
    from torchao.quantization import quantize_

    if calibration is None:
        raise RuntimeError("SmoothQuant needs calibration text")
    quantize_(model, smoothquant_config("prepare", alpha))
    with torch.no_grad():
        model(input_ids=calibration, use_cache=False)
    quantize_(model, smoothquant_config("convert", alpha))


def smoothquant_config(step: str, alpha: float) -> Any:
    """torchao's SmoothQuantConfig in the form this torchao takes: on top of int8 dynamic activation and
    weight quantization (newer torchao names it `base_config`; older ones quantize to that themselves)."""
    import inspect

    from torchao.prototype.smoothquant import SmoothQuantConfig

    if "base_config" in inspect.signature(SmoothQuantConfig).parameters:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig

        return SmoothQuantConfig(base_config=Int8DynamicActivationInt8WeightConfig(), step=step, alpha=alpha)
    return SmoothQuantConfig(step=step, alpha=alpha)


def unavailable_precisions() -> dict[str, str]:
    """Each precision this runtime's torch/torchao cannot run on CPU, with the reason (a tiny Linear is
    quantized and called: an API that exists but has no CPU kernel is caught too)."""
    reasons: dict[str, str] = {}
    try:
        import torch
        import torchao  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return {p: f"{exc.name} is not installed" for p in PRECISIONS}
    for precision in PRECISIONS:
        if precision in ("fp32", "bf16"):
            continue
        try:
            layer = torch.nn.Sequential(torch.nn.Linear(256, 256))
            if precision == "smoothquant_int8":
                from torchao.quantization import quantize_

                quantize_(layer, smoothquant_config("prepare", 0.5))
                layer(torch.randn(4, 256))
                quantize_(layer, smoothquant_config("convert", 0.5))
            else:
                from torchao.quantization import quantize_

                if precision in WEIGHT_ONLY:  # the activations its coverage runs (the space's first)
                    layer.to(torch.bfloat16)
                quantize_(layer, quantization_config(precision, TorchGenerateOptions().group_size))
            with torch.no_grad():
                layer(torch.randn(4, 256, dtype=next(layer.parameters()).dtype))
        except Exception as exc:  # any failure means the precision cannot run here
            reasons[precision] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return reasons


def weight_bytes(model: Any) -> int:
    """Bytes the model's parameters and buffers hold, quantized tensor subclasses counted by their
    inner tensors (int4 weights count half a byte each, plus scales)."""
    import torch

    def size(tensor: Any) -> int:
        if hasattr(tensor, "__tensor_flatten__") and type(tensor) is not torch.Tensor:
            names, _ = tensor.__tensor_flatten__()
            return sum(size(getattr(tensor, name)) for name in names if getattr(tensor, name) is not None)
        return int(tensor.numel() * tensor.element_size())

    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:  # tied weights count once
            continue
        seen.add(id(tensor))
        total += size(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor)
    return total


def float_dtypes(model: Any) -> str:
    """The dtypes of the model's plain floating-point parameters and buffers (quantized tensor
    subclasses left out), comma-separated: `bfloat16` for a model cast to bf16 throughout."""
    import torch

    dtypes = {
        str(t.dtype).removeprefix("torch.")
        for t in [*(p.data for p in model.parameters()), *model.buffers()]
        if type(t) is torch.Tensor and t.is_floating_point()
    }
    return ", ".join(sorted(dtypes))


# --- what runs: the weight tensors of the layers (torchao's quantized tensor subclasses) ------------

_INT4_NAME = re.compile(r"int4", re.IGNORECASE)


def weight_counts(model: Any) -> dict[str, int]:
    """Linear, convolution and transformers' Conv1D layers by the type of their weight: torchao's
    weight-only and dynamic quantization replace it with a quantized tensor subclass that picks the
    int8 / int4 kernels when the layer runs (no oneDNN primitive to see for weight-only int8), so that
    type is what runs; a plain float weight (quantization skipped the layer) runs float."""
    import torch

    counts: Counter[str] = Counter()
    for module in model.modules():
        # transformers' Conv1D (GPT-2's projections) is a Linear with a transposed weight: a compute layer
        transposed_linear = type(module).__name__ == "Conv1D" and hasattr(module, "nf")
        if isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) or transposed_linear:
            weight = module.weight
            counts[_weight_bucket(weight.data if isinstance(weight, torch.nn.Parameter) else weight)] += 1
    return dict(counts)


def _weight_bucket(tensor: Any) -> str:
    """A plain tensor by its type; a tensor subclass by its class name or range (int4), else by the
    tensors it holds (SmoothQuant wraps an int8 tensor in one that carries its scales)."""
    import torch

    if type(tensor) is torch.Tensor:
        return bucket_of(str(tensor.dtype))
    quant_max = getattr(tensor, "quant_max", None)
    if _INT4_NAME.search(type(tensor).__name__) or (isinstance(quant_max, int) and quant_max <= 15):
        return "int4"
    names = tensor.__tensor_flatten__()[0] if hasattr(tensor, "__tensor_flatten__") else []
    inner = {_weight_bucket(getattr(tensor, name)) for name in names if getattr(tensor, name, None) is not None}
    for bucket in ("int4", "int8"):
        if bucket in inner:
            return bucket
    return "int8" if "Quantized" in type(tensor).__name__ else "other"


def weight_probe(model: Any, details: dict[str, Any] | None = None) -> Callable[[Any, str], ExecutedPrecision]:
    """A language model's probe: its layers' weight types (no call). Every compute layer of the model is
    counted, so the claim holds only where most of them hold quantized weights (not one output head); a
    mix (build details with `kept_layers`) only where they hold exactly the mix asked (judge_mix)."""
    if details and "kept_layers" in details:
        return lambda native_input, claimed: judge_mix(claimed, weight_counts(model), "layer weight types", details)
    return lambda native_input, claimed: judge(claimed, {"layer weight types": weight_counts(model)}, most=True)

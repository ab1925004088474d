"""Text generation with a causal language model: precision (torchao weight-only and dynamic int8/int4,
bf16), KV cache (transformers' dynamic or static cache) and eager or torch.compile (inductor flags), and
the greedy decoding loop that stamps every generated token.

The loop is autotune's own rather than `model.generate`: it decodes exactly `new_tokens` tokens (no
stop at an end-of-sequence token), and stamps the time each token is known, which is what time to first
token (TTFT) and time per output token (TPOT) are read from. Imports torch, torchao and transformers
inside functions only, so the registry loads in any runtime.

    python -m autotune.backends.generation     # which precisions run in this runtime, as JSON
"""

from __future__ import annotations

import json
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from autotune.backends.base import BackendSpec

PRECISIONS = ("fp32", "bf16", "woq_int8", "da8w8", "woq_int4", "da8w4", "smoothquant_int8")
INT4 = ("woq_int4", "da8w4")
# Weight-only precisions: the GEMMs take the activations in the model's float dtype. bf16 is what the
# write-ups' A16W8 / A16W4 mean; torchao's CPU int4 kernel has no fast path for fp32 activations (a
# 100M decoder's 512-token prefill took 32.7 s with fp32 activations against 0.51 s with bf16 ones on a
# Xeon with AMX, docs/BENCHMARKS.md), so fp32 is an option, not the default.
WEIGHT_ONLY = ("woq_int8", "woq_int4")
COMMON_OPTIONS: dict[str, tuple[Any, ...]] = {
    "kv_cache": ("dynamic", "static"),
    "group_size": (128, 64, 32),
    "alpha": (0.5, 0.25, 0.75),
    "activations": ("bf16", "fp32"),
}
COMMON_OPTION_PRECISIONS = {"group_size": INT4, "alpha": ("smoothquant_int8",), "activations": WEIGHT_ONLY}
# Quantized once by the prepare process, cached, and loaded by every trial with the same numerics.
QUANTIZED = ("woq_int8", "da8w8", "woq_int4", "da8w4", "smoothquant_int8")
ARTIFACT_VERSION = 1
QUANTIZED_FILE = "quantized.pt"
CALIBRATION_LENGTH = 128  # tokens per SmoothQuant calibration window (fewer when the prompt is shorter)
INDUCTOR_FLAGS = ("max_autotune", "cpp_wrapper", "concat_linear", "freezing")

EAGER = BackendSpec(
    name="eager",
    description="PyTorch eager generation (greedy, KV cache), torchao quantization",
    precisions=PRECISIONS,
    options=COMMON_OPTIONS,
    option_precisions=COMMON_OPTION_PRECISIONS,
    requires=("transformers", "torchao"),
    uses_artifact=QUANTIZED,
    torch_threads=True,
)
INDUCTOR = BackendSpec(
    name="inductor",
    description="torch.compile (inductor) of the decoder's forward, torchao quantization",
    precisions=PRECISIONS,
    options={**COMMON_OPTIONS, **{flag: (False, True) for flag in INDUCTOR_FLAGS}},
    option_precisions=COMMON_OPTION_PRECISIONS,
    requires=("transformers", "torchao"),
    uses_artifact=QUANTIZED,
    torch_threads=True,
)
SPECS = {spec.name: spec for spec in (EAGER, INDUCTOR)}


# ---- precision ------------------------------------------------------------------------------------
def quantization_config(precision: str, options: dict[str, Any]) -> Any:
    """torchao's config for a precision, in the API of the torchao this runtime has. Raises
    RuntimeError saying why when this torchao cannot run it on CPU."""
    from torchao.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
    )

    group_size = int(options.get("group_size", 128))
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


def activations_of(precision: str, options: dict[str, Any]) -> str:
    """The float dtype a precision's activations run in: a weight-only precision's `activations` option
    (fp32 where a config predates it, as it was measured then), bf16 for bf16, fp32 otherwise."""
    if precision in WEIGHT_ONLY:
        value = str(options.get("activations", "fp32"))
        if value not in COMMON_OPTIONS["activations"]:
            raise ValueError(f"activations {value!r} is not one of {list(COMMON_OPTIONS['activations'])}")
        return value
    return "bf16" if precision == "bf16" else "fp32"


def precision_variant(precision: str, options: dict[str, Any]) -> str:
    """A precision as its kernels see it: a weight-only one with its activations (`woq_int4/fp32`), since
    fp32 activations take another path (torchao's CPU int4 kernel: 35x slower), so what one of them cost
    or how it lost says nothing of the other; any other precision as it is named."""
    return f"{precision}/{activations_of(precision, options)}" if precision in WEIGHT_ONLY else precision


def apply_precision(model: Any, precision: str, options: dict[str, Any], calibration: Any = None) -> dict[str, Any]:
    """Convert the model in place to `precision`; returns what was done and how long it took."""
    import torch

    t0 = time.monotonic()
    activations = activations_of(precision, options)
    if activations == "bf16":  # a weight-only precision quantizes the bf16 model's weights
        model.to(torch.bfloat16)
    if precision == "smoothquant_int8":
        smoothquant(model, float(options.get("alpha", 0.5)), calibration)
    elif precision not in ("fp32", "bf16"):
        from torchao.quantization import quantize_

        quantize_(model, quantization_config(precision, options))
    return {"precision": precision, "activations": activations, "quantize_s": time.monotonic() - t0}


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
                quantize_(layer, quantization_config(precision, {"group_size": 128}))
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


# ---- the quantized model, prepared once ------------------------------------------------------------
def artifact_identity(config: Any) -> dict[str, Any]:
    """What the quantized weights depend on besides the model and calibration text: the precision and
    its own options (not the KV cache, the compile flags or the sequences)."""
    identity: dict[str, Any] = {"task": "generate", "precision": config.precision}
    if config.precision in WEIGHT_ONLY:
        identity["activations"] = activations_of(config.precision, dict(config.options))
    if config.precision in INT4:
        identity["group_size"] = int(config.options.get("group_size", 128))
    if config.precision == "smoothquant_int8":
        identity["alpha"] = float(config.options.get("alpha", 0.5))
    return identity


def build_artifact(model: Any, calibration: Any, config: Any, out_dir: Any) -> dict[str, Any]:
    """Quantize once and save the state dict (torchao's quantized tensors serialise with it and load
    with `weights_only=True`); returns what was done, with the quantization time and weight bytes."""
    import torch

    details = apply_precision(model.eval(), config.precision, dict(config.options), calibration)
    details["weight_bytes"] = weight_bytes(model)
    # The modules of the quantized tensor types: torch.load(weights_only=True) accepts a type only once
    # its module has been imported (torchao registers them as safe globals on import).
    details["tensor_modules"] = sorted(
        {type(p).__module__ for p in model.parameters() if type(p) not in (torch.Tensor, torch.nn.Parameter)}
        | {type(p.data).__module__ for p in model.parameters() if type(p.data) is not torch.Tensor}
    )
    torch.save(model.state_dict(), out_dir / QUANTIZED_FILE)
    return details


def cached_artifact(artifact_dir: Any) -> dict[str, Any] | None:
    """The prepared quantized model in `artifact_dir` when it is complete and was built by this
    process's torch, torchao and transformers; None otherwise (evicted, or other versions: quantize
    here instead)."""
    import json
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    directory = Path(artifact_dir)
    try:
        meta = json.loads((directory / "meta.json").read_text())  # the artifact cache's META_FILE
    except (OSError, ValueError):
        return None
    for package, built_with in (meta.get("key", {}).get("versions") or {}).items():
        try:
            here = version(package)
        except PackageNotFoundError:
            here = None
        if package in ("torch", "torchao", "transformers") and here != built_with:
            return None
    if not (directory / QUANTIZED_FILE).is_file():
        return None
    return {"dir": directory, "details": meta["details"]}


def load_quantized(model: Any, artifact_dir: Any, details: dict[str, Any]) -> float:
    """Put the prepared quantized weights in place of the model's (assigned, not copied into the float
    parameters); returns the seconds it took. Raises when they cannot be loaded here."""
    import importlib

    import torch

    t0 = time.monotonic()
    for module in details.get("tensor_modules", []):
        importlib.import_module(module)
    state = torch.load(artifact_dir / QUANTIZED_FILE, weights_only=True)
    if details.get("activations") == "bf16":  # the buffers the state dict leaves out, as quantizing left them
        model.to(torch.bfloat16)
    model.eval().requires_grad_(False)  # as quantize_ leaves them: the same model for torch.compile
    model.load_state_dict(state, assign=True)
    return time.monotonic() - t0


# ---- compile --------------------------------------------------------------------------------------
def inductor_settings(options: dict[str, Any]) -> dict[str, Any]:
    """Set the inductor flags this config asks for; returns what was set (flags this torch lacks are
    reported, not silently dropped)."""
    import torch._inductor.config as inductor_config

    wanted = {
        "max_autotune": ("max_autotune", bool(options.get("max_autotune", False))),
        "cpp_wrapper": ("cpp_wrapper", bool(options.get("cpp_wrapper", False))),
        "freezing": ("freezing", bool(options.get("freezing", False))),
        "concat_linear": ("cpp.enable_concat_linear", bool(options.get("concat_linear", False))),
    }
    applied: dict[str, Any] = {}
    for name, (path, value) in wanted.items():
        target: Any = inductor_config
        *parents, leaf = path.split(".")
        for parent in parents:
            target = getattr(target, parent)
        if not hasattr(target, leaf):
            applied[name] = "not in this torch"
            continue
        setattr(target, leaf, value)
        applied[name] = value
    if options.get("max_autotune") and hasattr(inductor_config.cpp, "use_small_dequant_buffer"):
        inductor_config.cpp.use_small_dequant_buffer = True  # what the int4 recipe pairs with max-autotune
        applied["use_small_dequant_buffer"] = True
    return applied


# ---- the decoding loop ----------------------------------------------------------------------------
@dataclass
class Generator:
    """Greedy decoding of exactly `new_tokens` tokens for a batch of prompts, stamping each token."""

    model: Any
    new_tokens: int
    kv_cache: str = "dynamic"
    token_stamps: array = field(default_factory=lambda: array("d"))
    forward: Any = None  # the (maybe compiled) forward; None: the model's own
    _static: dict[tuple[int, int], Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = self.model.forward

    def _cache(self, batch: int, length: int) -> Any:
        """A fresh dynamic cache per generation; one static cache per shape, reset between generations:
        a graph compiled with freezing keeps the first static cache's buffers, and a new cache object
        after it reads out of bounds."""
        if self.kv_cache == "static":
            from transformers import StaticCache

            cached = self._static.get((batch, length))
            if cached is None:
                cached = self._static[(batch, length)] = StaticCache(config=self.model.config, max_cache_len=length)
            else:
                cached.reset()
            return cached
        from transformers import DynamicCache

        return DynamicCache()

    def generate(self, input_ids: Any, stamp: bool = True) -> Any:
        """The new tokens (batch x new_tokens); with `stamp`, the time each token is known is appended
        to `token_stamps` (the first one ends the prefill)."""
        return self._decode(input_ids, stamp, keep_logits=0)[0]

    def generate_with_logits(self, input_ids: Any, positions: int, forced: Any = None) -> tuple[Any, Any]:
        """The new tokens and the next-token logits (float32) at the prompt's last `positions` and at every
        decode step: one generation through the same graphs a timed call runs, so drift is measured on
        what is timed (a teacher-forced pass of another shape compiles, and times nothing, other code).
        With `forced` (batch x new_tokens), each decode step is fed the forced token of the step before
        instead of its own, so every step's logits follow the same text as the reference's."""
        return self._decode(input_ids, stamp=False, keep_logits=positions, forced=forced)

    def _decode(self, input_ids: Any, stamp: bool, keep_logits: int, forced: Any = None) -> tuple[Any, Any]:
        import torch

        batch, prompt = input_ids.shape
        cache = self._cache(batch, prompt + self.new_tokens)
        out = torch.empty(batch, self.new_tokens, dtype=torch.long)
        kept = None  # one buffer, filled in place: a copy per step and a concatenation would double it
        with torch.no_grad():
            positions = torch.arange(prompt)
            logits = self.forward(
                input_ids=input_ids, past_key_values=cache, use_cache=True, cache_position=positions
            ).logits
            if keep_logits:
                kept = torch.empty(batch, keep_logits + self.new_tokens - 1, logits.shape[-1], dtype=torch.float32)
                kept[:, :keep_logits] = logits[:, -keep_logits:, :]
            token = logits[:, -1, :].argmax(dim=-1)
            out[:, 0] = token
            if stamp:
                self.token_stamps.append(time.monotonic())
            for step in range(1, self.new_tokens):
                # A forced token is copied out fresh: the shape, strides and offset of an argmax's token,
                # so a compiled forward runs the graph it times.
                fed = token if forced is None else forced[:, step - 1].clone(memory_format=torch.contiguous_format)
                position = torch.tensor([prompt + step - 1])
                logits = self.forward(
                    input_ids=fed[:, None], past_key_values=cache, use_cache=True, cache_position=position
                ).logits
                if kept is not None:
                    kept[:, keep_logits + step - 1] = logits[:, -1, :]
                token = logits[:, -1, :].argmax(dim=-1)
                out[:, step] = token
                if stamp:
                    self.token_stamps.append(time.monotonic())
        return out, kept


def prepare(
    model: Any, config: Any, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[Generator, dict[str, Any]]:
    """Convert the model to the config's precision (or put in the quantized weights the prepare step
    built: `artifact` is its folder and meta) and compile it when asked; returns the generator and what
    was done (quantization and compile settings, weight bytes)."""
    import torch

    options = dict(config.options)
    details: dict[str, Any] | None = None
    if artifact is not None:
        try:
            seconds = load_quantized(model, artifact["dir"], artifact["details"])
            details = {**artifact["details"], "quantized_by": "the prepare step (cached artifact)"}
            details["load_quantized_s"] = seconds
        except Exception as exc:  # unreadable here: quantize as the prepare step would have
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            artifact = {**artifact, "load_failed": reason}
    if details is None:
        details = apply_precision(model.eval(), config.precision, options, calibration)
        if artifact is not None:
            details["cached_artifact_not_loaded"] = artifact["load_failed"]
    details["weight_bytes"] = weight_bytes(model)
    # what the model computes in, read off the prepared model, not the config: the dtypes of its plain
    # floating-point parameters and buffers (a cast that missed the rotary embedding's shows as two)
    details["float_dtype"] = float_dtypes(model)
    generator = Generator(model, new_tokens, options.get("kv_cache", "dynamic"))
    if config.backend == "inductor":
        details["inductor"] = inductor_settings(options)
        mode = "max-autotune-no-cudagraphs" if options.get("max_autotune") else None
        generator.forward = torch.compile(model.forward, mode=mode, dynamic=None)
    return generator, details


def main() -> int:
    json.dump({"unavailable": unavailable_precisions()}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""IPEX's LLM path as a generation backend: `ipex.llm.optimize` (fused attention over IPEX's own
indirect-access KV cache, fused MLP and RMSNorm, weight-only int8/int4 through IPEX's own kernels),
traced for deployment as IPEX recommends, and run through `model.generate`, which `ipex.llm.optimize`
patches: what IPEX's own examples run.

IPEX 2.8 imports only with torch 2.8, so this backend runs in the IPEX runtime (`.venv-ipex`, which
`make setup` gives transformers 4.51.3, IPEX 2.8's own); the study routes its trials there.

Decoding is greedy, exactly `new_tokens` tokens (no end-of-sequence token). A logits processor, which
`generate` calls once per token right after the forward that produced it, stamps each token; in the drift
pass it also keeps every step's logits and feeds FP32's tokens. The drift pass takes the prompt's
compared positions but the last from one forward of the optimized modules over the prompt: IPEX's
first-token graph keeps the last position's logits only (those come from it), and that forward's last position
equalled them to the bit (a tiny Llama, fp32, bf16 and weight-only int8).
"""

from __future__ import annotations

import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.base import BackendOptions, BackendSpec, choice, import_failure
from autotune.backends.precision import bucket_of, judge

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig
    from autotune.backends.precision import ExecutedPrecision

PRECISIONS = ("bf16", "woq_int8", "woq_int4", "fp32")
WEIGHT_ONLY = ("woq_int8", "woq_int4")
# IPEX's weight-only GEMMs compute in this type (WoqLowpMode): int8 quantizes the activations on the fly
LOWP_MODES = {"int8": "INT8", "bf16": "BF16", "fp32": "NONE"}


@dataclass(frozen=True)
class IpexGenerateOptions(BackendOptions):
    lowp_mode: str = choice(*LOWP_MODES, precisions=WEIGHT_ONLY)
    group_size: int = choice(128, 64, 32, precisions=("woq_int4",))


SPEC = BackendSpec(
    name="ipex",
    description="Intel Extension for PyTorch's ipex.llm.optimize (IPEX runtime): fused kernels, weight-only int8/int4",
    precisions=PRECISIONS,
    task="generate",
    options=IpexGenerateOptions,
    requires=("intel_extension_for_pytorch", "transformers"),
    packages=("intel-extension-for-pytorch", "transformers"),
    complexity=2,
    prepare_cost=4,
    runtime_hint=(
        "IPEX 2.8 imports only with torch 2.8: its trials run in the IPEX runtime .venv-ipex, which make setup "
        "builds with IPEX's own transformers (4.51.3)"
    ),
    torch_threads=True,
)
ARTIFACT_VERSION = 1


def unavailable() -> str | None:
    """Why ipex.llm.optimize cannot run in this runtime (with the runtime it runs in), or None."""
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of the space runs; an architecture IPEX does not optimize fails at prepare."""
    return None


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    return {"task": "generate", "backend": "ipex", "precision": config.precision}


def build_artifact(model: Any, calibration: Any, config: BackendConfig, out_dir: Path) -> dict[str, Any]:
    """Nothing is built ahead: ipex.llm.optimize quantizes and traces in each trial's process (seconds)."""
    raise NotImplementedError("the ipex generation backend builds no artifact (SPEC.uses_artifact is False)")


def cached_artifact(artifact_dir: str | Path) -> dict[str, Any] | None:
    """None: nothing is built ahead (build_artifact)."""
    return None


def model_dtype(config: BackendConfig) -> str:
    """What the optimized model computes in: bf16 for bf16 and for weight-only GEMMs in bf16, else fp32."""
    lowp = IpexGenerateOptions.of(config).lowp_mode
    return (
        "bfloat16" if config.precision == "bf16" or (config.precision in WEIGHT_ONLY and lowp == "bf16") else "float32"
    )


def prepare(
    model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[IpexGenerator, dict[str, Any]]:
    """ipex.llm.optimize the model at the config's precision; refused when IPEX left it as it was (an
    architecture it does not know), so a trial never claims IPEX for transformers' own modules."""
    import intel_extension_for_pytorch as ipex
    import torch
    import transformers

    options = IpexGenerateOptions.of(config)
    if not getattr(model.config, "architectures", None):  # IPEX picks its kernels by the architecture's name
        model.config.architectures = [type(model).__name__]
    dtype = getattr(torch, model_dtype(config))
    quantization: dict[str, Any] = {}
    if config.precision in WEIGHT_ONLY:
        from intel_extension_for_pytorch.quantization import WoqLowpMode, WoqWeightDtype

        int4 = config.precision == "woq_int4"
        quantization["quantization_config"] = ipex.quantization.get_weight_only_quant_qconfig_mapping(
            weight_dtype=WoqWeightDtype.INT4 if int4 else WoqWeightDtype.INT8,
            lowp_mode=getattr(WoqLowpMode, LOWP_MODES[options.lowp_mode]),
            group_size=int(options.group_size) if int4 else -1,
        )
    t0 = time.monotonic()
    with torch.no_grad():
        optimized = ipex.llm.optimize(model.eval(), dtype=dtype, inplace=True, deployment_mode=True, **quantization)
    optimize_s = time.monotonic() - t0
    counts = linear_counts(optimized)
    if not any(type(m).__name__.startswith("_IPEXDecoderLayer") for m in optimized.modules()):
        raise RuntimeError(
            f"ipex.llm.optimize does not optimize {model.config.architectures[0]} (IPEX {ipex.__version__}): it left "
            "transformers' own layers in place"
        )
    generator = IpexGenerator(optimized, new_tokens, autocast=dtype == torch.bfloat16)
    generator.probe = lambda native_input, claimed: judge(claimed, {"IPEX linear weight types": counts}, most=True)
    details = {
        "engine": f"ipex.llm.optimize (IPEX {ipex.__version__}, transformers {transformers.__version__})",
        "optimize_s": optimize_s,
        "float_dtype": str(dtype).removeprefix("torch."),
        "weight_bytes": weight_bytes(optimized),
    }
    return generator, details


LINEAR_CLASSES = ("WeightOnlyQuantizedLinear", "_IPEXLinear")


def linear_counts(model: Any) -> dict[str, int]:
    """IPEX's linear layers by weight type: weight-only ones by their WoqWeightDtype, prepacked float ones
    by their weight's dtype (a layer IPEX left as torch's own Linear counts as its weight's dtype too)."""
    import torch

    counts: Counter[str] = Counter()
    for module in model.modules():
        name = type(module).__name__
        if name == "WeightOnlyQuantizedLinear":
            counts[bucket_of(getattr(module.dtype, "name", str(module.dtype)))] += 1
        elif name == "_IPEXLinear" or isinstance(module, torch.nn.Linear):
            counts[bucket_of(str(module.weight.dtype))] += 1
    return dict(counts)


def weight_bytes(model: Any) -> int:
    """Bytes of the linear layers' weights as IPEX holds them (packed, quantized, with their scales) and
    of the embeddings: the model's state dict keeps transformers' fp32 tensors, not what runs."""
    import torch

    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if not (type(module).__name__ in LINEAR_CLASSES or isinstance(module, (torch.nn.Linear, torch.nn.Embedding))):
            continue
        tensors = [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.numel() and tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                total += int(tensor.numel() * tensor.element_size())
    return total


@dataclass
class IpexGenerator:
    """Greedy decoding of exactly `new_tokens` tokens through the optimized model's `generate`."""

    model: Any
    new_tokens: int
    autocast: bool = False  # bf16: generate under autocast, as IPEX's examples do
    token_stamps: array = field(default_factory=lambda: array("d"))
    probe: Callable[[Any, str], ExecutedPrecision] | None = None

    def generate(self, input_ids: Any, stamp: bool = True) -> Any:
        """The new tokens (batch x new_tokens); with `stamp`, the time each one is known."""
        return self._generate(input_ids, stamp, keep=False, forced=None)[0]

    def generate_with_logits(self, input_ids: Any, positions: int, forced: Any = None) -> tuple[Any, Any]:
        """The new tokens (each step's own choice) and the float32 logits at the prompt's last `positions`
        and every decode step; with `forced`, each step is fed the forced token of the step before."""
        import torch

        with torch.no_grad(), self._amp():
            output = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
        prompt_logits = (output.logits if hasattr(output, "logits") else output[0])[:, -positions:, :]
        if prompt_logits.shape[1] != positions:  # a forward that keeps fewer positions: never broadcast them
            raise RuntimeError(
                f"the optimized forward returned {prompt_logits.shape[1]} prompt positions, not {positions}"
            )
        tokens, steps = self._generate(input_ids, stamp=False, keep=True, forced=forced)
        batch, vocab = input_ids.shape[0], prompt_logits.shape[-1]
        kept = torch.empty(batch, positions + self.new_tokens - 1, vocab, dtype=torch.float32)
        kept[:, : positions - 1] = prompt_logits[:, :-1]
        kept[:, positions - 1] = steps[0]  # the last position: the first-token graph's own, which the timed calls run
        for step in range(1, self.new_tokens):
            kept[:, positions + step - 1] = steps[step]
        return tokens, kept

    def _amp(self) -> Any:
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast)

    def _generate(self, input_ids: Any, stamp: bool, keep: bool, forced: Any) -> tuple[Any, list[Any]]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        processor = _step_processor(input_ids.shape[1], self.token_stamps if stamp else None, keep, forced)
        # a fresh configuration, not the model's own: a pretrained one's repetition penalty, suppressed tokens
        # or end-of-sequence token would change the logits and tokens that FP32's greedy loop never changes
        greedy = GenerationConfig(
            max_new_tokens=self.new_tokens, do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=0
        )
        with torch.no_grad(), self._amp():
            sequences = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=greedy,
                logits_processor=LogitsProcessorList([processor]),
            )
        if keep:  # each step's own choice (what it would have fed), not the forced tokens
            return torch.stack(processor.tokens, dim=1), processor.logits
        return sequences[:, input_ids.shape[1] :], []


def _step_processor(prompt: int, stamps: array | None, keep: bool, forced: Any) -> Any:
    """A transformers logits processor called once per generated token: stamps it, keeps its logits and
    greedy choice (drift pass), and forces the given token."""
    import torch
    from transformers import LogitsProcessor

    class StepProcessor(LogitsProcessor):
        def __init__(self) -> None:
            self.tokens: list[Any] = []
            self.logits: list[Any] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if stamps is not None:
                stamps.append(time.monotonic())
            if keep:
                self.logits.append(scores.to(torch.float32, copy=True))
                self.tokens.append(scores.argmax(dim=-1))
            if forced is not None:
                step = input_ids.shape[1] - prompt
                scores = torch.full_like(scores, -torch.inf)
                scores.scatter_(1, forced[:, step : step + 1], 0.0)
            return scores

    return StepProcessor()

"""PyTorch eager generation: the decoder's own forward, greedy with a KV cache, at a torchao precision
whose quantized weights the prepare step built once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.backends.base import BackendSpec
from autotune.backends.generation import artifacts, sensitivity
from autotune.backends.generation.decode_loop import Generator
from autotune.backends.generation.quantization import (
    MIX_KEPT,
    MIXABLE,
    PRECISIONS,
    QUANTIZED,
    TorchGenerateOptions,
    apply_precision,
    float_dtypes,
    weight_bytes,
)

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig

SPEC = BackendSpec(
    name="eager",
    description="PyTorch eager generation (greedy, KV cache), torchao quantization",
    precisions=PRECISIONS,
    task="generate",
    options=TorchGenerateOptions,
    requires=("transformers", "torchao"),
    packages=("transformers", "torchao"),
    complexity=0,
    prepare_cost=0,
    uses_artifact=QUANTIZED,
    torch_threads=True,
    kept_types=tuple(MIX_KEPT.items()),
)

# Every generation backend loads the same quantized weights: one artifact for eager and inductor.
ARTIFACT_VERSION = artifacts.ARTIFACT_VERSION
artifact_identity = artifacts.artifact_identity
build_artifact = artifacts.build_artifact
cached_artifact = artifacts.cached_artifact


def unavailable() -> str | None:
    """None: what runs here is decided per precision, in a fresh process of the runtime
    (quantization.unavailable_precisions: an API this torchao has may lack its CPU kernel)."""
    return None


def unsupported(config: BackendConfig) -> str | None:
    """A compressed_share of a precision torchao does not mix; every other combination of the space runs (a
    precision this torchao lacks is left out before: main)."""
    share = float(TorchGenerateOptions.of(config).compressed_share)
    return sensitivity.share_refusal(share, config.precision, MIXABLE)


def prepare(
    model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[Generator, dict[str, Any]]:
    """Convert the model to the config's precision (or put in the quantized weights the prepare step
    built: `artifact` is its folder and meta); returns the generator and what was done (quantization,
    weight bytes, the float dtype the prepared model computes in)."""
    details: dict[str, Any] | None = None
    if artifact is not None:
        try:
            seconds = artifacts.load_quantized(model, artifact["dir"], artifact["details"])
            details = {**artifact["details"], "quantized_by": "the prepare step (cached artifact)"}
            details["load_quantized_s"] = seconds
        except Exception as exc:  # unreadable here: quantize as the prepare step would have
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            artifact = {**artifact, "load_failed": reason}
    if details is None:
        details = apply_precision(model.eval(), config.precision, config.options, calibration)
        if artifact is not None:
            details["cached_artifact_not_loaded"] = artifact["load_failed"]
    details["weight_bytes"] = weight_bytes(model)
    # what the model computes in, read off the prepared model, not the config: the dtypes of its plain
    # floating-point parameters and buffers (a cast that missed the rotary embedding's shows as two)
    details["float_dtype"] = float_dtypes(model)
    return Generator(model, new_tokens, TorchGenerateOptions.of(config).kv_cache), details

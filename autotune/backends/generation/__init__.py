"""Text generation with a causal language model: the backends (eager.py, inductor.py: registered in
autotune/backends/__init__.py like every other), their precisions (quantization.py: torchao weight-only
and dynamic int8/int4, SmoothQuant, bf16), the quantized weights built once (artifacts.py) and the greedy
decoding loop that stamps every generated token (decode_loop.py).

The names other modules import are re-exported here; `prepare` goes to the configuration's backend.

    python -m autotune.backends.generation     # which precisions run in this runtime, as JSON
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from autotune.backends.generation.artifacts import (
    ARTIFACT_VERSION,
    QUANTIZED_FILE,
    artifact_identity,
    build_artifact,
    cached_artifact,
    load_quantized,
)
from autotune.backends.generation.decode_loop import Generator
from autotune.backends.generation.quantization import (
    CALIBRATION_LENGTH,
    COMMON_OPTION_PRECISIONS,
    COMMON_OPTIONS,
    INT4,
    PRECISIONS,
    QUANTIZED,
    WEIGHT_ONLY,
    activations_of,
    apply_precision,
    float_dtypes,
    precision_variant,
    quantization_config,
    smoothquant,
    smoothquant_config,
    unavailable_precisions,
    weight_bytes,
)

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig

__all__ = [
    "ARTIFACT_VERSION",
    "CALIBRATION_LENGTH",
    "COMMON_OPTIONS",
    "COMMON_OPTION_PRECISIONS",
    "INT4",
    "PRECISIONS",
    "QUANTIZED",
    "QUANTIZED_FILE",
    "WEIGHT_ONLY",
    "Generator",
    "activations_of",
    "apply_precision",
    "artifact_identity",
    "build_artifact",
    "cached_artifact",
    "float_dtypes",
    "load_quantized",
    "main",
    "precision_variant",
    "prepare",
    "quantization_config",
    "smoothquant",
    "smoothquant_config",
    "unavailable_precisions",
    "weight_bytes",
]


def prepare(
    model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: dict[str, Any] | None = None
) -> tuple[Generator, dict[str, Any]]:
    """The configuration's generation backend's generator (see its `prepare`) and what was done."""
    from autotune.backends import backend_module

    generator: Generator
    details: dict[str, Any]
    generator, details = backend_module(config.backend, "generate").prepare(
        model, config, new_tokens, calibration, artifact
    )
    return generator, details


def main() -> int:
    """Print which precisions this runtime's torch/torchao cannot run, with the reason."""
    json.dump({"unavailable": unavailable_precisions()}, sys.stdout)
    return 0

"""Text generation's machinery shared by its engines: the torchao precisions eager and inductor apply
(quantization.py: weight-only and dynamic int8/int4, SmoothQuant, bf16), the quantized weights built once
and loaded by both (artifacts.py, which also holds the cached-file helpers llama.cpp's and OpenVINO's
engines use), and the greedy decoding loop that stamps every generated token (decode_loop.py). The five
engines live in their own folders, beside their classification halves: eager/generate.py,
inductor/generate.py, ipex/generate.py, openvino/generate.py and llamacpp/generate.py, registered in
autotune/backends/__init__.py like every other backend.

The names other modules import are re-exported here; `prepare`, `build_artifact` and `cached_artifact`
go to the configuration's backend.

    python -m autotune.backends.generation     # which precisions and engines run in this runtime, as JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.generation.artifacts import (
    ARTIFACT_VERSION,
    QUANTIZED_FILE,
    artifact_identity,
    load_quantized,
)
from autotune.backends.generation.decode_loop import Generator
from autotune.backends.generation.quantization import (
    CALIBRATION_LENGTH,
    INT4,
    PRECISIONS,
    QUANTIZED,
    WEIGHT_ONLY,
    TorchGenerateOptions,
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
    "INT4",
    "PRECISIONS",
    "QUANTIZED",
    "QUANTIZED_FILE",
    "WEIGHT_ONLY",
    "Generator",
    "TorchGenerateOptions",
    "activations_of",
    "apply_precision",
    "artifact_identity",
    "build_artifact",
    "cached_artifact",
    "engines_unavailable",
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


def build_artifact(model: Any, calibration: Any, config: BackendConfig, out_dir: Path) -> dict[str, Any]:
    """The configuration's backend builds its artifact (quantized weights, or an engine's own file)."""
    from autotune.backends import backend_module

    details: dict[str, Any] = backend_module(config.backend, "generate").build_artifact(
        model, calibration, config, out_dir
    )
    return details


def cached_artifact(artifact_dir: str | Path, backend: str = "eager") -> dict[str, Any] | None:
    """The backend's prepared artifact in `artifact_dir` when it can be loaded here, else None."""
    from autotune.backends import backend_module

    found: dict[str, Any] | None = backend_module(backend, "generate").cached_artifact(artifact_dir)
    return found


def engines_unavailable() -> dict[str, str]:
    """Each generation backend that cannot run in this runtime (an engine not installed), with the reason."""
    from autotune.backends import backend_module, backend_specs

    reasons: dict[str, str] = {}
    for name in backend_specs("generate"):
        why = backend_module(name, "generate").unavailable()
        if why:
            reasons[name] = why
    return reasons


def main() -> int:
    """Print which precisions this runtime's torch/torchao cannot run and which engines cannot run at all,
    with the reasons."""
    json.dump({"unavailable": unavailable_precisions(), "engines": engines_unavailable()}, sys.stdout)
    return 0

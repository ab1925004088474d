"""Generation's artifact: the quantized weights, built once by the prepare process, cached, and loaded
by every trial with the same numerics (eager and inductor load the same ones)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.backends.generation import sensitivity
from autotune.backends.generation.quantization import (
    INT4,
    WEIGHT_ONLY,
    TorchGenerateOptions,
    activations_of,
    apply_precision,
    linear_projections,
    mix_format,
    weight_bytes,
)

if TYPE_CHECKING:
    from autotune.backends.base import BackendConfig

ARTIFACT_VERSION = 2  # 2: transformers' Conv1D projections quantized as nn.Linear
QUANTIZED_FILE = "quantized.pt"


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """What the quantized weights depend on besides the model and calibration text: the precision and
    its own options (not the KV cache, the compile flags or the sequences)."""
    identity: dict[str, Any] = {"task": "generate", "precision": config.precision}
    options = TorchGenerateOptions.of(config)
    if config.precision in WEIGHT_ONLY:
        identity["activations"] = activations_of(config.precision, config.options)
    if config.precision in INT4:
        identity["group_size"] = int(options.group_size)
    if config.precision == "smoothquant_int8":
        identity["alpha"] = float(options.alpha)
    if float(options.compressed_share) != 1.0:
        identity.update(compressed_share=float(options.compressed_share), sensitivity=sensitivity.METHOD_ID)
    return identity


def build_artifact(model: Any, calibration: Any, config: BackendConfig, out_dir: Path) -> dict[str, Any]:
    """Quantize once and save the state dict (torchao's quantized tensors serialise with it and load
    with `weights_only=True`); returns what was done, with the quantization time and weight bytes."""
    import torch

    options = TorchGenerateOptions.of(config)
    ranking = None
    if float(options.compressed_share) != 1.0 and calibration is not None:  # measured once for every share
        fmt = mix_format(config.precision, int(options.group_size))
        linear_projections(model)  # GPT-2's Conv1D ranked as the Linear it becomes
        ranking = sensitivity.cached_ranking(model.eval(), calibration, config.precision, out_dir, fmt)
    details = apply_precision(model.eval(), config.precision, config.options, calibration, ranking)
    details["weight_bytes"] = weight_bytes(model)
    # The modules of the quantized tensor types: torch.load(weights_only=True) accepts a type only once
    # its module has been imported (torchao registers them as safe globals on import).
    details["tensor_modules"] = sorted(
        {type(p).__module__ for p in model.parameters() if type(p) not in (torch.Tensor, torch.nn.Parameter)}
        | {type(p.data).__module__ for p in model.parameters() if type(p.data) is not torch.Tensor}
    )
    torch.save(model.state_dict(), out_dir / QUANTIZED_FILE)
    return details


def cached_artifact(artifact_dir: str | Path) -> dict[str, Any] | None:
    """The prepared quantized model in `artifact_dir` when it is complete and was built by this
    process's torch, torchao and transformers; None otherwise (evicted, or other versions: quantize
    here instead)."""
    import json
    from importlib.metadata import PackageNotFoundError, version

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


def engine_file(artifact_dir: str | Path, file_name: str) -> dict[str, Any] | None:
    """An engine's own file (a GGUF, an IR) in `artifact_dir` with its build details once the cache marked
    it complete; None when it was never built or was evicted."""
    import json

    directory = Path(artifact_dir)
    try:
        meta = json.loads((directory / "meta.json").read_text())  # the artifact cache's META_FILE
    except (OSError, ValueError):
        return None
    if not (directory / file_name).is_file():
        return None
    return {"dir": directory, "details": meta["details"]}


@contextlib.contextmanager
def engine_files(
    artifact: dict[str, Any] | None, build: Callable[[Path], dict[str, Any]], prefix: str
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The folder of an engine's files (a GGUF, an IR) and their build details: the cached artifact's, or,
    when it was evicted since the prepare step, built by `build` into a scratch folder that goes when the
    block ends (the engine has loaded or compiled the files by then, or failed to)."""
    import shutil
    import tempfile

    if artifact is not None:
        yield Path(artifact["dir"]), {**artifact["details"], "converted_by": "the prepare step (cached artifact)"}
        return
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        details = build(scratch)
        details["converted_by"] = "the trial (no cached artifact)"
        yield scratch, details
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_quantized(model: Any, artifact_dir: Path, details: dict[str, Any]) -> float:
    """Put the prepared quantized weights in place of the model's (assigned, not copied into the float
    parameters); returns the seconds it took. Raises when they cannot be loaded here."""
    import importlib

    import torch

    t0 = time.monotonic()
    for module in details.get("tensor_modules", []):
        importlib.import_module(module)
    state = torch.load(artifact_dir / QUANTIZED_FILE, weights_only=True)
    linear_projections(model)  # as quantizing left them: the saved weights are nn.Linear's
    if details.get("activations") == "bf16":  # the buffers the state dict leaves out, as quantizing left them
        model.to(torch.bfloat16)
    model.eval().requires_grad_(False)  # as quantize_ leaves them: the same model for torch.compile
    model.load_state_dict(state, assign=True)
    return time.monotonic() - t0

"""The artifact cache: exported, converted and quantized models, built once and shared across studies.

An artifact is keyed by everything that changes its bytes: the model and a digest of its weights, the
input shape, the backend, what the backend says changes the artifact (precision, some options), the
calibration data, and the library versions. It lives under <studies>/.cache/artifacts/<name>-<key>/ and
is complete once its meta.json exists (written last, atomically). A lock file serialises builders.
Each use touches its `last-used` file; past the cache's size cap the least recently used are evicted.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autotune.backends import backend_module, backend_packages
from autotune.common.files import json_digest, read_json
from autotune.common.json_record import JsonObject
from autotune.machine.fingerprint import package_versions
from autotune.model.generation import GenerationWorkload
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.records.reference import CalibrationSet

META_FILE = "meta.json"
LAST_USED = "last-used"
# Every artifact's packages; the backends' own are in their SPECs (packages).
CORE_PACKAGES = ("torch", "torchvision")


def artifact_packages(task: str = "classify") -> tuple[str, ...]:
    """The packages whose versions an artifact is keyed on: the core ones and the classification backends'
    (export, conversion, quantization); a language model's also the generation backends' (transformers'
    layers, llama.cpp's converter and quantizer, ...)."""
    tasks = ("classify", "generate") if task == "generate" else ("classify",)
    return tuple(dict.fromkeys((*CORE_PACKAGES, *(p for t in tasks for p in backend_packages(t)))))


def artifact_key(
    model: ModelSource,
    config: TrialConfig,
    calibration: CalibrationSet,
    runtime_packages: dict[str, str] | None = None,
    generation: GenerationWorkload | None = None,
) -> JsonObject:
    """Everything the artifact's bytes depend on (and nothing else: not threads, not the allocator).
    `runtime_packages`: the versions in the runtime that builds it (default: this process's);
    `generation`: a language model's workload (its quantized weights come from the generation backends)."""
    if generation is not None:
        return _generation_key(model, config, generation, runtime_packages)
    return {
        "model": {
            "kind": model.kind,
            "name": model.name,
            "input_shape": list(model.input_shape),
            "weights_sha256": model.weights_sha256,
            **({"inputs": [spec.to_json() for spec in model.inputs]} if model.inputs else {}),
        },
        "backend": config.backend,
        "builder_version": backend_module(config.backend).ARTIFACT_VERSION,
        "identity": backend_module(config.backend).artifact_identity(config),
        # the data's digest, not its path; synthetic calibration keeps its old key so caches stay valid
        "calibration": (
            {"data": calibration.data, "samples": calibration.samples}
            if calibration.digest is None
            else {"digest": calibration.digest, "samples": calibration.samples, "after_eval": calibration.after_eval}
        ),
        "versions": _versions(artifact_packages(), runtime_packages),
    }


def _generation_key(
    model: ModelSource, config: TrialConfig, generation: GenerationWorkload, runtime_packages: dict[str, str] | None
) -> JsonObject:
    """A language model's quantized weights: the model and its weights, the precision and its options,
    and for SmoothQuant and a mix the calibration text (the data's digest and the window length it is cut
    into)."""
    from autotune.backends import generation as backend
    from autotune.backends.generation import artifacts
    from autotune.backends.generation.quantization import needs_calibration
    from autotune.common.files import file_digest

    module = backend_module(config.backend, "generate")
    identity = module.artifact_identity(config)
    calibration: dict[str, str | int] = {}
    if needs_calibration(config):
        data = generation.data
        calibration = {
            "data": file_digest(data) if data else "seeded token ids",
            "length": min(backend.CALIBRATION_LENGTH, generation.prompt_tokens),
        }
        if data and generation.tokenizer:  # a text read by the model's tokenizer, not as bytes
            calibration["tokenized"] = "the model's tokenizer"
    return {
        "model": {"kind": model.kind, "name": model.name, "weights_sha256": model.weights_sha256},
        # eager and inductor load the same quantized weights; an engine (llama.cpp) its own file
        "backend": "generation" if module.build_artifact is artifacts.build_artifact else config.backend,
        "builder_version": module.ARTIFACT_VERSION,
        "identity": identity,
        "calibration": calibration,
        "versions": _versions(artifact_packages("generate"), runtime_packages),
    }


def _versions(packages: tuple[str, ...], runtime_packages: dict[str, str] | None) -> dict[str, str]:
    """The versions of `packages` in the runtime that builds the artifact (default: this process's)."""
    if runtime_packages is None:
        return package_versions(packages)
    return {k: v for k, v in runtime_packages.items() if k in packages}


def artifact_dir(cache_root: Path, key: dict[str, Any]) -> Path:
    digest = json_digest(key)[:20]
    label = "-".join([key["backend"], *(str(v) for v in key["identity"].values())]).replace("/", "_")
    return cache_root / "artifacts" / f"{label}-{digest}"


def read_meta(directory: Path) -> dict[str, Any] | None:
    """The artifact's metadata when it is complete and readable; None means build it (again)."""
    try:
        meta = read_json(directory / META_FILE)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "prepare_s" in meta else None


def lock_file(directory: Path) -> Path:
    """The artifact's lock beside it: its whole name and .lock (a name with a dot in it, e.g. a ratio of
    1.0, is not cut at that dot, which would give two artifacts one lock)."""
    return directory.parent / f"{directory.name}.lock"


@contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Exclusive lock for building one artifact (other workers of a study wait, then reuse it)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file(directory), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def mark_used(directory: Path) -> None:
    """Record a use: its mtime orders the cache for eviction."""
    (directory / LAST_USED).touch()


def _size_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file() and not f.is_symlink())


def evict_least_recently_used(cache_root: Path, cap_mib: float, keep: Path) -> list[str]:
    """Delete complete artifacts, least recently used first, until the cache fits `cap_mib`; never `keep`
    (the one in use) nor one whose lock another process holds (being built or checked). Returns the names."""
    root = cache_root / "artifacts"
    entries = []
    for directory in root.iterdir() if root.is_dir() else ():
        if directory.is_dir() and (directory / META_FILE).exists():
            stamp = directory / LAST_USED if (directory / LAST_USED).exists() else directory / META_FILE
            entries.append((stamp.stat().st_mtime, directory, _size_bytes(directory)))
    total = sum(size for _, _, size in entries)
    evicted: list[str] = []
    for _, directory, size in sorted(entries, key=lambda e: e[0]):
        if total <= cap_mib * 2**20:
            break
        if directory.resolve() == keep.resolve():
            continue
        with open(lock_file(directory), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            try:
                (directory / META_FILE).unlink()  # incomplete from here on: never read half-deleted
                shutil.rmtree(directory, ignore_errors=True)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        total -= size
        evicted.append(directory.name)
    return evicted

"""The artifact cache: exported, converted and quantized models, built once and shared across studies.

An artifact is keyed by everything that changes its bytes: the model and a digest of its weights, the
input shape, the backend, what the backend says changes the artifact (precision, some options), the
calibration data, and the library versions. It lives under <studies>/.cache/artifacts/<name>-<key>/ and
is complete once its meta.json exists (written last, atomically). A lock file serialises builders.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from autotune.backends import backend_module
from autotune.config import TrialConfig
from autotune.files import read_json
from autotune.fingerprint import package_versions
from autotune.models import ModelSource

META_FILE = "meta.json"
VERSIONED_PACKAGES = ("torch", "torchvision", "onnx", "onnxscript", "onnxruntime", "openvino", "nncf", "torchao")


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of a weights file, memoised on (path, size, mtime) next to the cache."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def artifact_key(model: ModelSource, weights_digest: str | None, config: TrialConfig, calibration_samples: int) -> dict[str, Any]:
    """Everything the artifact's bytes depend on (and nothing else: not threads, not the allocator)."""
    return {
        "model": {"kind": model.kind, "name": model.name, "input_shape": list(model.input_shape), "weights_sha256": weights_digest},
        "backend": config.backend,
        "builder_version": backend_module(config.backend).ARTIFACT_VERSION,
        "identity": backend_module(config.backend).artifact_identity(config),
        "calibration": {"data": "synthetic", "samples": calibration_samples},
        "versions": package_versions(VERSIONED_PACKAGES),
    }


def artifact_dir(cache_root: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    label = "-".join([key["backend"], *(str(v) for v in key["identity"].values())]).replace("/", "_")
    return cache_root / "artifacts" / f"{label}-{digest}"


def is_ready(directory: Path) -> bool:
    return (directory / META_FILE).is_file()


def read_meta(directory: Path) -> dict[str, Any]:
    return read_json(directory / META_FILE)


@contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Exclusive lock for building one artifact (other workers of a study wait, then reuse it)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

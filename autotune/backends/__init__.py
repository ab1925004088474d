"""Backend registry. Adding a backend: one module here with SPEC and prepare(), plus its YAML entry."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from autotune.backends import eager, inductor, onnxruntime, openvino, torchao
from autotune.backends.base import BackendSpec

_MODULES: dict[str, ModuleType] = {m.SPEC.name: m for m in (eager, inductor, onnxruntime, openvino, torchao)}
BACKENDS: dict[str, BackendSpec] = {name: module.SPEC for name, module in _MODULES.items()}


def backend_module(name: str) -> ModuleType:
    """The module with `prepare()` for a backend name."""
    try:
        return _MODULES[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


def is_available(name: str) -> bool:
    """True when everything the backend imports is installed in this runtime."""
    return all(importlib.util.find_spec(mod) is not None for mod in BACKENDS[name].requires)

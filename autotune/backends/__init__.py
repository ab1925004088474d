"""Backend registry. Adding a backend: one module here with SPEC and prepare(), plus its YAML entry;
optionally `unsupported(config) -> reason | None` for combinations that cannot run (refused before launch).

May import common only: a backend is called by the worker and knows nothing above it; heavy
libraries (onnxruntime, openvino, torchao, IPEX) are imported inside functions, so the registry
loads in any runtime."""

from __future__ import annotations

from types import ModuleType

from autotune.backends import eager, generation, inductor, ipex, onnxruntime, openvino, torchao
from autotune.backends.base import BackendSpec

_MODULES: dict[str, ModuleType] = {m.SPEC.name: m for m in (eager, inductor, ipex, onnxruntime, openvino, torchao)}
BACKENDS: dict[str, BackendSpec] = {name: module.SPEC for name, module in _MODULES.items()}


def backend_module(name: str) -> ModuleType:
    """The module with `prepare()` for a backend name."""
    try:
        return _MODULES[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


def backend_specs(task: str) -> dict[str, BackendSpec]:
    """The backends of a task: one forward pass ("classify", the default) or text generation."""
    return generation.SPECS if task == "generate" else BACKENDS

"""Backend registry: one for every task. Each engine lives in its own folder (classify.py and/or
generate.py beside its helpers) and is one object that satisfies the interface in backends/base.py: its
SPEC (every fact autotune knows of it), `unsupported`, `unavailable`, and `prepare` / `build_artifact` /
`load` / `cached_artifact` as its kind needs, registered below.

May import common only: a backend is called by the worker and knows nothing above it; heavy
libraries (onnxruntime, openvino, torchao, IPEX, transformers) are imported inside functions, so the
registry loads in any runtime."""

from __future__ import annotations

from types import ModuleType
from typing import cast

from autotune.backends.base import (
    LAST,
    Backend,
    BackendSpec,
    ClassifyArtifactBackend,
    GenerateBackend,
    ModuleBackend,
    missing_members,
)
from autotune.backends.eager import classify as eager
from autotune.backends.eager import generate as generation_eager
from autotune.backends.inductor import classify as inductor
from autotune.backends.inductor import generate as generation_inductor
from autotune.backends.ipex import classify as ipex
from autotune.backends.ipex import generate as generation_ipex
from autotune.backends.llamacpp import generate as llamacpp
from autotune.backends.onnxruntime import classify as onnxruntime
from autotune.backends.openvino import classify as openvino
from autotune.backends.openvino import generate as generation_openvino
from autotune.backends.torchao import classify as torchao

TASKS = ("classify", "generate")
_MODULES: dict[str, dict[str, Backend]] = {task: {} for task in TASKS}
_SPECS: dict[str, dict[str, BackendSpec]] = {task: {} for task in TASKS}


def register(module: Backend) -> None:
    """Make a backend module known under its SPEC's name, for its SPEC's task. Raises TypeError when it
    lacks a member of its interface, ValueError when its task is unknown or its name already taken."""
    missing = missing_members(module)
    if missing:
        name = getattr(module, "__name__", module)
        raise TypeError(f"backend module {name} lacks {', '.join(missing)} (its interface: autotune/backends/base.py)")
    spec = module.SPEC
    if spec.task not in _MODULES:
        raise ValueError(f"backend {spec.name}: unknown task {spec.task!r}; known: {', '.join(TASKS)}")
    if spec.name in _MODULES[spec.task]:
        raise ValueError(f"a {spec.task} backend named {spec.name!r} is registered already")
    _MODULES[spec.task][spec.name] = module
    _SPECS[spec.task][spec.name] = spec


# Grouped by the interface each satisfies, which mypy checks (base.py); ipex does both, int8 from a file.
MODULE_BACKENDS: tuple[ModuleBackend, ...] = (eager, inductor, ipex)
ARTIFACT_BACKENDS: tuple[ClassifyArtifactBackend, ...] = (ipex, onnxruntime, openvino, torchao)
GENERATE_BACKENDS: tuple[GenerateBackend, ...] = (
    generation_eager,
    generation_inductor,
    llamacpp,
    generation_openvino,
    generation_ipex,
)
for _backend in dict.fromkeys((*MODULE_BACKENDS, *ARTIFACT_BACKENDS, *GENERATE_BACKENDS)):
    register(_backend)

BACKENDS: dict[str, BackendSpec] = _SPECS["classify"]


def backend_module(name: str, task: str = "classify") -> ModuleType:
    """The module of a task's backend (`prepare`, `build_artifact`, `load`, `unsupported`: base.py)."""
    try:
        return cast(ModuleType, _MODULES[task][name])
    except KeyError:
        raise KeyError(f"unknown {task} backend {name!r}; known: {', '.join(_MODULES.get(task, {}))}") from None


def backend_specs(task: str) -> dict[str, BackendSpec]:
    """The backends of a task: one forward pass ("classify", the default) or text generation."""
    return _SPECS["generate"] if task == "generate" else _SPECS["classify"]


def backend_packages(task: str | None = None) -> tuple[str, ...]:
    """The distributions whose versions the backends of a task (every task: None) say matter, each once,
    in the order they were registered."""
    tasks = TASKS if task is None else (task,)
    return tuple(dict.fromkeys(p for t in tasks for spec in backend_specs(t).values() for p in spec.packages))


def complexity_rank(name: str) -> int:
    """A backend's rank when configurations tie (the simpler, lower, wins), by its name in either task
    (a stored configuration names its backend only); one no longer registered ranks last."""
    for task in TASKS:
        if name in _SPECS[task]:
            return _SPECS[task][name].complexity
    return LAST

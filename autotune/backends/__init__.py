"""Backend registry: one for every task. Each engine lives in its own folder (classify.py and/or
generate.py beside its helpers) and is one object that satisfies the interface in backends/base.py: its
SPEC (every fact autotune knows of it), `unsupported`, `unavailable`, and `prepare` / `build_artifact` /
`load` / `cached_artifact` as its kind needs. The built-in ones are registered below; a package outside
autotune adds its own through the `autotune.backends` entry-point group (ENTRY_POINT_GROUP), each entry
point naming a module or object with those members, registered for its SPEC's task. A plugin that does
not load, lacks a member, or takes a name already registered is left out, and why is kept in one line
(`plugin_problems`): `autotune probe` and the search space's unknown-backend error say it.

May import common only: a backend is called by the worker and knows nothing above it; heavy
libraries (onnxruntime, openvino, torchao, IPEX, transformers) are imported inside functions, so the
registry loads in any runtime (a plugin should do the same: it is imported wherever the registry is)."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, cast

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
ENTRY_POINT_GROUP = "autotune.backends"
_MODULES: dict[str, dict[str, Backend]] = {task: {} for task in TASKS}
_SPECS: dict[str, dict[str, BackendSpec]] = {task: {} for task in TASKS}
# entry point -> why its backend was not registered (one line)
_PLUGIN_PROBLEMS: dict[str, str] = {}
# entry point -> (task, backend name) of the plugins registered
_PLUGINS: dict[str, tuple[str, str]] = {}


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


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines[0] else type(exc).__name__


def load_plugins() -> None:
    """Register every backend of the `autotune.backends` entry-point group that is not registered yet;
    keep why for each one that cannot be (it does not import, lacks a member, or takes a taken name).
    In the entry points' name order, whatever order the path lists the distributions in."""
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name):
        if point.name in _PLUGINS or point.name in _PLUGIN_PROBLEMS:
            continue
        try:
            plugin: Any = point.load()
        except (Exception, SystemExit) as exc:  # a plugin's import may raise anything, even exit
            _PLUGIN_PROBLEMS[point.name] = f"{point.value} does not load ({_first_line(exc)})"
            continue
        try:
            register(plugin)
        except (TypeError, ValueError) as exc:
            _PLUGIN_PROBLEMS[point.name] = f"{point.value} is refused: {exc}"
            continue
        _PLUGINS[point.name] = (plugin.SPEC.task, plugin.SPEC.name)


def plugin_problems() -> dict[str, str]:
    """Each `autotune.backends` entry point whose backend is not registered, and why (one line)."""
    return dict(_PLUGIN_PROBLEMS)


def plugins() -> dict[str, tuple[str, str]]:
    """Each `autotune.backends` entry point registered, with its backend's task and name."""
    return dict(_PLUGINS)


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


# The backends that run torchao's quantized precisions for a language model: torchao is an engine of its own there.
TORCHAO_HOSTS = ("eager", "inductor")
TORCHAO_PRECISIONS = ("woq_int8", "da8w8", "woq_int4", "da8w4", "smoothquant_int8")


def engine_of(backend: str, precision: str, task: str) -> str:
    """The engine a family runs on, as a user picks one: the backend, but torchao for a language model's
    quantized precisions in eager or inductor (torchao's kernels, whichever runs the rest of the model)."""
    if task == "generate" and backend in TORCHAO_HOSTS and precision in TORCHAO_PRECISIONS:
        return "torchao"
    return backend


def complexity_rank(name: str) -> int:
    """A backend's rank when configurations tie (the simpler, lower, wins), by its name in either task
    (a stored configuration names its backend only); one no longer registered ranks last."""
    for task in TASKS:
        if name in _SPECS[task]:
            return _SPECS[task][name].complexity
    return LAST


load_plugins()

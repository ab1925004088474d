"""The search space: a YAML file plus what the machine probe found, turned into Optuna suggestions.

Common dimensions are sampled for every trial; a backend's own dimensions (precision, memory format,
its options) are sampled only when that backend is chosen, under names prefixed by the backend, so the
sampler never sees options of other backends. Impossible combinations are never produced.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.backends import BACKENDS, backend_module, backend_specs, plugin_problems
from autotune.backends.base import BackendSpec
from autotune.common.errors import UserError
from autotune.machine.probe import MachineProbe
from autotune.machine.runtimes import Runtime, candidates, why_not
from autotune.records.attributes import Attr
from autotune.records.config import TrialConfig

TOP_LEVEL_KEYS = (
    "batch_size",
    "sequences",
    "allocator",
    "instances",
    "threads_per_instance",
    "openmp",
    "kmp_affinity",
    "kmp_blocktime",
    "thp",
    "backends",
    "baseline",
    "max_wait_ms",
)
ALLOCATORS = ("glibc", "tcmalloc", "jemalloc")
OPENMP = ("gnu", "intel")
# PyTorch's Xeon launcher's Intel OpenMP settings: threads bound to cores in order, short spin-wait.
DEFAULT_KMP_AFFINITY = "granularity=fine,compact,1,0"
DEFAULT_KMP_BLOCKTIME = 1
BASELINE_KEYS = ("batch_size", "sequences")
# The server scenario's dynamic batching: how long the oldest queued request may wait for a fuller batch.
MAX_WAITS_MS = (0, 1, 2, 5, 10, 20)


def load_space_file(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"search space file {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise UserError(f"search space file {str(path)!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"search space file {str(path)!r} must be a mapping of dimensions")
    return data


def _choices(name: str, value: Any, kind: type) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, kind) and not (kind is int and isinstance(v, bool)) for v in values):
        raise UserError(f"search space: {name} must be a list of {kind.__name__} values, got {value!r}")
    return list(dict.fromkeys(values))


def _auto_instances(cores: int) -> list[int]:
    counts, n = [], 1
    while n <= cores:
        counts.append(n)
        n *= 2
    return counts + ([cores] if counts[-1] != cores else [])


def most_threads(instances: int, threads: list[int] | None, cores: int) -> int | None:
    """The most threads per instance that fit `instances` instances side by side on `cores` physical cores
    (`threads` None: any count; a list: its values only), or None when none fits."""
    limit = cores // instances
    fitting = [t for t in (threads or [limit]) if 1 <= t <= limit]
    return max(fitting) if fitting else None


class InfeasibleConfig(Exception):
    """A sampled combination the machine cannot run (explicit thread lists only): never launched."""


@dataclass(frozen=True)
class ThreadPoolDims:
    """PyTorch's thread pool and allocations, sampled for torch backends only: OpenMP runtime (with
    Intel OpenMP's affinity and block time) and transparent huge pages for PyTorch's allocations."""

    openmp: list[str]
    kmp_affinity: list[str]
    kmp_blocktime: list[int]
    thp: list[bool]

    @classmethod
    def parse(
        cls, data: dict[str, Any], machine: MachineProbe, runtimes: dict[str, Runtime], notes: list[str]
    ) -> ThreadPoolDims:
        openmp = _choices("openmp", data.get("openmp", ["gnu"]), str)
        for name in openmp:
            if name not in OPENMP:
                raise UserError(f"search space: unknown openmp {name!r}; choose from {', '.join(OPENMP)}")
        if "intel" in openmp and not any("intel" in r.openmp for r in runtimes.values()):
            notes.append(
                "Intel OpenMP (libiomp5.so from the intel-openmp wheel) is in no runtime: openmp intel left out"
            )
            openmp = [o for o in openmp if o != "intel"] or ["gnu"]
        affinity = _choices("kmp_affinity", data.get("kmp_affinity", [DEFAULT_KMP_AFFINITY]), str)
        blocktime = _choices("kmp_blocktime", data.get("kmp_blocktime", [DEFAULT_KMP_BLOCKTIME]), int)
        if any(b < 0 for b in blocktime):
            raise UserError("search space: kmp_blocktime values are milliseconds, 0 or more")
        thp = _choices("thp", data.get("thp", [False]), bool)
        if True in thp and machine.thp != "madvise":
            notes.append(
                f"transparent huge pages are '{machine.thp}' here, so THP_MEM_ALLOC_ENABLE has no effect: thp left out"
            )
            thp = [False]
        return cls(openmp, affinity, blocktime, thp)


def _batch_sizes(data: dict[str, Any], task: str, batch_key: str) -> list[int]:
    """The batch sizes, or for generation the concurrent sequences (`sequences`, or `batch_size` as before)."""
    if task != "generate" and "sequences" in data:
        raise UserError("search space: 'sequences' is for generation (--task generate); use batch_size")
    batch_sizes = _choices(batch_key, data.get(batch_key, data.get("batch_size", [1, 8, 32])), int)
    if any(b <= 0 for b in batch_sizes):
        raise UserError(f"search space: {batch_key} values must be positive")
    return batch_sizes


def _max_waits(data: dict[str, Any]) -> list[float]:
    """The server scenario's max_wait_ms values, checked in every scenario so a typo is never silent."""
    raw_waits = data.get("max_wait_ms", list(MAX_WAITS_MS))
    raw_waits = raw_waits if isinstance(raw_waits, list) else [raw_waits]
    if not raw_waits or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in raw_waits):
        raise UserError(f"search space: max_wait_ms must be a list of milliseconds, got {raw_waits!r}")
    max_waits = list(dict.fromkeys(float(w) for w in raw_waits))
    if any(w < 0 for w in max_waits):
        raise UserError(
            f"search space: max_wait_ms values are milliseconds a request may wait for a fuller batch, 0 or more; "
            f"got {max_waits}"
        )
    return max_waits


def _allocators(data: dict[str, Any], machine: MachineProbe, notes: list[str]) -> list[str]:
    """The allocators asked for that this machine has (glibc's always); those missing are noted."""
    allocators = _choices("allocator", data.get("allocator", list(ALLOCATORS)), str)
    for name in allocators:
        if name not in ALLOCATORS:
            raise UserError(f"search space: unknown allocator {name!r}; choose from {', '.join(ALLOCATORS)}")
    missing = [a for a in allocators if a != "glibc" and a not in machine.allocators]
    if missing:
        notes.append(f"allocator(s) {', '.join(missing)} not found on this machine: left out")
    return [a for a in allocators if a == "glibc" or a in machine.allocators]


def _instances_and_threads(data: dict[str, Any], cores: int) -> tuple[list[int], list[int] | None]:
    """Instances and threads per instance ('auto': chosen from the cores; threads None: any that fit),
    refused when a value exceeds the physical cores or no combination fits them."""
    instances = (
        _auto_instances(cores)
        if data.get("instances", "auto") == "auto"
        else _choices("instances", data["instances"], int)
    )
    threads_raw = data.get("threads_per_instance", "auto")
    threads = None if threads_raw == "auto" else _choices("threads_per_instance", threads_raw, int)
    for label, values in (("instances", instances), ("threads_per_instance", threads or [1])):
        if any(v < 1 or v > cores for v in values):
            raise UserError(
                f"search space: {label} values {values} must lie between 1 and the {cores} physical cores here"
            )
    if threads and not any(i * t <= cores for i in instances for t in threads):
        raise UserError(
            f"search space: no instances x threads_per_instance combination fits the {cores} physical cores here"
        )
    return instances, threads


def _instances_splitting(instances: list[int], totals: list[int], notes: list[str]) -> list[int]:
    """Generation: the instance counts that split at least one of the space's total sequences evenly (every
    instance of a trial runs the same share, so the trial runs the user's total and no more); the others are
    left out with a note, and a space where none splits any total is refused."""
    kept = [count for count in instances if any(total % count == 0 for total in totals)]
    if not kept:
        raise UserError(
            f"search space: no instance count {instances} splits any of the total sequences {totals} evenly; "
            "list 1 among the instances or a total they divide"
        )
    dropped = [count for count in instances if count not in kept]
    if dropped:
        notes.append(f"instances {dropped} split none of the total sequences {totals} evenly: left out")
    return kept


def _check_explicit_runtimes_run_a_backend(
    data: dict[str, Any], runtimes: dict[str, Runtime], routes: dict[str, list[str]]
) -> None:
    """A runtime named with --runtime that runs none of the space's backends is refused with the reasons,
    rather than silently never used."""
    for runtime in runtimes.values():
        if runtime.role == "explicit" and not any(runtime.name in names for names in routes.values()):
            reasons = (
                "; ".join(why for name, why in runtime.backends.items() if why and name in (data.get("backends") or {}))
                or "-"
            )
            raise UserError(
                f"runtime {runtime.name} ({runtime.python}, torch {runtime.torch or 'missing'}) runs none of the "
                f"space's backends ({reasons}): install them there, or drop --runtime"
            )


def _baseline_batch_size(data: dict[str, Any], task: str, batch_key: str, batch_sizes: list[int], server: bool) -> int:
    """The baseline's batch (or sequences): the `baseline` mapping's, else 8 (1 for generation) where listed,
    else the first listed; a server's smallest, since a first server answers one request per call."""
    baseline = data.get("baseline", {}) or {}
    if not isinstance(baseline, dict):
        raise UserError("search space: 'baseline' must be a mapping, e.g. {batch_size: 8}")
    unknown = sorted(set(baseline) - set(BASELINE_KEYS))
    if unknown:
        raise UserError(f"search space: unknown baseline key {unknown[0]!r}; allowed: {', '.join(BASELINE_KEYS)}")
    usual = 1 if task == "generate" else 8
    baseline_bs = baseline.get(batch_key, usual if usual in batch_sizes else batch_sizes[0])
    if server:  # a first server answers one request per call: the smallest batch, whatever `baseline` says
        baseline_bs = min(batch_sizes)
    if baseline_bs not in batch_sizes:
        raise UserError(f"search space: baseline {batch_key} {baseline_bs!r} must be one of {batch_key} {batch_sizes}")
    return baseline_bs


def _plugins_said() -> str:
    """The backend plugins that did not load, as the tail of an unknown-backend error (empty: none)."""
    problems = plugin_problems()
    said = "; ".join(f"{point}: {why}" for point, why in problems.items())
    return f" (backend plugins left out: {said})" if said else ""


def _offered(value: Any, supported: Sequence[Any]) -> bool:
    """A YAML value among an option's values: equal, and a bool only for a bool (True is not 1)."""
    return any(value == s and isinstance(value, bool) == isinstance(s, bool) for s in supported)


# Options a sampler never draws: a trial takes the largest listed value unless its guide enqueued it with
# another (the user attribute named here): drift grows with the share of compressed weights, so the mix
# search bisects for the largest share within the bound (tuning/mix_search.py) instead of sampling it.
GUIDED = {"compressed_share": Attr.MIX_SHARE}


# Options added after studies were stored: at their default they are left out of a configuration, so its
# numerics (drift reuse, known fallbacks) match the same configuration stored before they existed.
LEFT_OUT_AT_DEFAULT = ("compressed_share", "imatrix", "data_aware")


def guided_attrs(params: Mapping[str, Any]) -> dict[str, Any]:
    """The user attributes that let an enqueued copy of `params` run its guided values (a layout variant, a
    retry, a prior of a mix trial): without them it would run the largest listed share instead."""
    return {attr: value for name, value in params.items() for key, attr in GUIDED.items() if name.endswith(f".{key}")}


def _backend_dims(name: str, spec: BackendSpec, options: Any) -> dict[str, list[Any]]:
    """A backend's precisions and option values the YAML lists, checked against its options record
    (backends/base.py: each option's values), each missing one at its default (the first value)."""
    options = options or {}
    if not isinstance(options, dict):
        raise UserError(f"search space: backends.{name} must be a mapping of options")
    choices = spec.choices
    dims: dict[str, list[Any]] = {}
    for key, value in options.items():
        supported = spec.precisions if key == "precision" else choices.get(key)
        if supported is None:
            allowed = ", ".join(("precision", *choices))
            raise UserError(f"search space: backend {name!r} has no option {key!r}; it has {allowed}")
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if not _offered(v, supported)]
        if bad or not values:
            raise UserError(
                f"search space: backends.{name}.{key} value {bad[0] if bad else value!r} is not supported; "
                f"choose from {list(supported)}"
            )
        dims[key] = list(dict.fromkeys(values))
    dims.setdefault("precision", [spec.precisions[0]])
    for key, supported in choices.items():
        dims.setdefault(key, [supported[0]])
    return dims


@dataclass(frozen=True)
class SearchSpace:
    batch_sizes: list[int]
    allocators: list[str]
    instances: list[int]
    threads: list[int] | None  # None: any count from 1 to the cores left per instance
    backends: dict[str, dict[str, list[Any]]]  # backend -> {"precision": [...], option: [...]}
    cores: int
    baseline_batch_size: int
    notes: tuple[str, ...] = ()
    runtimes: dict[str, list[str]] = field(default_factory=dict)  # backend -> runtimes it may run in (first: default)
    thread_pool: ThreadPoolDims = ThreadPoolDims(["gnu"], [DEFAULT_KMP_AFFINITY], [DEFAULT_KMP_BLOCKTIME], [False])
    runtime_openmp: dict[str, list[str]] = field(default_factory=dict)  # runtime -> OpenMP libraries it has
    task: str = "classify"  # "generate": language-model backends, batch_size = concurrent sequences
    # The server scenario's batching dimension (ms the oldest queued request may wait for a fuller batch);
    # None in the closed-loop scenarios, where it does not exist.
    max_waits: list[float] | None = None

    @property
    def specs(self) -> dict[str, BackendSpec]:
        return backend_specs(self.task)

    @classmethod
    def parse(
        cls,
        data: dict[str, Any],
        machine: MachineProbe,
        runtimes: dict[str, Runtime],
        task: str = "classify",
        unavailable: dict[str, str] | None = None,
        server: bool = False,
        engine_routes: dict[str, list[str]] | None = None,
    ) -> SearchSpace:
        """Validate the YAML content and narrow it to what this machine and its runtimes can run.
        `unavailable`: precisions this machine's libraries cannot run (generation), each with its reason.
        `engine_routes`: generation backends that run in a runtime other than the main one (IPEX's).
        `server`: the server scenario, whose batching adds max_wait_ms (the other scenarios ignore it)."""
        unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
        if unknown:
            raise UserError(f"search space: unknown key {unknown[0]!r}; allowed keys are {', '.join(TOP_LEVEL_KEYS)}")
        notes: list[str] = [f"backend plugin {point} left out: {why}" for point, why in plugin_problems().items()]
        cores = machine.physical_cores
        batch_key = "sequences" if task == "generate" else "batch_size"
        batch_sizes = _batch_sizes(data, task, batch_key)
        max_waits = _max_waits(data)
        allocators = _allocators(data, machine, notes)
        instances, threads = _instances_and_threads(data, cores)
        if task == "generate":
            instances = _instances_splitting(instances, batch_sizes, notes)
        thread_pool = ThreadPoolDims.parse(data, machine, runtimes, notes)
        backends, routes = cls._backends(
            data.get("backends", {"eager": {}}),
            runtimes,
            notes,
            backend_specs(task),
            unavailable or {},
            engine_routes or {},
        )
        _check_explicit_runtimes_run_a_backend(data, runtimes, routes)
        baseline_bs = _baseline_batch_size(data, task, batch_key, batch_sizes, server)
        return cls(
            batch_sizes,
            allocators,
            instances,
            threads,
            backends,
            cores,
            baseline_bs,
            tuple(notes),
            routes,
            thread_pool,
            {name: sorted(r.openmp) for name, r in runtimes.items()},
            task,
            max_waits if server else None,
        )

    @staticmethod
    def _backends(
        raw: Any,
        runtimes: dict[str, Runtime],
        notes: list[str],
        specs: dict[str, BackendSpec],
        unavailable: dict[str, str],
        engine_routes: dict[str, list[str]],
    ) -> tuple[dict[str, dict[str, list[Any]]], dict[str, list[str]]]:
        if not isinstance(raw, dict) or not raw:
            raise UserError("search space: 'backends' must map backend names to their options")
        result: dict[str, dict[str, list[Any]]] = {}
        routes: dict[str, list[str]] = {}
        for name, options in raw.items():
            if name not in specs:
                raise UserError(f"search space: unknown backend {name!r}; known: {', '.join(specs)}{_plugins_said()}")
            spec = specs[name]
            dims = _backend_dims(name, spec, options)
            if name in unavailable:  # an engine not installed here: the other backends' trials run
                notes.append(f"backend {name} cannot run here ({unavailable[name]}): left out")
                continue
            # Generation runs in the main runtime (transformers and torchao, probed there), but for an engine
            # that runs only in another one (IPEX's); the torchao precisions probed concern torchao's backends
            # only (IPEX's woq_int4 is its own kernel, whatever its name shares).
            route = engine_routes.get(name, ["main"])
            left_out = [p for p in dims["precision"] if p in unavailable] if "torchao" in spec.requires else []
            for precision in left_out:
                notes.append(f"precision {precision} cannot run here ({unavailable[precision]}): left out of {name}")
            dims["precision"] = [p for p in dims["precision"] if p not in left_out]
            if not dims["precision"]:
                continue
            routes[name] = candidates(name, runtimes) if specs is BACKENDS else route
            if not routes[name]:
                notes.append(f"backend {name} imports in no runtime ({why_not(name, runtimes)}): left out")
                del routes[name]
                continue
            result[name] = dims
        if not result:
            raise UserError(
                "search space: none of the listed backends can run here; 'autotune probe' lists what each runtime runs"
            )
        return result, routes

    # ---- sampling -----------------------------------------------------------------------------------
    def suggest(self, trial: Any) -> TrialConfig:
        """Ask an Optuna trial for one configuration; the result always fits the machine."""
        backend = trial.suggest_categorical("backend", list(self.backends))
        dims = self.backends[backend]
        precision = trial.suggest_categorical(f"{backend}.precision", dims["precision"])
        spec = self.specs[backend]
        chosen: dict[str, Any] = {}
        for key, values in dims.items():
            if key == "precision" or not spec.applies(key, precision):
                continue
            if key in GUIDED and GUIDED[key] not in getattr(trial, "user_attrs", {}):
                value = max(values)  # never sampled: its guide enqueues the other values
                if value != spec.choices[key][0]:  # at the option's default it is left out, as before it existed
                    chosen[key] = value
                continue
            value = trial.suggest_categorical(f"{backend}.{key}", values)
            if key not in LEFT_OUT_AT_DEFAULT or value != spec.choices[key][0]:
                chosen[key] = value
        routes = self.runtimes.get(backend, ["main"])
        runtime = trial.suggest_categorical(f"{backend}.runtime", routes) if len(routes) > 1 else routes[0]
        pool: dict[str, Any] = {}
        if spec.torch_threads:
            pool["openmp"] = trial.suggest_categorical("openmp", self.thread_pool.openmp)
            if pool["openmp"] == "intel":
                pool["kmp_affinity"] = trial.suggest_categorical("kmp_affinity", self.thread_pool.kmp_affinity)
                pool["kmp_blocktime"] = trial.suggest_categorical("kmp_blocktime", self.thread_pool.kmp_blocktime)
            pool["thp"] = trial.suggest_categorical("thp", self.thread_pool.thp)
        batch_size = trial.suggest_categorical(
            "sequences" if self.task == "generate" else "batch_size", self.batch_sizes
        )
        allocator = trial.suggest_categorical("allocator", self.allocators)
        instances = trial.suggest_categorical("instances", self.instances)
        if self.task == "generate":  # `sequences` is the total: each instance runs its even share
            if batch_size % instances:
                raise InfeasibleConfig(f"{batch_size} sequences do not split evenly over {instances} instances")
            batch_size //= instances
        max_threads = self.cores // instances
        if self.threads is None:
            threads = trial.suggest_int("threads_per_instance", 1, max_threads)
        else:
            threads = trial.suggest_categorical("threads_per_instance", self.threads)
        if self.max_waits is not None:  # with batches of one there is nothing to wait for
            pool["max_wait_ms"] = trial.suggest_categorical("max_wait_ms", self.max_waits) if batch_size > 1 else 0.0
        config = TrialConfig(backend, precision, batch_size, allocator, instances, threads, chosen, runtime, **pool)
        if config.total_cores > self.cores:
            raise InfeasibleConfig(f"{instances} instances x {threads} threads exceeds the {self.cores} physical cores")
        refusal = backend_module(backend, self.task).unsupported(config)
        if refusal:
            raise InfeasibleConfig(refusal)
        if config.openmp == "intel" and "intel" not in self.runtime_openmp.get(runtime, ["intel"]):
            raise InfeasibleConfig(f"runtime {runtime} has no Intel OpenMP library (pip install intel-openmp there)")
        return config

    def choices(self, name: str) -> Sequence[Any] | None:
        """The values this space offers for the Optuna parameter `name`; None: it has no such parameter."""
        backend, _, option = name.partition(".")
        if option:
            dims = self.backends.get(backend)
            if dims is None:
                return None
            return self.runtimes.get(backend, ["main"]) if option == "runtime" else dims.get(option)
        pool = self.thread_pool
        offered: dict[str, Sequence[Any] | None] = {
            "backend": list(self.backends),
            self.batch_param: self.batch_sizes,
            "allocator": self.allocators,
            "instances": self.instances,
            "threads_per_instance": self.threads or range(1, self.cores + 1),
            "openmp": pool.openmp,
            "kmp_affinity": pool.kmp_affinity,
            "kmp_blocktime": pool.kmp_blocktime,
            "thp": pool.thp,
            "max_wait_ms": self.max_waits,
        }
        return offered.get(name)

    def offered_params(self, params: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """`params` (an earlier study's winner) narrowed to the values this space offers, and the ones left
        out as 'name=value'. Optuna raises on an enqueued categorical value outside its choices; a parameter
        left out is sampled instead. Empty when its backend is not offered: nothing of it would be tried."""
        kept: dict[str, Any] = {}
        dropped: list[str] = []
        for name, value in params.items():
            offered = self.choices(name)
            if offered is not None and value in offered:
                kept[name] = value
            else:
                dropped.append(f"{name}={value}")
        if "backend" not in kept:
            return {}, dropped
        if self.task == "generate" and self.batch_param not in kept:
            # a total this space does not list is sampled: its split too (instances and their threads), or the
            # split may be uneven or the threads not fit
            for name in ("instances", "threads_per_instance"):
                if name in kept:
                    dropped.append(f"{name}={kept.pop(name)}")
        return kept, dropped

    def coverage_params(
        self,
        preferred: Mapping[tuple[str, str], Any] | None = None,
        batch: int | None = None,
        alongside: Collection[tuple[str, str]] = (),
    ) -> list[dict[str, Any]]:
        """One trial per backend x precision (the baseline's batch unless given one, first allocator and
        instance count, the most threads that fit, first value of each backend option, or the `preferred`
        value of a (backend, option) where the space lists it: tuning/payoff.coverage_preferences), so
        every backend is measured once before the sampler concentrates. A preferred (backend, option) in
        `alongside` is followed by the same plan at the space's first value (Preference.alongside)."""
        preferred = preferred or {}
        batch = self.baseline_batch_size if batch is None else batch
        # generation: the first instance count that splits the total evenly (1 always does, where listed)
        count = next((n for n in self.instances if self.task != "generate" or batch % n == 0), self.instances[0])
        threads = most_threads(count, self.threads, self.cores)
        if threads is None:
            return []
        plans = []
        for backend, dims in self.backends.items():
            routes = self.runtimes.get(backend, ["main"])
            for precision in dims["precision"]:
                for runtime in routes:  # each runtime a backend may run in is measured once too
                    params: dict[str, Any] = {
                        "backend": backend,
                        f"{backend}.precision": precision,
                        self.batch_param: batch,
                        "allocator": self.allocators[0],
                        "instances": count,
                        "threads_per_instance": threads,
                    }
                    params.update(
                        {
                            f"{backend}.{key}": (
                                preferred[backend, key]
                                if (backend, key) in preferred and preferred[backend, key] in values
                                else values[0]
                            )
                            for key, values in dims.items()
                            if key != "precision" and self.specs[backend].applies(key, precision)
                        }
                    )
                    if len(routes) > 1:
                        params[f"{backend}.runtime"] = runtime
                    if self.specs[backend].torch_threads:
                        params.update(self._plain_thread_pool())
                    params.update(self._first_wait(batch))
                    plans.append(params)
                    for backend_option in alongside:
                        key = f"{backend_option[0]}.{backend_option[1]}"
                        first = dims.get(backend_option[1], [None])[0] if backend_option[0] == backend else None
                        if key in params and params[key] != first:
                            plans.append({**params, key: first})
        return plans

    @property
    def batch_param(self) -> str:
        """The name of the batch parameter: concurrent sequences for generation, batch_size otherwise."""
        return "sequences" if self.task == "generate" else "batch_size"

    def _first_wait(self, batch: int) -> dict[str, Any]:
        """The server scenario's baseline and coverage batching: the space's first max_wait_ms (none to
        choose with batches of one)."""
        return {"max_wait_ms": self.max_waits[0]} if self.max_waits is not None and batch > 1 else {}

    def _plain_thread_pool(self) -> dict[str, Any]:
        """GNU OpenMP and no huge pages when the space allows them (what an untuned process runs with)."""
        return {
            "openmp": "gnu" if "gnu" in self.thread_pool.openmp else self.thread_pool.openmp[0],
            "thp": False if False in self.thread_pool.thp else self.thread_pool.thp[0],
        }

    def baseline_params(self) -> dict[str, Any] | None:
        """Eager FP32, contiguous, glibc, one instance on all cores: what a user runs before tuning."""
        eager = self.backends.get("eager")
        if not eager or "fp32" not in eager["precision"] or "glibc" not in self.allocators or 1 not in self.instances:
            return None
        if (
            "gnu" not in self.thread_pool.openmp
            or False not in self.thread_pool.thp
            or "main" not in self.runtimes.get("eager", ["main"])
        ):
            return None
        if self.threads is not None and self.cores not in self.threads:
            return None
        params: dict[str, Any] = {
            "backend": "eager",
            "eager.precision": "fp32",
            self.batch_param: self.baseline_batch_size,
            "allocator": "glibc",
            "instances": 1,
            "threads_per_instance": self.cores,
            **self._plain_thread_pool(),
            **self._first_wait(self.baseline_batch_size),
        }
        if len(self.runtimes.get("eager", [])) > 1:
            params["eager.runtime"] = "main"
        for key, values in eager.items():
            if key != "precision" and self.specs["eager"].applies(key, "fp32"):
                default = self.specs["eager"].choices[key][0]
                if default not in values:
                    return None
                params[f"eager.{key}"] = default
        return params


def family(params: dict[str, Any]) -> tuple[Any, Any]:
    """A configuration's backend x precision, from its Optuna parameters."""
    backend = params.get("backend")
    return backend, params.get(f"{backend}.precision")

"""What every backend declares and returns. Kept free of heavy imports: the search reads it too.

A backend is a module (or any object with these members) that satisfies one of the protocols below,
registered by name in autotune/backends/__init__.py, a built-in one there, a plugin's through the
`autotune.backends` entry-point group:

- every backend: `SPEC` (every fact autotune knows of it: its name, task, precisions, its options as a
  typed record, what it needs installed, its tie-break and preparation ranks, whether it builds an
  artifact), `unsupported(config)` (why a configuration cannot run, refused before launch) and
  `unavailable()` (why it cannot run in this runtime at all: `import_failure(SPEC)` for most);
- a classification backend: `prepare` (the callable from the torch module) where it builds no artifact,
  and `ARTIFACT_VERSION`, `artifact_identity`, `build_artifact` (once, in its own process) and `load`
  (the callable from that artifact) where it builds one;
- a generation backend: `ARTIFACT_VERSION`, `artifact_identity`, `build_artifact` (the quantized weights,
  or an engine's own file), `cached_artifact(dir)` (that file in the cache, when it can be loaded here)
  and `prepare` (the generator, from that artifact when it loads). The generator decodes greedily with a
  stamp per token (`generate`, `generate_with_logits`, `token_stamps`: see generation/decode_loop.py) and
  carries a `probe` when it holds no torch module. An engine that cannot run in the main runtime says so
  in `unavailable()`; the study then runs its trials in the runtime where it can (IPEX's), else leaves it
  out with that line.

A backend's options are a frozen `BackendOptions` record whose fields are each declared with `choice`:
the values the search space may list (the first is the default), the precisions the option means
something at, and whether it only schedules work. The backend reads them as `XOptions.of(config)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from autotune.common.json_record import Record

if TYPE_CHECKING:
    from autotune.backends.precision import ExecutedPrecision

PRECISIONS = ("fp32", "bf16", "int8")
# The tie-break and preparation rank of a backend that declares none: after every built-in one.
LAST = 100

OptionsT = TypeVar("OptionsT", bound="BackendOptions")
_UNSET: Any = object()


def choice(
    *values: Any, precisions: tuple[str, ...] | None = None, scheduling: bool = False, default: Any = _UNSET
) -> Any:
    """A BackendOptions field: the values a search space may list for it (the first is the space's
    default), the precisions it means something at (None: all of the backend's; sampled only there), and
    whether it only schedules the work (streams, requests in flight, inter-op threads), never which kernels
    or precisions run, so a precision fallback found once holds for every value of it. `default`: what a
    configuration lacking the option means, where that is not the first value (a study recorded before
    the option existed)."""
    if not values:
        raise ValueError("choice() needs at least one value")
    metadata = {"choices": tuple(values), "precisions": precisions, "scheduling": scheduling}
    return field(default=values[0] if default is _UNSET else default, metadata=metadata)


@dataclass(frozen=True)
class BackendOptions(Record):
    """A backend's options as a typed record: subclass it as a frozen dataclass whose every field is a
    `choice(...)`. A trial's configuration stores them as a plain mapping (studies and best.json keep
    that layout); `of` reads it back, unknown keys ignored (an option a study recorded that no longer
    exists) and missing ones at their default."""

    @classmethod
    def of(cls: type[OptionsT], config: BackendConfig) -> OptionsT:
        return cls.from_json(dict(config.options))

    @classmethod
    def choices(cls) -> dict[str, tuple[Any, ...]]:
        """Each option and the values a search space may list for it, the default first."""
        return {f.name: f.metadata["choices"] for f in dataclasses.fields(cls)}

    @classmethod
    def precisions_of(cls, option: str) -> tuple[str, ...] | None:
        """The precisions an option means something at; None: all of the backend's (or no such option)."""
        precisions: tuple[str, ...] | None = next(
            (f.metadata["precisions"] for f in dataclasses.fields(cls) if f.name == option), None
        )
        return precisions

    @classmethod
    def scheduling(cls) -> tuple[str, ...]:
        """The options that only schedule the work: a precision fallback found once holds for all their values."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["scheduling"])

    @classmethod
    def undeclared(cls) -> list[str]:
        """The fields not declared with `choice` (the search would not know their values)."""
        return [f.name for f in dataclasses.fields(cls) if "choices" not in f.metadata]


@dataclass(frozen=True)
class BackendSpec:
    """A backend's promise: which precisions and options it supports, what it needs installed, and
    where it stands among the others."""

    name: str
    description: str
    precisions: tuple[str, ...]
    # What the backend serves: "classify" (one forward pass per batch) or "generate" (text generation).
    task: str = "classify"
    # Its options: a BackendOptions record (the search space YAML is validated against it).
    options: type[BackendOptions] = BackendOptions
    requires: tuple[str, ...] = ()  # importable modules
    # Distributions whose versions decide what it computes: recorded in the fingerprint and the runtime
    # report, and keyed in the artifact cache (torch, torchvision, numpy... are everyone's: not listed).
    packages: tuple[str, ...] = ()
    # Its rank when configurations tie within the noise: the simpler (lower) one wins.
    complexity: int = LAST
    # Its rank among the coverage round's backends of one tier: the cheaper preparation (lower) first.
    prepare_cost: int = LAST
    # What to do where it does not import: the runtime it runs in, or what installs it (said with the reason).
    runtime_hint: str = ""
    # Environment variables `unavailable()` reads (where its tools lie): a runtime's cached probe is made
    # again when one of them changes.
    probe_environment: tuple[str, ...] = ()
    # Artifact backends build a file once (export, conversion, quantization) in a separate process and
    # their timing processes only load it; the others run the torch module directly. A tuple: only at
    # those precisions (IPEX builds a file for int8 only).
    uses_artifact: bool | tuple[str, ...] = False
    # Runs on PyTorch's OpenMP thread pool: the OpenMP runtime and PyTorch's huge-page setting matter.
    # ONNX Runtime and OpenVINO keep their own thread pools (and allocators' huge pages), so not there.
    torch_threads: bool = False
    # Compiles with inductor: its trials share one inductor cache (TORCHINDUCTOR_CACHE_DIR) under the
    # studies folder, so a later trial of the same graph loads the compiled kernels.
    inductor_cache: bool = False
    # Variables the backend needs when the trial preloads an allocator (LD_PRELOAD).
    preloaded_allocator_env: tuple[tuple[str, str], ...] = ()
    # A mix's types (compressed_share): the type each mixed precision keeps its sensitive matrices in, where
    # that is a precision of its own (the mix search reads whether that type's whole model broke the bound).
    kept_types: tuple[tuple[str, str], ...] = ()

    @property
    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Each option and the values a search space may list for it, the default first."""
        return self.options.choices()

    @property
    def scheduling_options(self) -> tuple[str, ...]:
        """The options that only schedule the work, never which kernels or precisions run."""
        return self.options.scheduling()

    def applies(self, option: str, precision: str) -> bool:
        """Whether an option means something at a precision (it is sampled only there)."""
        precisions = self.options.precisions_of(option)
        return precision in (self.precisions if precisions is None else precisions)

    def builds_artifact(self, precision: str) -> bool:
        if isinstance(self.uses_artifact, tuple):
            return precision in self.uses_artifact
        return self.uses_artifact


def import_failure(spec: BackendSpec) -> str | None:
    """Why a backend cannot run in this runtime: the first module of its `requires` that does not import,
    as one line with its runtime hint; None when they all import. The default `unavailable()`."""
    why = first_import_failure(spec.requires)
    return f"{why}; {spec.runtime_hint}" if why and spec.runtime_hint else why


def first_import_failure(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that does not import, and why, as one line; None when they all import.
    Quietly: an extension built for another torch may print, warn, or even exit the process."""
    for module in modules:
        try:
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                warnings.simplefilter("ignore")
                importlib.import_module(module)
        except BaseException as exc:  # an extension built for another torch can raise anything, even SystemExit
            lines = str(exc).strip().splitlines() or [""]
            return f"{module}: {type(exc).__name__}: {lines[0][:200]}"
    return None


@dataclass
class Runner:
    """A prepared model: `convert_input` once outside the timed loop, then `__call__` per batch."""

    run: Callable[[Any], Any]
    convert_input: Callable[[Any], Any] = lambda x: x
    details: dict[str, Any] = field(default_factory=dict)
    batches_per_call: int = 1  # >1 when one call keeps several async requests (streams) busy
    # What `run` takes: "torch" tensors or "numpy" arrays (ONNX Runtime, OpenVINO). autotune.load hands a
    # caller's batch of that kind to convert_input as it is, so it crosses no other library on each call.
    takes: str = "torch"
    # What the prepared model really executes, for a claimed precision (int8, bf16): reads the
    # runtime's own record, or makes one call on the native input at most (backends/precision.py).
    probe: Callable[[Any, str], ExecutedPrecision] | None = None

    def __call__(self, native_input: Any) -> Any:
        return self.run(native_input)


def numpy_batch(batch: tuple[Any, ...]) -> tuple[Any, ...]:
    """A batch of torch tensors or numpy arrays as C-contiguous numpy arrays, for the runtimes fed numpy
    (ONNX Runtime, OpenVINO): floats as float32, integer inputs (token ids) keep their type. Nothing is
    copied that need not be: a tensor becomes a view of its memory, and an array that is already
    C-contiguous float32 (or integer) is returned as the very same object."""
    import numpy as np

    arrays = (x if isinstance(x, np.ndarray) else x.numpy() for x in batch)
    return tuple(np.asarray(a, dtype=np.float32 if a.dtype.kind == "f" else None, order="C") for a in arrays)


class BackendConfig(Protocol):
    """What a backend reads of a trial's configuration (autotune.records.config.TrialConfig, which the
    layers keep backends from importing, satisfies it)."""

    @property
    def backend(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def threads_per_instance(self) -> int: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def openmp(self) -> str: ...
    @property
    def kmp_affinity(self) -> str | None: ...


class Backend(Protocol):
    """What every backend module declares."""

    SPEC: BackendSpec

    def unsupported(self, config: BackendConfig) -> str | None:
        """Why this configuration cannot run (refused before launch), or None."""

    def unavailable(self) -> str | None:
        """Why the backend cannot run in this runtime at all (one line), or None."""


class ModuleBackend(Backend, Protocol):
    """A classification backend that runs the torch module itself (no artifact at some precision)."""

    def prepare(self, model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
        """The timed callable, built from the model in the timing process."""


class ArtifactBackend(Backend, Protocol):
    """A backend that builds a file once (export, conversion, quantization) for its timing processes."""

    ARTIFACT_VERSION: int  # bumped when build_artifact changes what it writes: older caches are not reused

    def artifact_identity(self, config: BackendConfig) -> dict[str, Any]:
        """What the artifact depends on besides the model and calibration data (its cache key)."""


class ClassifyArtifactBackend(ArtifactBackend, Protocol):
    """A classification backend's artifact: built from the model and calibration batches, then loaded."""

    def build_artifact(
        self, model: Any, example: Any, calibration: list[Any], config: BackendConfig, out_dir: Path
    ) -> dict[str, Any]:
        """Write the artifact into `out_dir`; returns what was done."""

    def load(self, example: Any, config: BackendConfig, artifact_dir: Path) -> Runner:
        """The timed callable, from the artifact."""


class GenerateBackend(ArtifactBackend, Protocol):
    """A text-generation backend: quantized weights built once, and a generator that decodes."""

    def build_artifact(self, model: Any, calibration: Any, config: BackendConfig, out_dir: Path) -> dict[str, Any]:
        """Quantize once into `out_dir`; returns what was done."""

    def cached_artifact(self, artifact_dir: str | Path) -> dict[str, Any] | None:
        """The artifact in `artifact_dir` (its folder and build details) when it can be loaded here, else None
        (not built, evicted, or built by other versions)."""

    def prepare(
        self, model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: Any = None
    ) -> tuple[Any, dict[str, Any]]:
        """The generator (the prepared weights of `artifact` when they load, else quantized here) and what
        was done."""


# The members a backend module must define beyond `Backend`'s, by task and by whether it builds artifacts.
REQUIRED_MEMBERS = {
    ("classify", False): ("prepare",),
    ("classify", True): ("ARTIFACT_VERSION", "artifact_identity", "build_artifact", "load"),
    ("generate", False): ("cached_artifact", "prepare"),
    ("generate", True): ("ARTIFACT_VERSION", "artifact_identity", "build_artifact", "cached_artifact", "prepare"),
}


def missing_members(module: Any) -> list[str]:
    """The members of its interface a backend module lacks (empty when it is complete)."""
    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, BackendSpec):
        return ["SPEC"]
    options = spec.options
    if not (isinstance(options, type) and issubclass(options, BackendOptions) and dataclasses.is_dataclass(options)):
        return ["SPEC.options (a BackendOptions dataclass)"]
    undeclared = options.undeclared()
    if undeclared:
        return [f"choice(...) for its option {name}" for name in undeclared]
    artifact = bool(spec.uses_artifact)
    wanted = ["unsupported", "unavailable", *REQUIRED_MEMBERS.get((spec.task, artifact), ("prepare",))]
    if spec.task == "classify" and isinstance(spec.uses_artifact, tuple):  # artifact at some precisions only
        wanted += REQUIRED_MEMBERS["classify", False]
    return [name for name in wanted if not hasattr(module, name)]

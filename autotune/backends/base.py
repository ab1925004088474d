"""What every backend declares and returns. Kept free of heavy imports: the search reads it too.

A backend is a module that satisfies one of the protocols below and is registered by name in
autotune/backends/__init__.py:

- every backend: `SPEC` (its name, task, precisions, options, what it needs installed, whether it builds
  an artifact) and `unsupported(config)` (why a configuration cannot run, refused before launch);
- a classification backend: `prepare` (the callable from the torch module) where it builds no artifact,
  and `ARTIFACT_VERSION`, `artifact_identity`, `build_artifact` (once, in its own process) and `load`
  (the callable from that artifact) where it builds one;
- a generation backend: `ARTIFACT_VERSION`, `artifact_identity`, `build_artifact` (the quantized weights,
  or an engine's own file) and `prepare` (the generator, from that artifact when it loads). The generator
  decodes greedily with a stamp per token (`generate`, `generate_with_logits`, `token_stamps`: see
  generation/decode_loop.py) and carries a `probe` when it holds no torch module. An engine outside PyTorch
  (generation/llamacpp.py) may add `unavailable()` (why it cannot run in this runtime: the study runs its
  trials in the IPEX runtime when it runs there, as generation/ipex.py does, else leaves it out with that
  line) and `cached_artifact(dir)` (its own file's check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autotune.backends.precision import ExecutedPrecision

PRECISIONS = ("fp32", "bf16", "int8")


@dataclass(frozen=True)
class BackendSpec:
    """A backend's promise: which precisions and options it supports, and what it needs installed."""

    name: str
    description: str
    precisions: tuple[str, ...]
    # What the backend serves: "classify" (one forward pass per batch) or "generate" (text generation).
    task: str = "classify"
    options: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    requires: tuple[str, ...] = ()  # importable modules
    # Options that only mean something at some precisions (sampled only there), e.g. {"int8_float": ("int8",)}.
    option_precisions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Artifact backends build a file once (export, conversion, quantization) in a separate process and
    # their timing processes only load it; the others run the torch module directly. A tuple: only at
    # those precisions (IPEX builds a file for int8 only).
    uses_artifact: bool | tuple[str, ...] = False
    # Runs on PyTorch's OpenMP thread pool: the OpenMP runtime and PyTorch's huge-page setting matter.
    # ONNX Runtime and OpenVINO keep their own thread pools (and allocators' huge pages), so not there.
    torch_threads: bool = False
    # Options that only schedule the work (streams, requests in flight, inter-op threads), never which
    # kernels or precisions run: a precision fallback found once holds for every value of them.
    scheduling_options: tuple[str, ...] = ()
    # Compiles with inductor: its trials share one inductor cache (TORCHINDUCTOR_CACHE_DIR) under the
    # studies folder, so a later trial of the same graph loads the compiled kernels.
    inductor_cache: bool = False
    # Variables the backend needs when the trial preloads an allocator (LD_PRELOAD).
    preloaded_allocator_env: tuple[tuple[str, str], ...] = ()

    def applies(self, option: str, precision: str) -> bool:
        return precision in self.option_precisions.get(option, self.precisions)

    def builds_artifact(self, precision: str) -> bool:
        if isinstance(self.uses_artifact, tuple):
            return precision in self.uses_artifact
        return self.uses_artifact


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

    def prepare(
        self, model: Any, config: BackendConfig, new_tokens: int, calibration: Any = None, artifact: Any = None
    ) -> tuple[Any, dict[str, Any]]:
        """The generator (the prepared weights of `artifact` when they load, else quantized here) and what
        was done."""


# The members a backend module must define beyond `Backend`'s, by task and by whether it builds artifacts.
REQUIRED_MEMBERS = {
    ("classify", False): ("prepare",),
    ("classify", True): ("ARTIFACT_VERSION", "artifact_identity", "build_artifact", "load"),
    ("generate", True): ("ARTIFACT_VERSION", "artifact_identity", "build_artifact", "prepare"),
}


def missing_members(module: Any) -> list[str]:
    """The members of its interface a backend module lacks (empty when it is complete)."""
    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, BackendSpec):
        return ["SPEC"]
    artifact = bool(spec.uses_artifact)
    wanted = ["unsupported", *REQUIRED_MEMBERS.get((spec.task, artifact), ("prepare",))]
    if spec.task == "classify" and isinstance(spec.uses_artifact, tuple):  # artifact at some precisions only
        wanted += REQUIRED_MEMBERS["classify", False]
    return [name for name in wanted if not hasattr(module, name)]

"""What every backend declares and returns. Kept free of heavy imports: the search reads it too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.backends.precision import ExecutedPrecision

PRECISIONS = ("fp32", "bf16", "int8")


@dataclass(frozen=True)
class BackendSpec:
    """A backend's promise: which precisions and options it supports, and what it needs installed."""

    name: str
    description: str
    precisions: tuple[str, ...]
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

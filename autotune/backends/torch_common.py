"""Pieces shared by the backends that run a torch nn.Module: memory format, autocast, inference mode,
and what such a module executes (oneDNN's primitives and the ATen operators of one call)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from autotune.backends.base import Runner
from autotune.backends.precision import ExecutedPrecision, bucket_of, judge


def memory_format_of(memory_format: str) -> torch.memory_format:
    """A backend's `memory_format` option as torch's: channels_last, else contiguous."""
    return torch.channels_last if memory_format == "channels_last" else torch.contiguous_format


def convert_for(model: torch.nn.Module, memory_format: str) -> torch.nn.Module:
    return model.eval().to(memory_format=memory_format_of(memory_format))


def input_converter(memory_format: str):
    """Batch (tuple of tensors) in, batch out: 4-D float inputs take the memory format, the rest stay."""
    fmt = memory_format_of(memory_format)

    def convert(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(x.contiguous(memory_format=fmt) if x.dim() == 4 and x.is_floating_point() else x for x in batch)

    return convert


def precision_context(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"precision {precision!r} is not supported by this backend")


def module_runner(module: Any, precision: str, memory_format: str, details: dict[str, Any] | None = None) -> Runner:
    """Wrap a callable module so every call runs under inference mode and the precision's autocast."""

    def run(batch: tuple[torch.Tensor, ...]) -> Any:
        with torch.inference_mode(), precision_context(precision):
            return module(*batch)

    return Runner(run=run, convert_input=input_converter(memory_format), details=details or {}, probe=torch_probe(run))


def torch_probe(run: Callable[[Any], Any]) -> Callable[[Any, str], ExecutedPrecision]:
    """A runner's probe: one call under oneDNN's verbose mode and the torch profiler."""
    return lambda native_input, claimed: probe_torch(lambda: run(native_input), claimed)


# --- the torch backends: oneDNN's verbose output and the profiler's operator data types -------------

ONEDNN_COMPUTE = {"convolution", "deconvolution", "inner_product", "matmul", "rnn"}
# ATen and extension operators that do a layer's arithmetic (by the name after the namespace).
_COMPUTE_OP = re.compile(
    r"(\w*(conv\d?d|convolution|conv_transpose\w*|qconv\w*|_convolution_pointwise\w*)"
    r"|\w*linear\w*|addmm|_addmm_activation|mm|bmm|baddbmm|matmul|\w*gemm\w*)",
    re.IGNORECASE,  # IPEX's torch_ipex::ipex_MKLSGEMM
)
_MD_DTYPE = re.compile(r"\b(src|wei)(?:_\d+)?[:_](\w+?):")
_NOT_A_TENSOR = {"", "Scalar", "ScalarList", "TensorList", "GenericList", "None"}
# Lines the profiler's tracing library prints on stderr: not the model's.
_PROFILER_NOISE = re.compile(r"^(USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d .*\.cpp:\d+\]")


def onednn_counts(verbose: str) -> dict[str, int]:
    """Compute primitives oneDNN executed, by precision: int8 when the source or the weights are
    8-bit integers, else the source's type. Reorders, eltwise and the like are not layers."""
    counts: Counter[str] = Counter()
    for line in verbose.splitlines():
        parts = line.split(",")
        if not parts or "verbose" not in parts[0] or "exec" not in parts[:5] or "graph" in parts[:5]:
            continue
        at = parts.index("exec")
        if len(parts) < at + 6 or parts[at + 2] not in ONEDNN_COMPUTE:
            continue
        types = dict(_MD_DTYPE.findall(parts[at + 5]))
        buckets = {bucket_of(t) for t in types.values()}
        counts["int8" if "int8" in buckets else bucket_of(types.get("src", "other"))] += 1
    return dict(counts)


def aten_counts(events: list[Any]) -> dict[str, int]:
    """Innermost convolution and matrix-product operators the profiler recorded, by the type of their
    first tensor: autocast's outer fp32 call and the layers of dispatch under it count once."""
    compute = []
    for event in events:
        name = event.name().split("::")[-1]
        if "convert" not in name and _COMPUTE_OP.fullmatch(name):
            start = event.start_ns()
            compute.append((event.start_thread_id(), start, start + event.duration_ns(), event))
    compute.sort(key=lambda c: (c[0], c[1], -c[2]))  # per thread, each operator before those it calls
    has_inner = [False] * len(compute)
    open_calls: list[int] = []
    for i, (thread, start, _, _) in enumerate(compute):
        while open_calls and (compute[open_calls[-1]][0] != thread or compute[open_calls[-1]][2] <= start):
            open_calls.pop()
        if open_calls:
            has_inner[open_calls[-1]] = True
        open_calls.append(i)
    counts: Counter[str] = Counter()
    for (_, _, _, event), outer in zip(compute, has_inner):
        if not outer:
            types = [d for d in event.dtypes() if d not in _NOT_A_TENSOR]
            counts[bucket_of(types[0]) if types else "other"] += 1
    return dict(counts)


@contextlib.contextmanager
def captured_fds() -> Iterator[dict[str, str]]:
    """What the C libraries write to stdout and stderr meanwhile (oneDNN prints its verbose lines with
    printf), into the returned dict once the block ends; other output is passed on afterwards."""
    libc = ctypes.CDLL(None)
    captured: dict[str, str] = {}
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        files = {1: out_file, 2: err_file}
        sys.stdout.flush()
        sys.stderr.flush()
        libc.fflush(None)
        saved = {fd: os.dup(fd) for fd in files}
        try:
            for fd, tmp in files.items():
                os.dup2(tmp.fileno(), fd)
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            libc.fflush(None)
            for fd, old in saved.items():
                os.dup2(old, fd)
                os.close(old)
            for fd, tmp in files.items():
                tmp.seek(0)
                captured["stdout" if fd == 1 else "stderr"] = tmp.read().decode(errors="replace")
    out = [line for line in captured["stdout"].splitlines() if "_verbose," not in line]
    err = [line for line in captured["stderr"].splitlines() if not _PROFILER_NOISE.match(line)]
    if out:
        print("\n".join(out), flush=True)
    if err:
        print("\n".join(err), file=sys.stderr, flush=True)


def probe_torch(call: Callable[[], Any], claimed: str) -> ExecutedPrecision:
    """One call under oneDNN's verbose mode and the torch profiler: oneDNN's evidence first (what the
    kernels ran), then the ATen operators' data types (PyTorch's own kernels)."""
    onednn = torch.backends.mkldnn.is_available()
    verbose = torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON) if onednn else contextlib.nullcontext()
    # The autograd profiler, not torch.profiler.profile: that one imports inductor when it starts (seconds).
    with captured_fds() as output, torch.autograd.profiler.profile(record_shapes=True) as prof, verbose:
        call()
    evidence = {
        "oneDNN primitives": onednn_counts(output["stdout"]) if onednn else {},
        "ATen operators": aten_counts(list(prof.kineto_results.events())),
    }
    return judge(claimed, evidence)


T = TypeVar("T")
REDUCING_LAYERS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)


def with_reduction_depth(model: torch.nn.Module, forward: Callable[[], T]) -> tuple[T, float | None]:
    """`forward()`'s result, and the multiply-adds per output element of the model's convolutions and
    linear layers over that call: how deep their dot products reduce on average (torchvision's models at
    224x224: resnet50 368, vit_b_16 1221 without its attention's own projections, mobilenet_v3_large 49,
    efficientnet_b0 57). Where the CPU has no int8 dot products, int8 gains in the reduction, while every
    output element is requantized (tuning/payoff.py). Counted by hooks on the work the caller does anyway
    (the reference's own pass: no batch it did not run); None where no such layer ran as a Python module
    (a TorchScript or exported program has none)."""
    totals = {"macs": 0, "outputs": 0}

    def count(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor) or output.dim() == 0:
            return
        if isinstance(module, torch.nn.Linear):
            per_output = module.in_features
        else:
            weight = module.weight  # (out, in / groups, *kernel)
            assert isinstance(weight, torch.Tensor)
            per_output = weight[0].numel()
        totals["macs"] += output.numel() * per_output
        totals["outputs"] += output.numel()

    hooks = []
    try:
        for module in model.modules():
            if isinstance(module, REDUCING_LAYERS):
                hooks.append(module.register_forward_hook(count))
        result = forward()
    finally:
        for hook in hooks:
            hook.remove()
    return result, (totals["macs"] / totals["outputs"] if totals["outputs"] else None)


def attention_layers(model: torch.nn.Module) -> dict[str, int]:
    """The model's attention layers by class (torch's MultiheadAttention, or a class whose name ends in
    Attention: transformers' BertAttention, ViTSelfAttention...; a TorchScript module by its original
    class), outermost only, counted; empty for a convolutional network. The post-training int8 schemes
    that suit a CNN lose a transformer's accuracy: with static int8 on every operator a random-init
    vit_b_16 drifted 0.49 (ONNX Runtime) and 0.47 (OpenVINO) against 0.05 (docs/manual/benchmarks-log.md)."""
    found: dict[str, int] = {}
    counted: list[str] = []
    for path, module in model.named_modules():
        name = getattr(module, "original_name", None) or type(module).__name__
        inside = any(path.startswith(outer + ".") for outer in counted)
        if not inside and (isinstance(module, torch.nn.MultiheadAttention) or name.lower().endswith("attention")):
            counted.append(path)
            found[name] = found.get(name, 0) + 1
    return found

"""What a prepared model really executes, against the precision its configuration claims.

An int8 or bf16 configuration that silently runs fp32 kernels (a quantized program loaded without its
fusion passes, an OpenVINO model compiled in f32, an ONNX Runtime QDQ model left unfused, autocast that
never reaches a bf16 kernel) would win or lose for the wrong reason. Each backend reads what its
runtime executed, from the runtime itself where it says so:

- OpenVINO: the compiled model's runtime model (the precision each layer runs in);
- ONNX Runtime: the session's optimized graph (quantized operators, or float ones between Q/DQ pairs);
- the torch backends: one call under oneDNN's verbose mode (the data types of the convolution and
  matrix-product primitives it ran) and under the torch profiler (the data types of the ATen
  convolution and matrix-product operators, innermost ones only: PyTorch's own kernels, e.g. bf16 on
  a CPU where oneDNN has none, do not go through oneDNN).

Compute layers (convolutions, matrix products) are counted by the precision they ran in. A claim holds
when at least one of them ran in it (quantizers leave some layers in float on purpose); none is a
fallback; no compute layer seen at all, or a probe that cannot run, is `unchecked`, with the reason.
fp32 is what everything falls back to: it is not checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.common.json_record import Record

OK, FALLBACK, UNCHECKED = "ok", "fallback", "unchecked"

# The precisions checked, and the bucket their compute layers must be counted in (language models'
# torchao precisions too: weight-only and dynamic-activation int8 and int4, SmoothQuant).
CLAIMED_BUCKET = {
    "int8": "int8",
    "bf16": "bf16",
    "woq_int8": "int8",
    "da8w8": "int8",
    "smoothquant_int8": "int8",
    "woq_int4": "int4",
    "da8w4": "int4",
    # llama.cpp's GGUF types (a K-quant mix is named by its main type: Q4_K_M holds mostly Q4_K)
    "BF16": "bf16",
    "F16": "f16",
    "Q8_0": "int8",
    "Q6_K": "int6",
    "Q5_K_M": "int5",
    "Q4_K_M": "int4",
    "Q4_0": "int4",
    "Q2_K": "int2",
    # OpenVINO's weight formats (NNCF): int4 with a ratio below 1 keeps the rest in int8
    "fp16": "f16",
    "int8_asym": "int8",
    "int4_sym": "int4",
    "int4_asym": "int4",
}
# GGUF block types by the bits of their weights.
GGUF_BITS = {"Q8": "int8", "Q6": "int6", "Q5": "int5", "Q4": "int4", "IQ4": "int4", "Q3": "int3", "Q2": "int2"}


def bucket_of(dtype: str) -> str:
    """One runtime's name for a data type (oneDNN's s8, OpenVINO's I8, ATen's c10::BFloat16, ...) as
    one of int8, int4, bf16, f16, f32 or other."""
    name = dtype.lower().removeprefix("c10::").removeprefix("torch.")
    # ATen's "unsigned char" (uint8) is what oneDNN's int8 operators take as activations.
    if name in ("s8", "u8", "i8", "int8", "uint8", "quint8", "qint8"):
        return "int8"
    if name in ("s4", "u4", "i4", "int4", "uint4", "quint4x2"):
        return "int4"
    if name in ("signed char", "unsigned char"):
        return "int8"
    if name in ("bf16", "bfloat16"):
        return "bf16"
    if name in ("f16", "fp16", "half", "float16"):
        return "f16"
    if name in ("f32", "fp32", "float", "float32"):
        return "f32"
    gguf = re.match(r"(i?q\d)_", name)  # llama.cpp's block types: q8_0, q4_k, iq4_nl, ...
    if gguf:
        return GGUF_BITS.get(gguf.group(1).upper(), "other")
    return "other"


@dataclass(frozen=True)
class ExecutedPrecision(Record):
    """What ran, against what the configuration claims: `status` is ok, fallback or unchecked;
    `counts` are the compute layers by the precision they ran in, as `source` saw them; `evidence`
    holds the counts of every source read; `reason` says why when the status is not ok."""

    claimed: str
    status: str
    source: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    evidence: dict[str, dict[str, int]] = field(default_factory=dict)
    reason: str | None = None
    probe_s: float | None = None  # what reading it cost, outside every timed window

    @property
    def fallback(self) -> bool:
        return self.status == FALLBACK

    @property
    def cause(self) -> str:
        """The FAIL cause of a trial whose executed precision does not match its configuration."""
        return f"precision fallback: {self.reason}"

    @classmethod
    def unchecked(
        cls, claimed: str, reason: str, evidence: dict[str, dict[str, int]] | None = None
    ) -> ExecutedPrecision:
        return cls(claimed=claimed, status=UNCHECKED, reason=reason, evidence=evidence or {})


def judge(claimed: str, evidence: dict[str, dict[str, int]], why: str = "", most: bool = False) -> ExecutedPrecision:
    """The verdict from each source's counts of compute layers by precision (sources in order of
    preference): the claim holds in the first source that saw a compute layer run in it, or, with
    `most` (evidence that counts every compute layer of the model, not the primitives one call ran),
    that saw at least half of them run in it (llama.cpp's Q2_K keeps GPT-2's attention output and MLP
    down projections in Q3_K: half its matrices). `why` explains a fallback, when the backend knows."""
    wanted = CLAIMED_BUCKET[claimed]
    for source, counts in evidence.items():
        hits, total = counts.get(wanted, 0), sum(n for bucket, n in counts.items() if bucket != "other")
        if hits > 0 and (not most or 2 * hits >= total):
            return ExecutedPrecision(claimed, OK, source, dict(counts), dict(evidence))
        if hits > 0:
            share = f"{claimed} asked, {hits} of {total} compute layers ran in {wanted} ({source}: {describe(counts)})"
            return ExecutedPrecision(claimed, FALLBACK, source, dict(counts), dict(evidence), share)
    seen: dict[str, dict[str, int]] = {}
    for source, counts in evidence.items():
        # A layer of unknown type ("other", e.g. a TorchScript fusion group) is no evidence either way.
        known = {bucket: n for bucket, n in counts.items() if bucket != "other" and n > 0}
        if known:
            seen[source] = known
    if not seen:
        reason = "no convolution or matrix product of a known type was seen running"
        return ExecutedPrecision.unchecked(claimed, reason, dict(evidence))
    source, counts = next(iter(seen.items()))
    ran = "; ".join(f"{name}: {describe(c)}" for name, c in seen.items())
    none = f"0 of {sum(counts.values())} compute layers" if len(seen) == 1 else "none of the compute layers"
    reason = f"{claimed} asked, {none} ran in {wanted} ({ran}){f': {why}' if why else ''}"
    return ExecutedPrecision(claimed, FALLBACK, source, dict(counts), dict(evidence), reason)


def describe(counts: dict[str, int]) -> str:
    """{'f32': 3, 'int8': 1} -> '3 f32, 1 int8'."""
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n)


def check_precision(runner: Any, native_input: Any, claimed: str) -> ExecutedPrecision:
    """Ask the runner's probe what it executes (one call at most), timed; fp32 is not checked, and a
    probe that fails leaves the claim unchecked, with the error, rather than failing the trial."""
    if claimed not in CLAIMED_BUCKET:
        return ExecutedPrecision.unchecked(claimed, f"{claimed} is what everything falls back to: nothing to check")
    probe = getattr(runner, "probe", None)
    if probe is None:
        return ExecutedPrecision.unchecked(claimed, "this backend cannot tell what it executes")
    t0 = time.monotonic()
    try:
        record = probe(native_input, claimed)
    except Exception as exc:  # the check must never be what breaks a trial
        record = ExecutedPrecision.unchecked(claimed, f"the probe failed: {type(exc).__name__}: {exc}")
    return replace(record, probe_s=time.monotonic() - t0)


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
    import torch

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


# --- OpenVINO and ONNX Runtime: the runtime's own view of the compiled model -----------------------

OPENVINO_COMPUTE = {
    "Convolution",
    "GroupConvolution",
    "Deconvolution",
    "BinaryConvolution",
    "FullyConnected",
    "MatMul",
    "RNNSeq",
    "RNNCell",
    "ScaledDotProductAttention",
}
# Snippets: layers the CPU plugin fused into generated code (with few threads, a whole MLP), in the
# precision it generated them for; one counts when the layers it fused include a matrix product or a
# convolution (by their original names, which carry the operator's type), not for an eltwise chain.
_FUSED_COMPUTE = re.compile(r"MatMul|Conv|Gemm|FullyConnected|linear")


def openvino_counts(compiled: Any) -> dict[str, int]:
    """Compute layers of a compiled OpenVINO model by the precision the CPU plugin runs them in."""
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else ""
        fused = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
        if layer not in OPENVINO_COMPUTE and not (layer == "Subgraph" and _FUSED_COMPUTE.search(fused)):
            continue
        precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "other"
        counts[bucket_of(precision)] += 1
    return dict(counts)


ORT_INT8 = {
    "QLinearConv",
    "QLinearMatMul",
    "MatMulInteger",
    "ConvInteger",
    "QGemm",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "QAttention",
    "DynamicQuantizeLSTM",
    "QLinearConvTranspose",
}
ORT_FLOAT = {
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "FusedConv",
    "FusedGemm",
    "FusedMatMul",
    "Attention",
    "MultiHeadAttention",
    "LSTM",
    "GRU",
    "RNN",
}


def onnx_graph_counts(nodes: list[Any]) -> dict[str, int]:
    """Compute nodes of an (optimized) ONNX graph: quantized operators count as int8, float ones
    (left between QuantizeLinear/DequantizeLinear pairs when not fused) as f32."""
    counts: Counter[str] = Counter()
    for node in nodes:
        if node.op_type in ORT_INT8:
            counts["int8"] += 1
        elif node.op_type in ORT_FLOAT:
            counts["f32"] += 1
    return dict(counts)


# --- language models (torchao quantize_): the weight tensors of the layers ---------------------------

_INT4_NAME = re.compile(r"int4", re.IGNORECASE)


def weight_counts(model: Any) -> dict[str, int]:
    """Linear, convolution and transformers' Conv1D layers by the type of their weight: torchao's
    weight-only and dynamic quantization replace it with a quantized tensor subclass that picks the
    int8 / int4 kernels when the layer runs (no oneDNN primitive to see for weight-only int8), so that
    type is what runs; a plain float weight (quantization skipped the layer) runs float."""
    import torch

    counts: Counter[str] = Counter()
    for module in model.modules():
        # transformers' Conv1D (GPT-2's projections) is a Linear with a transposed weight: a compute layer
        transposed_linear = type(module).__name__ == "Conv1D" and hasattr(module, "nf")
        if isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) or transposed_linear:
            weight = module.weight
            counts[_weight_bucket(weight.data if isinstance(weight, torch.nn.Parameter) else weight)] += 1
    return dict(counts)


def _weight_bucket(tensor: Any) -> str:
    """A plain tensor by its type; a tensor subclass by its class name or range (int4), else by the
    tensors it holds (SmoothQuant wraps an int8 tensor in one that carries its scales)."""
    import torch

    if type(tensor) is torch.Tensor:
        return bucket_of(str(tensor.dtype))
    quant_max = getattr(tensor, "quant_max", None)
    if _INT4_NAME.search(type(tensor).__name__) or (isinstance(quant_max, int) and quant_max <= 15):
        return "int4"
    names = tensor.__tensor_flatten__()[0] if hasattr(tensor, "__tensor_flatten__") else []
    inner = {_weight_bucket(getattr(tensor, name)) for name in names if getattr(tensor, name, None) is not None}
    for bucket in ("int4", "int8"):
        if bucket in inner:
            return bucket
    return "int8" if "Quantized" in type(tensor).__name__ else "other"


def weight_probe(model: Any) -> Callable[[Any, str], ExecutedPrecision]:
    """A language model's probe: its layers' weight types (no call). Every compute layer of the model is
    counted, so the claim holds only where most of them hold quantized weights (not one output head)."""
    return lambda native_input, claimed: judge(claimed, {"layer weight types": weight_counts(model)}, most=True)


def gguf_probe(tensor_types: dict[str, int]) -> Callable[[Any, str], ExecutedPrecision]:
    """A llama.cpp model's probe: the GGUF's matrices by type (no call), counted over every one, so a
    K-quant whose rows were too short for its blocks (a fallback to Q5_0 or Q8_0) is a fallback here too."""
    counts: Counter[str] = Counter()
    for name, n in tensor_types.items():
        counts[bucket_of(name)] += n
    return lambda native_input, claimed: judge(claimed, {"GGUF tensor types": dict(counts)}, most=True)


def ir_weight_probe(weight_types: dict[str, int]) -> Callable[[Any, str], ExecutedPrecision]:
    """An OpenVINO IR's probe: its matrix products by weight type (NNCF's u8/i4 constants; no call),
    counted over every one, so NNCF keeping a matrix it cannot group in int8 is seen."""
    counts: Counter[str] = Counter()
    for name, n in weight_types.items():
        counts[bucket_of(name)] += n
    return lambda native_input, claimed: judge(claimed, {"IR weight types": dict(counts)}, most=True)

"""What a prepared model really executes, against the precision its configuration claims.

An int8 or bf16 configuration that silently runs fp32 kernels (a quantized program loaded without its
fusion passes, an OpenVINO model compiled in f32, an ONNX Runtime QDQ model left unfused, autocast that
never reaches a bf16 kernel) would win or lose for the wrong reason. Each backend reads what its
runtime executed, from the runtime itself where it says so, and counts it in its own folder:

- OpenVINO: the compiled model's runtime model (the precision each layer runs in: openvino/classify.py),
  or a language model's IR weight types (openvino/generate.py);
- ONNX Runtime: the session's optimized graph (quantized operators, or float ones between Q/DQ pairs:
  onnxruntime/classify.py);
- the torch backends: one call under oneDNN's verbose mode (the data types of the convolution and
  matrix-product primitives it ran) and under the torch profiler (the data types of the ATen
  convolution and matrix-product operators, innermost ones only: PyTorch's own kernels, e.g. bf16 on
  a CPU where oneDNN has none, do not go through oneDNN): torch_common.py;
- a language model: torchao's quantized weight tensors (generation/quantization.py), IPEX's linear
  layers (ipex/generate.py), the GGUF's tensor types (llamacpp/generate.py).

This module holds what they share: the data-type buckets, the verdict and its record.

Compute layers (convolutions, matrix products) are counted by the precision they ran in. A claim holds
when at least one of them ran in it (quantizers leave some layers in float on purpose); none is a
fallback; no compute layer seen at all, or a probe that cannot run, is `unchecked`, with the reason.
fp32 is what everything falls back to: it is not checked.
"""

from __future__ import annotations

import re
import time
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


# bits per weight of each bucket: a mix's compressed matrices must lie below its kept type ("other": unknown)
BUCKET_BITS = {"int2": 2, "int3": 3, "int4": 4, "int5": 5, "int6": 6, "int8": 8, "f16": 16, "bf16": 16, "f32": 32}


def judge_mix(claimed: str, counts: dict[str, int], source: str, details: dict[str, Any]) -> ExecutedPrecision:
    """A mixed-precision artifact (build details with `kept_layers`, `kept_type`, `compressed_layers`) holds
    when its matrices are exactly the mix asked: the kept ones and the output layer (`output_matrices`, 1 unless
    the file reuses the embedding) in the kept type's bucket, every other one in a narrower bucket (a
    compressed matrix the quantizer left wide, as torchao leaves a Linear its group does not divide, fails);
    `counts` are the matrices by bucket."""
    kept_bucket = CLAIMED_BUCKET.get(details["kept_type"]) or bucket_of(details["kept_type"])
    output = int(details.get("output_matrices", 1))  # 0: a tied output layer the file does not hold apart
    asked = {kept_bucket: len(details["kept_layers"]) + output, "compressed": int(details["compressed_layers"])}
    kept_bits = BUCKET_BITS.get(kept_bucket, 0)
    narrower = sum(n for b, n in counts.items() if b != kept_bucket and BUCKET_BITS.get(b, 99) < kept_bits)
    ran = {kept_bucket: counts.get(kept_bucket, 0), "compressed": narrower}
    evidence = {source: dict(counts)}
    if ran == asked and sum(counts.values()) == sum(asked.values()):
        return ExecutedPrecision(claimed, OK, source, dict(counts), evidence)
    reason = f"{claimed} mix asked {asked}, the file holds {describe(counts)}"
    return ExecutedPrecision(claimed, FALLBACK, source, dict(counts), evidence, reason)

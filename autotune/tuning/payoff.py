"""The order of the coverage round: what is likely to win on this machine is measured first.

A search with a short budget on a heavy model may not get through one trial per backend x precision,
so the round is ordered by expected payoff, from the CPU's instruction sets and the task, never from a
measurement (there is none yet). The rule, in tiers (a lower tier runs first):

- **Classifiers and encoders** (one forward pass, compute-bound): int8 is tier 0 where the CPU has
  int8 dot products (AVX512-VNNI, AVX-VNNI or AMX-INT8), tier 1 otherwise (int8 still moves a quarter of
  fp32's bytes), except for a model whose convolutions and linear layers reduce shallowly (fewer than
  SHALLOW_REDUCTION multiply-adds per output element, measured by the reference process): there int8
  without dot products is expected to lose (tier 3), since its gain is in the reduction while every
  output is requantized. On an AVX2-only EPYC, mobilenet_v3_large (49) ran ONNX Runtime's int8 at 0.85x
  eager fp32 and 0.27x ONNX Runtime's fp32, its three other int8 families were pruned on drift (random
  weights), and the four trials took 3.8 minutes of a 20-minute search before the first fp32 family ran;
  efficientnet_b0's (57) four int8 families were all pruned on drift there (random weights: no speed
  measured), and its winner was ONNX Runtime's fp32, while resnet50 (368) and vit_b_16 (1221) won with
  int8 there (docs/manual/benchmarks-log.md). The family still runs, among those expected to lose (after the
  layout round where one runs). bf16 is tier 0 where the CPU has AMX-BF16 tiles, tier 1 (after int8) where it has
  AVX512-BF16 alone: there an int8 dot product (VNNI) does twice a bf16 one's work per instruction,
  and resnet50's bf16 measured 3.6x eager fp32 against int8's 6.8x (OpenVINO, an AMD EPYC) and 1.0x
  against 7.3x (a Xeon without AMX; docs/manual/benchmarks-log.md); last (tier 3) where it is emulated; other
  fp32 backends are tier 2 (the baseline already measures fp32).
- **Text generation** (decode is memory-bound: every token reads all weights; the coverage round runs
  the most sequences, tuning/layouts.coverage_batch): bf16 is tier 0 where the CPU has AMX-BF16 tiles
  (the prompt's prefill runs on them, and each decode step reads half fp32's bytes), tier 1 where it has
  AVX512-BF16 alone, 3 where emulated. Where the CPU has int8 dot products (AVX512-VNNI, AVX-VNNI or
  AMX-INT8), int8 activations with int8 weights (da8w8, SmoothQuant) compiled by inductor are tier 0 too:
  inductor lowers the quantized GEMMs to kernels on those instructions. A 100M-parameter decoder with
  512-token prompts on a Xeon with AMX, 8 sequences as 2 x 1: inductor bf16 349.9 tokens/s, eager bf16
  270.5, inductor da8w8 215.9, against the eager fp32 baseline's 34.1 at one sequence (at one sequence
  inductor's int8 activations decoded garbage there). Inductor's weight-only int8 is tier 1 (compiled
  with freezing it ran at 1.11x eager fp32 on an AVX2-only EPYC and led the families measured there),
  fp32 tier 2. Expected to lose on every CPU (tier 3, after the layout round): eager's int8 (weight-only,
  da8w8, SmoothQuant), which decoded slower than eager bf16 or fp32 on every CPU recorded (the Xeon with
  AMX at 8 sequences as 1 x 2: weight-only 89.4 tokens/s (a search's trial) and 61.8
  (docs/benchmarks/generation_precisions.py) with fp32 activations, 105.9 with bf16 ones, da8w8 125.3, eager bf16
  183.3-221.2; on an EPYC with VNNI stopped at screening; on an AVX2-only EPYC
  da8w8 at 0.14-0.15x eager fp32 and weight-only int8 at 0.42-0.66x, three eager int8 trials taking 9.5
  minutes of a 60-minute search before inductor's ran); and int4 weights, whose prompt prefill runs
  torchao's CPU int4 kernel: with bf16 activations (A16W4) it decodes as fast as bf16 or faster, but a
  512-token prefill at 8 sequences took 4.2 s in eager and 4.0 s compiled against bf16's 0.7 and 0.6 (the
  Xeon with AMX: 82.2 and 101.7 tokens/s against eager bf16's 174.8 and inductor bf16's 285.7). With fp32
  activations, the kernel's slow path, the trials took minutes before anything was timed (eager's 9.6 at
  8 sequences on the Xeon with AMX, 7 without a timed window on the AVX2-only EPYC). Without int8
  dot products int8 activations are expected to lose too (da8w4 by the same reasoning, not measured),
  since the prompt's prefill is compute-bound (the AVX2-only EPYC: SmoothQuant 0.16x eager fp32, the
  recipe compiled by inductor with max-autotune and freezing 0.15x, each prefill about 20-26x fp32's).
- **Text generation's engine round** comes before all of that: one family per engine (eager, inductor,
  torchao, OpenVINO, llama.cpp, IPEX: torchao apart from the backend that runs its quantized precisions),
  its first in the order above, for each engine the baseline does not already measure, the cheapest to
  prepare first (engine_round). A 15-minute search of a 105M decoder on a 2-core EPYC (Zen 4) ran six
  trials in the payoff order alone, none of them on llama.cpp or IPEX, so its user never learned whether
  the engine most CPU LLM users start from wins there. The int4 rule above is torchao's kernel: llama.cpp's,
  OpenVINO's and IPEX's int4 are their own kernels and tier 1, like int8 weights (llama-batched-bench on
  a 2-core EPYC with AVX-512 measured Q4_0 ahead of BF16 and Q8_0). The layout round waits for the engine
  round (tuning/layouts.py).
- Within a tier, backends whose preparation costs little go first (eager, then ONNX Runtime,
  OpenVINO, torchao, IPEX, and inductor, whose compile is the slowest), except a classifier's int8:
  OpenVINO's first. In the offline searches recorded (docs/manual/benchmarks-log.md) where its int8 passed the
  drift bound, it was the fastest int8 family at one instance or within 2% of it, and it prepares in
  less time than IPEX (its own runtime) or torchao (a compile), while ONNX Runtime's int8, cheaper to
  prepare, was slower: resnet50 on a Xeon with VNNI, OpenVINO 149.6 samples/s, IPEX 142.7, ONNX
  Runtime (static) 30.4; on an AVX2-only EPYC, IPEX 32.1, OpenVINO 31.5, torchao 30.1, ONNX Runtime
  14.6; vit_b_16 on an EPYC with VNNI, OpenVINO 12.6, ONNX Runtime (dynamic) 11.8, torchao 6.5, IPEX
  5.9. The leader the layout round refines is then found a trial earlier. A model with attention layers
  on a CPU without int8 dot products starts with ONNX Runtime's instead: there both quantizers keep
  7-bit weights, and vit_b_16 on an AVX2-only EPYC ran ONNX Runtime's dynamic int8 at 5.0 samples/s
  against NNCF's transformer scheme's 2.8 (batch 8, one instance; prepared in 53 s against 108 s).
  The reference process counts the attention layers (`attention_layers` in the study's attributes).

A coverage trial runs each backend option at the space's first value, except where the CPU decides what
the backend picks by itself (coverage_preferences): OpenVINO's int8 on a CPU with AMX-BF16 tiles runs
its float layers in bf16, as OpenVINO does there unless told otherwise. A language model's OpenVINO
family is covered twice where the CPU computes bf16 natively: as the plugin runs it by itself (bf16
activations, GenAI's own benchmark's setting) and at the space's first (f32), adjacent in the engine
round, since which one wins turns on the workload (`Preference.alongside`).

Studies already run on this machine come first when the storage holds them (tuning/priors.py): a
family that beat its study's baseline there goes ahead of every tier (the faster, the earlier), one
that did not goes last. Each coverage trial records its place and the reason (`order` in its user
attributes). Where the layout round runs (tuning/layouts.py), the families expected to lose (tier 3
and 4) wait until after it: on an AVX2-only EPYC the four emulated bf16 trials of mobilenet_v3_large
took 2.3 minutes (three pruned at screening, OpenVINO's fell back to f32) before the leader's
two-instance split could run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.backends import TORCHAO_HOSTS, backend_specs, engine_of
from autotune.backends.base import LAST
from autotune.backends.precision import CLAIMED_BUCKET
from autotune.common.cpuinfo import BF16_TILES, INT8_DOT
from autotune.tuning.space import family

NATIVE = {"bf16": ("avx512_bf16", "amx_bf16")}
# A classifier's compute-bound bf16 pays where the CPU has tiles for it; vector bf16 alone does not.
TILES = {"bf16": BF16_TILES}
# A classifier's int8 backend that goes first in its tier (see the module docstring for the measurements),
# and a model's with attention layers on a CPU without int8 dot products.
CLASSIFIER_INT8_FIRST = "openvino"
ATTENTION_INT8_FIRST_WITHOUT_DOT = "onnxruntime"
INT8_FIRST_WHY = {
    CLASSIFIER_INT8_FIRST: "OpenVINO's first of its tier: the fastest classifier int8 in the studies recorded",
    ATTENTION_INT8_FIRST_WITHOUT_DOT: (
        "ONNX Runtime's first of its tier: for attention layers without int8 dot products, faster than NNCF's"
    ),
}
# Text generation's precisions that quantize activations too: inductor turns them into int8 GEMMs.
DYNAMIC_INT8 = ("da8w8", "smoothquant_int8")
# ... and every precision with int8 activations (da8w4's weights are int4)
INT8_ACTIVATIONS = (*DYNAMIC_INT8, "da8w4")
# emulated precisions, without int8 dot products a shallow model's int8 and text generation's int8 activations,
# and text generation's eager int8 and int4 weights on every CPU (3); families slower than fp32 eager in an
# earlier study (4)
LATE_TIER = 3
# Multiply-adds per output element of the convolutions and linear layers (torch_common.with_reduction_depth)
# under which a classifier's int8 without int8 dot products is expected to lose. Counted on torchvision's
# models at 224x224: mobilenet_v3_large 49, efficientnet_b0 57, regnet_y_400mf 103 below it; convnext_tiny
# 332, resnet50 368, vit_b_16 1221 above (only the four searched in docs/manual/benchmarks-log.md were measured).
SHALLOW_REDUCTION = 128


@dataclass(frozen=True)
class Preference:
    """A backend option's value for its coverage trial other than the space's first, and why."""

    value: Any
    why: str
    # why the space's first value is covered too, right after this one (same family, in the engine round),
    # where which of the two wins depends on the workload, not on the CPU alone ("": it is not)
    alongside: str = ""


def coverage_preferences(isa: dict[str, bool]) -> dict[tuple[str, str], Preference]:
    """The (backend, option) values a coverage trial runs with on this CPU instead of the space's first:
    what the backend picks by itself here. OpenVINO runs an int8 IR's float layers (those NNCF leaves
    unquantized: a transformer's softmax, layer norms and attention matmuls) in bf16 by itself on a CPU
    with AMX-BF16 tiles; `int8_float=f32` (the space's first, for the drift quantization alone costs)
    makes it run them in f32. On a 2-core Xeon with AMX (`autotune bench`, batch 8, 1 x 2, medians of 3
    interleaved runs), vit_b_16's OpenVINO int8 ran at 43.4 samples/s with f32, the coverage trial's
    then, and 56.2 with bf16 (1.30x; a 20-minute search had found bf16 at 54% of its budget); resnet50,
    a CNN with little left in float, at 419.5 and 412.2 (0.98x, the runs overlapping) (docs/manual/benchmarks-log.md).
    A language model's weight-only int8 and int4 take their activations in bf16 (the space's first) where
    the CPU computes bf16 natively, and in fp32 where it would emulate it: there bf16 is expected to lose
    (tier 3), and inductor's weight-only int8, which led an AVX2-only EPYC's search at 1.11x eager fp32, was
    measured with fp32 activations."""
    if not any(isa.get(flag) for flag in NATIVE["bf16"]):
        why = f"activations=fp32: no native bf16 here ({' or '.join(NATIVE['bf16'])}), so bf16 ones would be emulated"
        return {(backend, "activations"): Preference("fp32", why) for backend in ("eager", "inductor")}
    native = ", ".join(flag for flag in NATIVE["bf16"] if isa.get(flag))
    hint = Preference("bf16", GENAI_HINT_WHY.format(native), alongside=GENAI_F32_WHY)
    preferences = {("openvino", "inference_precision"): hint}
    if isa.get(TILES["bf16"]):
        why = f"int8_float=bf16: what OpenVINO runs the float layers in by itself on this CPU ({TILES['bf16']})"
        preferences["openvino", "int8_float"] = Preference("bf16", why)
    return preferences


# Measured on a 2-core Xeon with AMX, the 105M decoder (8 layers), prompt 512, 64 new tokens, one interleaved
# run (docs/results/engines-2026-11-29.json): autotune's OpenVINO int8_asym with f32 activations made 125.1
# tokens/s at 1 sequence against GenAI's benchmark's 104.1 (the plugin's bf16: 1.20x), and 245.6 against
# 288.6 at 8 sequences (0.85x), where the prompts' prefill (8 x 512 tokens) is what bf16 tiles speed up.
GENAI_HINT_WHY = (
    "inference_precision=bf16: what OpenVINO's CPU plugin runs by itself on this CPU ({}), as GenAI's own "
    "benchmark does"
)
GENAI_F32_WHY = (
    "inference_precision=f32, the space's first (int8 activations for int8 weights), right after bf16: it "
    "generated 1.20x faster at 1 sequence on a Xeon with AMX and 0.85x at 8"
)


@dataclass(frozen=True)
class Payoff:
    """Where a backend x precision stands in the coverage round, and why."""

    tier: int
    reason: str


def _kind(precision: str) -> str:
    """A precision's family (int4, int8, bf16; fp32 for the rest), as the precision check counts it."""
    return CLAIMED_BUCKET.get(precision, "fp32")


def expected_payoff(
    backend: str, precision: str, isa: dict[str, bool], task: str = "classify", reduction_depth: float | None = None
) -> Payoff:
    """The tier of one backend x precision on a CPU with these ISA flags, for a model whose layers reduce
    over `reduction_depth` multiply-adds per output (None: not measured; see the module docstring)."""
    kind = _kind(precision)
    have = [flag for flag in INT8_DOT if isa.get(flag)]
    if task == "generate":
        if backend == "inductor" and precision in DYNAMIC_INT8 and have:
            return Payoff(
                0, f"int8 activations and weights compiled by inductor: int8 GEMMs on this CPU's {', '.join(have)}"
            )
        if precision in INT8_ACTIVATIONS and not have:
            return Payoff(
                LATE_TIER,
                "int8 activations expected to lose: no int8 dot products here, so the prompt's compute-bound "
                "prefill runs its int8 GEMMs slower than fp32's",
            )
        if backend == "eager" and kind == "int8":
            return Payoff(
                LATE_TIER,
                "eager's int8 expected to lose: it decoded slower than eager bf16 or fp32 on every CPU recorded",
            )
        if kind == "int4" and backend in TORCHAO_HOSTS:
            return Payoff(
                LATE_TIER,
                "torchao's int4 weights expected to lose: the prompt's prefill runs its CPU int4 kernel, 5.6-6.8x "
                "bf16's time on a Xeon with AMX",
            )
        if kind == "int4":
            return Payoff(1, "int4 weights in the engine's own kernels: decoding reads a quarter of bf16's bytes")
        if kind == "int8":
            return Payoff(1, "int8 weights: decoding reads half the bytes of bf16 per token")
    elif kind == "int8":
        if have:
            return Payoff(0, f"int8 first: the CPU has int8 dot products ({', '.join(have)})")
        if reduction_depth is not None and reduction_depth < SHALLOW_REDUCTION:
            return Payoff(
                LATE_TIER,
                f"int8 expected to lose: no int8 dot products here, and the model's layers reduce over "
                f"{reduction_depth:.4g} multiply-adds per output (under {SHALLOW_REDUCTION})",
            )
        return Payoff(1, "int8 second: no VNNI/AMX int8 dot products, but a quarter of fp32's memory traffic")
    if kind in NATIVE:
        native = [flag for flag in NATIVE[kind] if isa.get(flag)]
        if native and isa.get(TILES[kind]):
            return Payoff(0, f"{kind} native on this CPU ({', '.join(native)})")
        if native and task == "generate":
            return Payoff(1, f"{kind} native on this CPU ({', '.join(native)})")
        if native:
            return Payoff(1, f"{kind} after int8: {', '.join(native)} without {TILES[kind]} tiles")
        return Payoff(3, f"{kind} last: no native {kind} instructions here ({' or '.join(NATIVE[kind])}), emulated")
    return Payoff(2, "fp32 after the reduced precisions: the baseline already measures fp32")


def _within_tier_rank(backend: str, precision: str, task: str, int8_first: str | None) -> int:
    """Place inside a tier: a classifier's `int8_first` backend's int8 first, then the cheaper preparation
    (each SPEC's prepare_cost: nothing to build, a graph export, an IR conversion, quantize_, IPEX's
    optimize/trace, and torch.compile's code generation)."""
    if task != "generate" and _kind(precision) == "int8" and backend == int8_first:
        return -1
    spec = backend_specs(task).get(backend)
    return spec.prepare_cost if spec is not None else LAST


def int8_first_backend(isa: dict[str, bool], attention_layers: int | None) -> str:
    """The int8 backend a classifier's coverage starts its tier with: OpenVINO's, but ONNX Runtime's
    dynamic int8 for a model with attention layers on a CPU without int8 dot products, where both keep
    7-bit weights and NNCF's transformer scheme ran slower (see the module docstring)."""
    if attention_layers and not any(isa.get(flag) for flag in INT8_DOT):
        return ATTENTION_INT8_FIRST_WITHOUT_DOT
    return CLASSIFIER_INT8_FIRST


def prior_payoff(speedup: float, study: str) -> Payoff:
    """A family measured before on this machine (tuning/priors.py): ahead of every ISA tier when it beat
    its study's baseline, the faster the earlier; behind them all when it did not."""
    if speedup >= 1.0:
        return Payoff(-1, f"prior: {speedup:.2f}x its baseline in study {study} on this machine")
    return Payoff(4, f"prior: {speedup:.2f}x its baseline in study {study} on this machine, slower than fp32 eager")


@dataclass(frozen=True)
class CoveragePlan:
    """One coverage trial: its parameters, its tier and why it runs where it does (its `order`);
    `engine_round`: the most promising family of an engine not yet measured (text generation), run before
    every other coverage trial and before the layout round."""

    params: dict[str, Any]
    tier: int
    order: str
    engine_round: bool = False

    @property
    def expected_to_lose(self) -> bool:
        """Emulated precision, a shallow model's int8 or a language model's int8 activations without int8 dot
        products, a language model's eager int8 or int4 weights, or slower than fp32 eager in an earlier
        study here: measured
        after the layout round (tuning/layouts.py), which refines a likely winner instead."""
        return self.tier >= LATE_TIER


def order_by_payoff(
    plans: list[dict[str, Any]],
    isa: dict[str, bool],
    task: str,
    family_speedups: dict[tuple[str, str], tuple[float, str]] | None = None,
    int8_first: str | None = CLASSIFIER_INT8_FIRST,
    reduction_depth: float | None = None,
    preferences: dict[tuple[str, str], Preference] | None = None,
    measured_engines: set[str] | None = None,
) -> list[CoveragePlan]:
    """The coverage plans, highest expected payoff first, each with why it is where it is: families
    measured before on this machine by their speedup there, the others by the ISA rule. Stable: plans
    of the same tier and backend keep the space's order. `int8_first=None` orders a classifier's int8
    by preparation cost alone (the replay benchmark compares the two); `reduction_depth` is the model's
    (backends/torch_common.with_reduction_depth; None: not measured); a plan holding one of `preferences`'
    values (coverage_preferences) says so in its order. Text generation starts with the engine round
    (engine_round; `measured_engines`: those the baseline or earlier trials already measure)."""
    measured_engines = measured_engines if measured_engines is not None else {"eager"}
    alongside = {key: preference.value for key, preference in (preferences or {}).items() if preference.alongside}
    # the families covered at a preferred value too: only there is a plan at another value its twin (a space
    # that lists the space's first value alone covers its families at it, once)
    doubled = {family(params) for params in plans if _holds_preferred(params, alongside)}
    ranked = []
    for index, params in enumerate(plans):
        backend = params["backend"]
        precision = params[f"{backend}.precision"]
        known = (family_speedups or {}).get((backend, precision))
        payoff = prior_payoff(*known) if known else expected_payoff(backend, precision, isa, task, reduction_depth)
        # faster before, or by the within-tier rule
        within = -known[0] if known else _within_tier_rank(backend, precision, task, int8_first)
        reason = (
            f"{payoff.reason}; {INT8_FIRST_WHY[backend]}"
            if not known and within == -1 and backend in INT8_FIRST_WHY
            else payoff.reason
        )
        for (option_backend, option), preference in (preferences or {}).items():
            value = params.get(f"{backend}.{option}")
            if option_backend == backend and value == preference.value:
                reason = f"{reason}; {preference.why}"
            elif option_backend == backend and preference.alongside and family(params) in doubled:
                reason = f"{reason}; {preference.alongside}"
        ranked.append((payoff.tier, within, index, params, reason))
    ranked.sort(key=lambda item: item[:3])
    firsts = engine_round(ranked, task, measured_engines, set(alongside)) if task == "generate" else []

    def dropped_twin(params: dict[str, Any]) -> bool:
        """A twin at the space's first value runs in the engine round only: the sampler explores it elsewhere."""
        return family(params) in doubled and not _holds_preferred(params, alongside)

    ranked = [*firsts, *(item for item in ranked if item not in firsts and not dropped_twin(item[3]))]
    return [
        CoveragePlan(
            params,
            tier,
            f"coverage {place + 1}/{len(ranked)}, tier {tier}: {reason}"
            + (f"; {ENGINE_ROUND_WHY}" if place < len(firsts) else ""),
            engine_round=place < len(firsts),
        )
        for place, (tier, _, _, params, reason) in enumerate(ranked)
    ]


ENGINE_ROUND_WHY = (
    "its engine's most promising family here, in the engine round: one per engine first, the cheapest to prepare first"
)


def engine_round(
    ranked: list[tuple[Any, ...]], task: str, measured: set[str], alongside: set[tuple[str, str]] | None = None
) -> list[tuple[Any, ...]]:
    """Text generation: the first family of each engine in the payoff order (its most promising here), for
    the engines no trial measures yet (`measured`: the baseline's eager), cheapest preparation first, then
    the higher payoff. A user with a short budget learns what every engine makes on their machine: a
    15-minute search of a 105M decoder on a 2-core EPYC ran six trials in the payoff order, none on
    llama.cpp (its int4 was expected to lose, as torchao's is) or IPEX. A first's twins (the same family at
    another value of an `alongside` option: Preference.alongside) run right after it."""
    firsts: dict[str, tuple[Any, ...]] = {}
    twins: dict[str, list[tuple[Any, ...]]] = {}
    for item in ranked:
        params = item[3]
        backend = params["backend"]
        engine = engine_of(backend, params[f"{backend}.precision"], task)
        if engine in measured:
            continue
        if engine not in firsts:
            firsts[engine] = item
        elif _twins(firsts[engine][3], params, alongside or set()):
            twins.setdefault(engine, []).append(item)
    specs = backend_specs(task)

    def cost(item: tuple[Any, ...]) -> tuple[int, int, int]:
        spec = specs.get(item[3]["backend"])
        return (spec.prepare_cost if spec is not None else LAST, item[0], item[2])

    ordered = sorted(firsts.items(), key=lambda pair: cost(pair[1]))
    return [each for engine, item in ordered for each in (item, *twins.get(engine, []))]


def _holds_preferred(params: dict[str, Any], alongside: dict[tuple[str, str], Any]) -> bool:
    """Does a plan hold an `alongside` option at its preferred value?"""
    backend = params["backend"]
    return any(
        params.get(f"{backend}.{option}") == preferred
        for (option_backend, option), preferred in alongside.items()
        if option_backend == backend
    )


def _twins(first: dict[str, Any], other: dict[str, Any], alongside: set[tuple[str, str]]) -> bool:
    """Do two plans differ only in options covered alongside (Preference.alongside)?"""
    backend = first["backend"]
    loose = {f"{option_backend}.{option}" for option_backend, option in alongside if option_backend == backend}
    differing = {key for key in first.keys() | other.keys() if first.get(key) != other.get(key)}
    return bool(differing) and differing <= loose

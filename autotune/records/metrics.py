"""What a trial measured, as typed records: one instance's result (the worker's JSON) with the checks
of its environment, what it reported at the ready barrier, the artifact it used, the trial's aggregated
metrics (stored as the trial's user attributes, under the field names best.json and older studies use),
the screening measurement, and one run of the finalist round.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from autotune.backends.precision import ExecutedPrecision
from autotune.common.json_record import FORMAT, OpenRecord, Record, RecordError
from autotune.machine.runtimes import RuntimeRecord
from autotune.measure.drift import Drift
from autotune.measure.llm_serving import LlmServerMetrics
from autotune.measure.noise import WindowSignals
from autotune.measure.serving import RELATIVE_TOLERANCE, ServerMetrics
from autotune.measure.speed_gate import GateVerdict
from autotune.measure.stopwatch import LatencySummary
from autotune.records.reference import RESULT_FORMAT, CalibrationSet


# ---- what a worker checked of its own environment ------------------------------------------------------
@dataclass(frozen=True)
class AllocatorCheck(Record):
    """The allocator asked for, LD_PRELOAD as the process saw it, the allocator libraries mapped, and
    whether they agree."""

    asked: str
    ld_preload: str = ""
    mapped: list[str] = field(default_factory=list)
    verified: bool = False


@dataclass(frozen=True)
class ThreadsCheck(Record):
    """The thread count asked for, torch's, and OMP_NUM_THREADS as the process saw it."""

    asked: int
    torch: int | None = None
    OMP_NUM_THREADS: str | None = None


@dataclass(frozen=True)
class OpenMPCheck(Record):
    """The OpenMP runtime asked for, the Intel and GNU OpenMP libraries mapped once torch was loaded, and
    the variables that tune them, as the process saw them."""

    asked: str
    intel: list[str] = field(default_factory=list)
    gnu: list[str] = field(default_factory=list)
    KMP_AFFINITY: str | None = None
    KMP_BLOCKTIME: str | None = None
    THP_MEM_ALLOC_ENABLE: str | None = None


@dataclass(frozen=True)
class ReadyReport(Record):
    """What an instance says at the ready barrier: its drift (instance 0, when it measured one), whether the
    speed gate found it too slow, and what reaching the barrier cost (loading, first call, warm-up)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"drift": Drift, "too_slow": GateVerdict}
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("too_slow",)

    pid: int
    drift: Drift | None = None
    too_slow: GateVerdict | None = None  # a drift measured before a warm-up that tripped is kept
    load_s: float = 0.0
    first_call_s: float = 0.0
    warmup_s: float = 0.0


@dataclass(frozen=True)
class PrepareResult(Record):
    """What the process that built a backend's artifact reports (its result JSON; the artifact's meta.json
    keeps its time, details and calibration)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"calibration": CalibrationSet}

    format: str = field(default=RESULT_FORMAT, kw_only=True, metadata=FORMAT)
    pid: int
    prepare_s: float
    # What the backend reports of what it built (exporter, quantization, ...): each backend's own keys.
    details: dict[str, Any] = field(default_factory=dict)
    calibration: CalibrationSet | None = None


@dataclass(frozen=True)
class ArtifactUse(OpenRecord):
    """The backend artifact a trial used: where it is, whether the cache had it (`prepare_s` 0) or this trial
    built it, how long building it took when cached (`built_in_s`), what the backend said of it, and the
    least recently used artifacts evicted to keep the cache under its cap."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("built_in_s", "evicted")

    dir: str
    cached: bool
    prepare_s: float
    built_in_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)  # as PrepareResult.details
    evicted: list[str] | None = None


@dataclass(frozen=True)
class InstanceScreen(Record):
    """One instance's short screening window (speed pruning looks at it before the full window)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"latency_ms": LatencySummary}

    throughput_sps: float
    latency_ms: LatencySummary
    stamps_path: str | None = None  # the screening window's [start, end] per call
    samples_per_call: int = 1


@dataclass(frozen=True)
class InstanceResult(Record):
    """What one trial process reports for its instance (python -m autotune.worker JOB.json)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "latency_ms": LatencySummary,
        "allocator": AllocatorCheck,
        "threads": ThreadsCheck,
        "openmp": OpenMPCheck,
        "drift": Drift,
        "noise": WindowSignals,
        "screening": InstanceScreen,
        "executed_precision": ExecutedPrecision,
        "server": ServerMetrics,
        "llm_server": LlmServerMetrics,
    }
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("warmup_children_cpu_s", "llm_server")

    format: str = field(default=RESULT_FORMAT, kw_only=True, metadata=FORMAT)
    pid: int
    instance: int
    cpus: list[int]
    torch: str
    load_s: float
    first_call_s: float
    iterations: int
    window_s: float
    samples_per_call: int
    throughput_sps: float
    latency_ms: LatencySummary
    stamps_path: str
    peak_rss_mib: float
    warmup_iters: int
    warmup_s: float
    warmup_steady: bool = False
    # CPU seconds the processes it started used during its warm-up, which ran until they went quiet
    warmup_children_cpu_s: float | None = None
    allocator: AllocatorCheck | None = None
    threads: ThreadsCheck | None = None
    openmp: OpenMPCheck | None = None
    python: str = ""
    drift: Drift | None = None
    noise: WindowSignals | None = None
    screening: InstanceScreen | None = None
    startup_to_ready_s: float | None = None
    # What the backend reports it compiled (effective streams, precision, ...): each backend's own keys.
    backend_details: dict[str, Any] | None = None
    executed_precision: ExecutedPrecision | None = None  # instance 0 only: what really ran, against the claim
    tokens_path: str | None = None  # generation: each timed call's token stamps, one row per call
    server: ServerMetrics | None = None  # the server scenario: the rate search (the same on every instance)
    llm_server: LlmServerMetrics | None = None  # a language model's server scenario: its server under load


@dataclass(frozen=True)
class InstanceShare(Record):
    """One instance inside a trial's metrics: its own numbers and its share of the common window."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "latency_ms": LatencySummary,
        "allocator": AllocatorCheck,
        "threads": ThreadsCheck,
        "openmp": OpenMPCheck,
        "noise": WindowSignals,
    }

    pid: int
    cpus: list[int]
    throughput_sps: float
    common_window_sps: float
    latency_ms: LatencySummary
    iterations: int
    window_s: float
    warmup_iters: int | None = None
    warmup_s: float | None = None
    allocator: AllocatorCheck | None = None
    threads: ThreadsCheck | None = None
    openmp: OpenMPCheck | None = None
    noise: WindowSignals | None = None


@dataclass(frozen=True)
class Screening(Record):
    """A trial's screening: its instances screened together, counted as the full measurement is
    (over their common window; `ci_rel` is the throughput interval's half-width, relative)."""

    throughput_sps: float
    p50_ms: float
    ci_rel: float | None
    calls: int


@dataclass(frozen=True)
class GenerationMetrics(Record):
    """A language model's trial, in its own terms, over the calls wholly inside the common window:
    time to first token (a call's prefill, to its first token), time per output token (each decode
    step), generated and prefilled tokens per second (all instances), and the weights' bytes."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"ttft_ms": LatencySummary, "tpot_ms": LatencySummary}

    ttft_ms: LatencySummary
    tpot_ms: LatencySummary
    tokens_per_s: float
    prefill_tokens_per_s: float
    prompt_tokens: int
    new_tokens: int
    sequences: int
    generation_ms_mean: float  # one call, start to last token: TTFT + (new_tokens - 1) x mean TPOT
    weight_bytes: int | None = None
    quantize_s: float | None = None


@dataclass(frozen=True)
class TrialBudget(Record):
    """Where one trial's wall time went, in seconds on the orchestrator's clock: from the trial's start
    to the ready barrier (the artifact built, processes started and loaded, the first call, which
    compiles for torch.compile backends, drift and warm-up), the screening window, and the full window
    (noisy repeats included). The part before the barrier is split by what the workers said: a trial
    that completed by its metrics, one pruned at or after the ready barrier by what its instances
    reported there (loading and warm-up) and the artifact's build; one that failed before it is
    `starting_s` beyond its preparation."""

    total_s: float
    starting_s: float = 0.0  # process starts, drift, barrier waits (all of before-timing when not split)
    preparing_s: float = 0.0  # the backend artifact (export, conversion, quantization) built for this trial
    loading_s: float = 0.0  # loading the model and its first call (the compile, for torch.compile)
    warmup_s: float = 0.0
    screening_s: float = 0.0
    measuring_s: float = 0.0


@dataclass(frozen=True)
class Attempt(Record):
    """One measurement attempt of a trial (a noisy one is repeated in fresh processes)."""

    throughput_sps: float
    noise_flags: list[str]


@dataclass(frozen=True)
class Warmup(Record):
    """The warm-up before the window, the shortest of the instances': calls and seconds; and the CPU seconds
    the processes the instances started used while it waited for them to go quiet (None: not recorded)."""

    iters: int = 0
    s: float = 0.0
    children_cpu_s: float | None = None

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("children_cpu_s",)


@dataclass(frozen=True)
class MachineLoad(Record):
    """The machine's runnable processes and load averages just before and after the measurement."""

    before: dict[str, float] | None = None
    after: dict[str, float] | None = None


@dataclass(frozen=True)
class Measurement(Record):
    """How the trial's numbers were obtained: the common window (all instances running), the calls
    wholly inside it (`calls`: what the percentiles are computed from), the samples it holds (calls
    cut by its edges count by the fraction inside), the confidence interval against its target, the
    warm-up, the clock, the noise checks and the attempts."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"attempts": Attempt, "warmup": Warmup, "machine": MachineLoad}

    common_window_s: float
    calls: int
    samples: int
    throughput_ci_rel: float | None  # half-width of the throughput's interval (throughput_ci_method), relative
    ci_confidence: float
    ci_target_rel: float
    ci_target_met: bool
    samples_per_call: int
    # False: no numactl or taskset here, so instances ran wherever the scheduler put them (and may have
    # shared cores): weaker evidence than a pinned measurement.
    pinned: bool = True
    throughput_ci_method: str = "median call time's interval applied to each instance's share"
    straggler_ratio: float | None = None
    # Several instances: the drift of the time per call from the first to the last third of the common
    # window, all instances together (stopwatch.combined_early_late); what the noise check judges them by.
    combined_early_late_rel: float | None = None
    warmup: Warmup = field(default_factory=Warmup)
    clock: str = "time.monotonic per call, input in, output out"
    stamps: list[str] = field(default_factory=list)
    machine: MachineLoad | None = None
    noise_flags: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)


@dataclass(frozen=True)
class TrialMetrics(Record):
    """Everything a completed measurement of one configuration says, stored field by field as the
    trial's user attributes (`to_json`), read back with `from_trial_attrs`."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "latency_ms": LatencySummary,
        "instances": InstanceShare,
        "measurement": Measurement,
        "screening": Screening,
        "drift": Drift,
        "executed_precision": ExecutedPrecision,
        "generation": GenerationMetrics,
        "server": ServerMetrics,
        "llm_server": LlmServerMetrics,
        "runtime": RuntimeRecord,
        "artifact": ArtifactUse,
    }
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("llm_server",)

    throughput_sps: float
    latency_ms: LatencySummary
    measurement: Measurement
    throughput_ci_sps: list[float] | None = None
    peak_rss_mib: float | None = None
    peak_rss_mib_total: float | None = None
    load_s: float | None = None
    first_call_s: float | None = None
    pids: list[int] = field(default_factory=list)
    drift: Drift | None = None
    torch_version: str | None = None
    backend_details: dict[str, Any] | None = None  # as InstanceResult.backend_details, instance 0's
    instances: list[InstanceShare] = field(default_factory=list)
    screening: Screening | None = None
    valid: bool = True
    runtime: RuntimeRecord | None = None  # the Python environment the trial ran in
    prepare_s: float = 0.0
    artifact: ArtifactUse | None = None
    # What the model really executed against the precision the config claims (backends/precision.py);
    # None in trials stored before it was checked.
    executed_precision: ExecutedPrecision | None = None
    generation: GenerationMetrics | None = None  # language models: TTFT, TPOT, tokens/s
    # The server scenario: the highest request rate sustained at the p99 bound, and the rate search's probes
    # (throughput_sps is then the closed-loop window that bounded it from above).
    server: ServerMetrics | None = None
    # A language model's server scenario: its engine's server (GenAI's continuous batching, llama-server) under
    # Poisson load, the highest rate whose TTFT and TPOT quantiles held (throughput_sps: the offline window's).
    llm_server: LlmServerMetrics | None = None

    @property
    def sustained_rps(self) -> float | None:
        """The server scenario's sustained request rate (None outside it)."""
        served = self.llm_server or self.server
        return None if served is None else served.sustained_rps

    @classmethod
    def from_trial_attrs(cls, attrs: dict[str, object], trial_number: int | None = None) -> TrialMetrics:
        """The metrics of a COMPLETE trial, from its stored user attributes."""
        try:
            return cls.from_json(attrs)
        except RecordError as exc:
            where = f"trial {trial_number}" if trial_number is not None else "a stored trial"
            raise RecordError(f"{where}: {exc}") from None

    @property
    def unit(self) -> str:
        """What throughput counts: generated tokens for a language model, samples otherwise."""
        return "tokens/s" if self.generation else "samples/s"

    @property
    def noise_flags(self) -> list[str]:
        return self.measurement.noise_flags

    def noisy_note(self) -> str:
        """'' for a clean measurement, else ' (noisy: reasons)' for a printed line."""
        return "" if self.valid else f" (noisy: {'; '.join(self.noise_flags)})"

    def with_changes(self, **changes: Any) -> TrialMetrics:
        return replace(self, **changes)


@dataclass(frozen=True)
class FinalistRun(Record):
    """One re-measurement of a candidate in the finalist round (or why it failed)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"drift": Drift}

    value: float | None = None
    valid: bool = False
    ci_rel: float | None = None
    noise_flags: list[str] = field(default_factory=list)
    drift: Drift | None = None
    calls: int | None = None
    window_s: float | None = None
    failed: str | None = None

    @classmethod
    def of(cls, value: float, metrics: TrialMetrics) -> FinalistRun:
        # A sustained rate is known to the rate search's tolerance, not to the closed-loop window's interval.
        ci_rel = RELATIVE_TOLERANCE if metrics.sustained_rps is not None else metrics.measurement.throughput_ci_rel
        return cls(
            value=value,
            valid=metrics.valid,
            ci_rel=ci_rel,
            noise_flags=metrics.noise_flags,
            drift=metrics.drift,
            calls=metrics.measurement.calls,
            window_s=metrics.measurement.common_window_s,
        )

"""best.json as a typed record: the winner (or, with `meets_drift: false`, the closest candidate), read
back by `autotune.search(...)` and by anyone holding the file.

The schema is documented in docs/manual/reference/best-json.md. Reading is strict about the fields every best.json has
(a missing one is one clear error naming it) and lenient about the rest: a field this autotune does
not know (a newer one wrote the file) is kept in `extra` and written back by `to_json`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from autotune.backends.precision import ExecutedPrecision
from autotune.common.json_record import OpenRecord, Record, RecordError
from autotune.machine.runtimes import RuntimeRecord
from autotune.measure.drift import Drift
from autotune.measure.llm_serving import LlmServerMetrics
from autotune.measure.serving import ServerMetrics
from autotune.measure.stopwatch import LatencySummary, MeasureSettings
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.records.fingerprint import Fingerprint
from autotune.records.job import WorkerJob
from autotune.records.metrics import (
    ArtifactUse,
    FinalistRun,
    GenerationMetrics,
    InstanceShare,
    Measurement,
    Screening,
)
from autotune.records.reference import CalibrationSet, EvaluationSet, ReferenceNote

SCHEMA_PREFIX = "autotune.best/"


@dataclass(frozen=True, kw_only=True)
class StudyInfo(OpenRecord):
    """Which study, and which of its trials, the file comes from."""

    name: str
    storage: str | None = None  # password hidden
    trial: int  # the winning (or closest) trial's number
    trials: dict[str, int] = field(default_factory=dict)  # per state: complete, pruned, fail, ...


@dataclass(frozen=True)
class ObjectiveInfo(OpenRecord):
    """What was optimised and the winner's value in its search trial (None for a closest candidate)."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("values",)

    name: str | None = None  # throughput, latency or pareto
    direction: str | list[str] = "maximize"
    value: float | None = None
    values: list[float] | None = None  # pareto: (samples/s, p99 ms)
    revalidated_median: float | None = None  # median of the winner's finalist runs


@dataclass(frozen=True)
class Launch(OpenRecord):
    """How to run the winner as tuned: one pinned command per instance."""

    pinning: str | None = None  # numactl, numactl-cpu, taskset or none
    pin_prefixes: list[list[str]] | None = None
    commands: list[str] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class Baseline(OpenRecord):
    """The eager fp32 baseline trial the speedup is measured against."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("sustained_rps",)

    NESTED: ClassVar[dict[str, type[Record]]] = {"config": TrialConfig, "latency_ms": LatencySummary}

    trial: int
    config: TrialConfig | None = None
    throughput_sps: float | None = None
    latency_ms: LatencySummary | None = None
    sustained_rps: float | None = None  # the server scenario: its sustained request rate


@dataclass(frozen=True)
class FinalistCandidate(OpenRecord):
    """One candidate of the finalist round: its interleaved runs and their spread (over the clean runs)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"config": TrialConfig, "runs": FinalistRun}

    trial: int
    winner: bool = False
    candidate: bool = True
    baseline: bool = False
    config: TrialConfig | None = None
    search_value: float | None = None
    values: list[float | None] = field(default_factory=list)
    runs: list[FinalistRun] = field(default_factory=list)
    median: float | None = None
    min: float | None = None
    max: float | None = None
    spread_rel: float | None = None
    noise_rel: float | None = None
    clean_runs: int | None = None
    eligible: bool = True


@dataclass(frozen=True)
class Finalists(OpenRecord):
    """The finalist round that chose the winner: every candidate's repeats and how it was decided."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"candidates": FinalistCandidate}

    selection: str = ""
    order: str | None = None
    repeats: int | None = None
    seconds: float | None = None
    left_out: list[int] = field(default_factory=list)  # candidates the time left had no room for
    candidates: list[FinalistCandidate] = field(default_factory=list)


@dataclass(frozen=True)
class ProbeSummary(OpenRecord):
    """One probe of the server scenario's rate search: offered and achieved rate, the requests' p50/p90/p99
    (and the p99's interval), the model's call time under that load, the queue at its start and end, and
    whether the rate counts as sustained (with why not)."""

    rate_rps: float
    achieved_rps: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    p99_ci_ms: list[float] | None = None
    requests: int | None = None
    call_mean_ms: float | None = None
    call_p99_ms: float | None = None
    queue_start: float | None = None
    queue_end: int | None = None
    sustained: bool = False
    why: str = ""


@dataclass(frozen=True)
class ServerSummary(OpenRecord):
    """The server scenario: the sustained rate at the bound, the batching policy and the rate search's probes."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"probes": ProbeSummary}

    sustained_rps: float
    slo_ms: float
    max_batch: int | None = None
    max_wait_ms: float | None = None
    upper_bound_rps: float | None = None
    batching: str | None = None
    routing: str | None = None
    rule: str | None = None
    probes: list[ProbeSummary] = field(default_factory=list)


@dataclass(frozen=True)
class ParetoPoint(OpenRecord):
    """One non-dominated clean trial of a Pareto study: its throughput and p99, and how to run it."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"config": TrialConfig}

    trial: int
    throughput_sps: float
    p99_ms: float
    config: TrialConfig | None = None
    config_summary: str | None = None


@dataclass(frozen=True)
class BestMetrics(OpenRecord):
    """The winner's metrics as best.json copies them from its trial (TrialMetrics' JSON, these fields in
    this order); a field a file written before it existed lacks reads as None, and is left out again."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "latency_ms": LatencySummary,
        "artifact": ArtifactUse,
        "measurement": Measurement,
        "instances": InstanceShare,
        "executed_precision": ExecutedPrecision,
        "screening": Screening,
        "generation": GenerationMetrics,
        "server": ServerMetrics,
    }

    throughput_sps: float | None = None
    latency_ms: LatencySummary | None = None  # p50, p90, p99, mean (ms) and samples
    peak_rss_mib: float | None = None
    peak_rss_mib_total: float | None = None
    prepare_s: float | None = None
    load_s: float | None = None
    first_call_s: float | None = None
    artifact: ArtifactUse | None = None
    measurement: Measurement | None = None
    instances: list[InstanceShare] | None = None
    torch_version: str | None = None
    backend_details: dict[str, Any] | None = None  # the backend's own report (TrialMetrics.backend_details)
    executed_precision: ExecutedPrecision | None = None
    screening: Screening | None = None
    valid: bool | None = None
    generation: GenerationMetrics | None = None
    server: ServerMetrics | None = None


# The trial metrics best.json copies into its `metrics` (results/best_json.py writes them, in this order).
METRIC_KEYS = tuple(f.name for f in BestMetrics.record_fields())


@dataclass(frozen=True)
class DriftReport(OpenRecord):
    """best.json's `drift`: every drift metric of the winner against FP32 (the Drift record's fields, inline;
    none when it measured none), the metric bounded with its drop and bound, and what drift was measured on
    (`reference`: set when the FP32 outputs were constant across inputs, saying what was done)."""

    FLATTENED: ClassVar[dict[str, type[Record]]] = {"measured": Drift}
    NESTED: ClassVar[dict[str, type[Record]]] = {
        "evaluation": EvaluationSet,
        "calibration": CalibrationSet,
        "reference": ReferenceNote,
    }

    measured: Drift | None = None
    metric: str | None = None
    drop: float | None = None
    max_drift: float | None = None
    relative: bool | None = None
    criterion: str | None = None  # in words
    data: str | None = None  # in words
    evaluation: EvaluationSet | None = None
    calibration: CalibrationSet | None = None
    reference: ReferenceNote | None = None


@dataclass(frozen=True)
class TotalBest(OpenRecord):
    """A generation study's best clean trial at one total of concurrent sequences."""

    total: int
    trial: int
    value: float  # tokens/s (or the study's primary value) of its search trial
    instances: int
    per_instance: int
    config: str  # its configuration in one line


@dataclass(frozen=True)
class SequencesSplit(OpenRecord):
    """A generation winner's workload: `total` concurrent sequences, split as `instances` x `per_instance`,
    and each total the study measured with its best (the winner is the fastest of them on the objective)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"by_total": TotalBest}

    total: int
    instances: int
    per_instance: int
    meaning: str  # "total": the study's sequences counted all instances; "per instance": stored before
    by_total: list[TotalBest] = field(default_factory=list)


@dataclass(frozen=True)
class MixSummary(OpenRecord):
    """A mixed-precision winner (`compressed_share` below 1): which matrices it keeps in the wider type, and
    what the file it ran holds."""

    compressed_share: float  # the share of the ranked weights in the low type (least sensitive first)
    low_type: str
    kept_type: str
    kept_layers: list[str]  # module names, most sensitive first
    compressed_layers: int
    sensitivity_method: str
    executed: dict[str, int]  # the file's matrices by type


@dataclass(frozen=True, kw_only=True)
class BestJson(OpenRecord):
    """The contents of a best.json (schema autotune.best/2, docs/manual/reference/best-json.md).

    A winner has `meets_drift` true, its `metrics`, `launch`, `job` and speedup; a file written when no
    configuration met the drift bound holds the closest candidate instead (`meets_drift` false, never
    timed: those fields are None and `selection` says so).
    """

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "study": StudyInfo,
        "objective": ObjectiveInfo,
        "server": ServerSummary,
        "llm_server": LlmServerMetrics,
        "pareto_front": ParetoPoint,
        "finalists": Finalists,
        "model": ModelSource,
        "config": TrialConfig,
        "runtime": RuntimeRecord,
        "launch": Launch,
        "job": WorkerJob,
        "metrics": BestMetrics,
        "measure_settings": MeasureSettings,
        "drift": DriftReport,
        "baseline": Baseline,
        "fingerprint": Fingerprint,
        "sequences": SequencesSplit,
        "mix": MixSummary,
    }
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = (
        "pareto_front",
        "speedup_source",
        "scenario",
        "server",
        "llm_server",
        "sequences",
        "mix",
    )

    schema: str
    created: str | None = None  # UTC time of writing (ISO 8601)
    meets_drift: bool
    study: StudyInfo
    objective: ObjectiveInfo
    selection: str  # why this trial won (or why there is no winner)
    scenario: str | None = None  # offline, single-stream or server (None in files written before it existed)
    server: ServerSummary | None = None  # the server scenario: sustained rate, bound, batching policy, probes
    # a language model's server scenario: the sustained rate within the TTFT and TPOT bounds, the saturated
    # throughput, the concurrency (the engine's slots) and every probe
    llm_server: LlmServerMetrics | None = None
    pareto_front: list[ParetoPoint] | None = None  # pareto studies: every non-dominated clean trial
    finalists: Finalists | None = None  # the finalist round, when one decided
    # how trials built the model (kind, name, input shape, weights); None: a study that stored none
    model: ModelSource | None
    config: TrialConfig
    runtime: RuntimeRecord | None = None  # the Python environment the winner ran in
    environment: dict[str, str] | None = None  # the variables the configuration sets
    launch: Launch | None = None
    job: WorkerJob | None = None  # what a worker needs to rebuild the winner
    metrics: BestMetrics | None = None  # throughput_sps, latency_ms, peak_rss_mib, measurement, ...
    measure_settings: MeasureSettings | None = None
    drift: DriftReport  # every drift metric against FP32, the one bounded, its drop and the bound
    baseline: Baseline | None = None
    speedup_vs_baseline: float | None = None
    speedup_source: str | None = None
    fingerprint: Fingerprint | None = None  # hardware, software, host
    sequences: SequencesSplit | None = None  # generation: the total sequences, their split, each total's best
    mix: MixSummary | None = None  # a mixed-precision winner: its kept layers and what its file holds

    @classmethod
    def from_json(cls, data: Any) -> BestJson:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise RecordError(f"best.json must be a JSON object, got {type(data).__name__}")
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in data]
        if missing:
            raise RecordError(
                f"best.json lacks its required {', '.join(repr(m) for m in missing)} "
                f"field{'s' if len(missing) > 1 else ''} (schema: docs/manual/reference/best-json.md)"
            )
        schema = data["schema"]
        if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
            raise RecordError(f"not an autotune best.json: schema is {schema!r}, expected {SCHEMA_PREFIX}N")
        try:
            return super().from_json(data)
        except RecordError as exc:
            message = str(exc)
            raise RecordError(message if message.startswith("best.json") else f"best.json: {message}") from None

    @classmethod
    def _load(cls, name: str, value: Any) -> Any:
        if name == "model" and value == {}:  # a study that stored no spec (made by hand) wrote no model
            return None
        return super()._load(name, value)

    @classmethod
    def read(cls, path: str | Path) -> BestJson:
        """Read a best.json file; a file that cannot be read or is not a best.json raises RecordError naming it."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise RecordError(f"cannot read {path}: {exc}") from None
        try:
            return cls.from_json(data)
        except RecordError as exc:
            raise RecordError(f"{path}: {exc}") from None

    # ---- conveniences --------------------------------------------------------------------------
    @property
    def timed(self) -> bool:
        """A timed winner (False: the closest candidate of a study where no configuration met the bound)."""
        return self.meets_drift and self.metrics is not None

    @property
    def trial(self) -> int:
        """The number of the winning (or closest) trial in the study."""
        return self.study.trial

    @property
    def throughput_sps(self) -> float | None:
        """The winner's samples per second in its search trial (None when it was never timed)."""
        return self.metrics.throughput_sps if self.metrics else None

    @property
    def throughput_unit(self) -> str:
        """What throughput counts: generated tokens for a language model, samples otherwise."""
        return "tokens/s" if self.metrics and self.metrics.generation else "samples/s"

    @property
    def latency_ms(self) -> LatencySummary | None:
        """The winner's latency per call: p50, p90, p99, mean (ms) and samples."""
        return self.metrics.latency_ms if self.metrics else None

    @property
    def throughput_ci_rel(self) -> float | None:
        """The relative half-width of the confidence interval of the winner's throughput in its search trial."""
        measurement = self.metrics.measurement if self.metrics else None
        return measurement.throughput_ci_rel if measurement else None

    @property
    def backend_details(self) -> dict[str, Any]:
        """What the backend reported it compiled for the winner (effective streams, precision, ...)."""
        return (self.metrics.backend_details if self.metrics else None) or {}

    @property
    def speedup(self) -> float | None:
        """Throughput over the eager fp32 baseline's (see `speedup_source` for how it was measured)."""
        return self.speedup_vs_baseline

    @property
    def drift_drop(self) -> float | None:
        """The winner's drop from FP32 on the bounded drift metric."""
        return self.drift.drop

    @property
    def max_drift(self) -> float | None:
        return self.drift.max_drift

    @property
    def reference_note(self) -> ReferenceNote | None:
        """Set when the FP32 outputs were constant across inputs: what drift was measured on instead."""
        return self.drift.reference

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
from typing import Any, ClassVar, TypeVar

from autotune.common.json_record import Record, RecordError
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.reference import ReferenceNote

SCHEMA_PREFIX = "autotune.best/"
OpenT = TypeVar("OpenT", bound="OpenRecord")


@dataclass(frozen=True)
class OpenRecord(Record):
    """A record that keeps the fields it does not know in `extra`, and writes them back.

    `OMIT_IF_NONE`: fields best.json only has in some files (e.g. `pareto_front`), left out when None."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ()

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False, compare=False)

    @classmethod
    def from_json(cls: type[OpenT], data: Any) -> OpenT:
        record = super().from_json(data)
        if isinstance(data, dict):
            known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
            record = dataclasses.replace(record, extra={k: v for k, v in data.items() if k not in known})
        return record

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.pop("extra", None)
        for name in self.OMIT_IF_NONE:
            if data.get(name) is None:
                data.pop(name, None)
        return {**data, **self.extra}


def config_from_json(data: Any, where: str = "config") -> TrialConfig:
    """A TrialConfig from best.json: its fields a newer autotune added are dropped, a missing one is an error."""
    if isinstance(data, TrialConfig):
        return data
    if not isinstance(data, dict):
        raise RecordError(f"best.json: {where} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(TrialConfig)}
    for name, f in known.items():
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordError(f"best.json: {where} lacks its {name!r} field")
    return TrialConfig.from_json({k: v for k, v in data.items() if k in known})


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

    trial: int
    config: TrialConfig | None = None
    throughput_sps: float | None = None
    latency_ms: dict[str, Any] | None = None
    sustained_rps: float | None = None  # the server scenario: its sustained request rate

    @classmethod
    def from_json(cls, data: Any) -> Baseline:
        if isinstance(data, dict) and data.get("config") is not None:
            data = {**data, "config": config_from_json(data["config"], "baseline.config")}
        return super().from_json(data)

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        if self.config is not None:
            data["config"] = self.config.to_json()
        return data


@dataclass(frozen=True)
class FinalistCandidate(OpenRecord):
    """One candidate of the finalist round: its interleaved runs and their spread (over the clean runs)."""

    trial: int
    winner: bool = False
    candidate: bool = True
    baseline: bool = False
    config: dict[str, Any] | None = None
    search_value: float | None = None
    values: list[float | None] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
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
    order: Any = None
    repeats: int | None = None
    seconds: float | None = None
    left_out: list[Any] = field(default_factory=list)  # candidates the time left had no room for
    candidates: list[FinalistCandidate] = field(default_factory=list)


@dataclass(frozen=True)
class ServerSummary(OpenRecord):
    """The server scenario: the sustained rate at the bound, the batching policy and the rate search's probes."""

    sustained_rps: float
    slo_ms: float
    max_batch: int | None = None
    max_wait_ms: float | None = None
    upper_bound_rps: float | None = None
    batching: Any = None
    routing: Any = None
    rule: Any = None
    probes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ParetoPoint(OpenRecord):
    """One non-dominated clean trial of a Pareto study: its throughput and p99, and how to run it."""

    trial: int
    throughput_sps: float
    p99_ms: float
    config: dict[str, Any] | None = None
    config_summary: str | None = None


@dataclass(frozen=True)
class BestMetrics(OpenRecord):
    """The winner's metrics as best.json copies them from its trial (TrialMetrics' JSON, these fields in
    this order); a field a file written before it existed lacks reads as None."""

    throughput_sps: float | None = None
    latency_ms: dict[str, Any] | None = None  # p50, p90, p99, mean (ms) and samples
    peak_rss_mib: float | None = None
    peak_rss_mib_total: float | None = None
    prepare_s: float | None = None
    load_s: float | None = None
    first_call_s: float | None = None
    artifact: dict[str, Any] | None = None
    measurement: dict[str, Any] | None = None
    instances: list[dict[str, Any]] | None = None
    torch_version: str | None = None
    backend_details: dict[str, Any] | None = None
    executed_precision: dict[str, Any] | None = None
    screening: dict[str, Any] | None = None
    valid: bool | None = None
    generation: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    # The fields the file read lacked (written before they existed): left out again by `to_json`.
    absent: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> BestMetrics:
        record = super().from_json(data)
        if isinstance(data, dict):
            known = [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "absent")]
            record = dataclasses.replace(record, absent=tuple(name for name in known if name not in data))
        return record

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data.pop("absent", None)
        return {k: v for k, v in data.items() if k not in self.absent}


# The trial metrics best.json copies into its `metrics` (results/best_json.py writes them, in this order).
METRIC_KEYS = tuple(f.name for f in dataclasses.fields(BestMetrics) if f.name not in ("extra", "absent"))


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
        "launch": Launch,
        "baseline": Baseline,
        "finalists": Finalists,
        "server": ServerSummary,
        "pareto_front": ParetoPoint,
        "metrics": BestMetrics,
    }
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("pareto_front", "speedup_source", "scenario", "server")

    schema: str
    created: str | None = None  # UTC time of writing (ISO 8601)
    meets_drift: bool
    study: StudyInfo
    objective: ObjectiveInfo
    selection: str  # why this trial won (or why there is no winner)
    scenario: str | None = None  # offline, single-stream or server (None in files written before it existed)
    server: ServerSummary | None = None  # the server scenario: sustained rate, bound, batching policy, probes
    pareto_front: list[ParetoPoint] | None = None  # pareto studies: every non-dominated clean trial
    finalists: Finalists | None = None  # the finalist round, when one decided
    model: dict[str, Any]  # how trials built the model (kind, name, input shape, weights)
    config: TrialConfig
    runtime: dict[str, Any] | None = None  # the Python environment the winner ran in
    environment: dict[str, str] | None = None  # the variables the configuration sets
    launch: Launch | None = None
    job: dict[str, Any] | None = None  # what a worker needs to rebuild the winner
    metrics: BestMetrics | None = None  # throughput_sps, latency_ms, peak_rss_mib, measurement, ...
    measure_settings: dict[str, Any] | None = None
    drift: dict[str, Any]  # every drift metric against FP32, the one bounded, its drop and the bound
    baseline: Baseline | None = None
    speedup_vs_baseline: float | None = None
    speedup_source: str | None = None
    fingerprint: dict[str, Any] | None = None  # hardware, software, host

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
            return super().from_json({**data, "config": config_from_json(data["config"])})
        except RecordError as exc:
            message = str(exc)
            raise RecordError(message if message.startswith("best.json") else f"best.json: {message}") from None

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["config"] = self.config.to_json()
        return data

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
    def latency_ms(self) -> dict[str, Any] | None:
        """The winner's latency per call: p50, p90, p99, mean (ms) and samples."""
        return self.metrics.latency_ms if self.metrics else None

    @property
    def throughput_ci_rel(self) -> float | None:
        """The relative half-width of the confidence interval of the winner's throughput in its search trial."""
        measurement = self.metrics.measurement if self.metrics else None
        return (measurement or {}).get("throughput_ci_rel")

    @property
    def backend_details(self) -> dict[str, Any]:
        """What the backend reported it compiled for the winner (effective streams, precision, ...)."""
        return (self.metrics.backend_details if self.metrics else None) or {}

    @property
    def worker_job(self) -> WorkerJob | None:
        """What a worker needs to rebuild the winner, typed (None: the closest candidate, never timed)."""
        return WorkerJob.from_json(self.job) if self.job else None

    @property
    def speedup(self) -> float | None:
        """Throughput over the eager fp32 baseline's (see `speedup_source` for how it was measured)."""
        return self.speedup_vs_baseline

    @property
    def drift_drop(self) -> float | None:
        """The winner's drop from FP32 on the bounded drift metric."""
        return self.drift.get("drop")

    @property
    def max_drift(self) -> float | None:
        return self.drift.get("max_drift")

    @property
    def reference_note(self) -> ReferenceNote | None:
        """Set when the FP32 outputs were constant across inputs: what drift was measured on instead."""
        note = self.drift.get("reference")
        return ReferenceNote.from_json(note) if note else None

"""Everything the user asked for, validated once and stored on the study.

A resumed study (or a later joining orchestrator, `autotune join`) reads it back; the fields that decide what is being
compared must not change between runs of one study.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from autotune.common.errors import UserError
from autotune.common.json_record import JsonObject, Record
from autotune.measure.drift import DEFAULT_CLASSIFY_METRIC, DriftCriterion
from autotune.measure.stopwatch import MeasureSettings
from autotune.model.dataset import DataSource
from autotune.model.generation import GenerationWorkload
from autotune.model.sources import ModelSource
from autotune.records.attributes import Attr
from autotune.records.options import DEFAULT_EVAL_SAMPLES, default_of, default_seconds, flag

OBJECTIVES = ("throughput", "latency", "pareto", "server")
# MLPerf Inference's scenarios, as objectives: closed-loop throughput, one request at a time, and the
# highest Poisson arrival rate whose p99 latency stays within --slo-ms.
SCENARIOS = {"offline": "throughput", "single-stream": "latency", "server": "server"}
Direction = Literal["minimize", "maximize"]
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Changing these would compare apples with oranges inside one study.
IDENTITY_FIELDS = (
    "model",
    "space",
    "objective",
    "max_drift",
    "drift_metric",
    "drift_relative",
    "data",
    "calibration_data",
    "measure",
    "eval_samples",
    "calibration_samples",
    "runtimes",
    "slo_ms",
    "task",
    "generation",
    "ttft_slo_ms",
    "tpot_slo_ms",
)
# Fields added after studies already existed: a stored spec without them had these values (what those
# studies ran with then, whatever the options' defaults are now).
IDENTITY_DEFAULTS: JsonObject = {
    "drift_metric": "relative_l2",
    "drift_relative": False,
    "data": DataSource().to_json(),
    "calibration_data": None,
    "runtimes": [],
    "slo_ms": None,
    "task": "classify",
    "generation": None,
    "ttft_slo_ms": None,
    "tpot_slo_ms": None,
}
TASKS = ("classify", "generate")


def validate_study_name(name: str) -> str:
    if not STUDY_NAME.fullmatch(name) or ".." in name:
        raise UserError(f"study name {name!r} is not allowed: use letters, digits, '.', '_' and '-' (no path parts)")
    return name


def study_dir(studies_root: str | Path, study: str) -> Path:
    return Path(studies_root) / validate_study_name(study)


def default_storage(studies_root: str | Path, study: str) -> str:
    return f"sqlite:///{(study_dir(studies_root, study) / 'study.db').resolve()}"


@dataclass(frozen=True)
class SearchSpec(Record):
    """The study's settings, validated: the options (records/options.py), resolved against the model, the data
    and the machine. Each default is the option's (a duration in seconds), so a spec made in Python without
    one runs as the command line would."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "model": ModelSource,
        "data": DataSource,
        "calibration_data": DataSource,
        "measure": MeasureSettings,
        "generation": GenerationWorkload,
    }

    study: str
    model: ModelSource
    storage: str
    space_path: str
    space: dict[str, Any]  # the search space YAML as the user wrote it (tuning/space.py reads it)
    objective: str = default_of("objective")
    max_drift: float = float(default_of("max_drift"))
    drift_metric: str = DEFAULT_CLASSIFY_METRIC  # search_spec picks the task's default
    drift_relative: bool = False  # max_drift is a share of FP32's value (accuracy)
    data: DataSource = field(default_factory=DataSource)  # drift (and calibration) data
    calibration_data: DataSource | None = None  # calibration from its own source instead of a split of `data`
    budget_s: float = default_seconds("budget")
    trials: int | None = default_of("trials")
    trial_timeout_s: float = default_seconds("trial_timeout")
    eval_samples: int = DEFAULT_EVAL_SAMPLES  # search_spec picks the task's default (a language model: its prompts)
    calibration_samples: int = default_of("calibration_samples")
    cover_backends: bool = default_of("cover_backends")  # a new study first tries every backend x precision once
    speed_pruning: bool = default_of("speed_pruning")  # screen each trial and prune the clearly slower ones
    finalists: int = default_of("finalists")
    finalist_repeats: int = default_of("finalist_repeats")
    finalist_share: float = default_of("finalist_share")
    studies_root: str = default_of("studies_dir")
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    runtimes: list[str] = field(default_factory=list)  # --runtime interpreters, besides main (and .venv-ipex)
    memory_limit_mib: float | None = None  # per trial, all its processes together (None: no limit)
    cache_size_mib: float | None = None  # the artifact cache's cap (None: no cap)
    slo_ms: float | None = default_of("slo_ms")  # highest throughput whose p99 latency per call stays under this
    # a trial whose orchestrator is silent this long is failed and retried (per process)
    heartbeat_grace_s: float = default_seconds("heartbeat_grace")
    mixed_hardware: list[str] | None = None  # a worker joined from a machine that differs (--allow-mixed-hardware)
    task: str = "classify"  # "generate": a causal language model generating text (TTFT, TPOT, tokens/s)
    generation: GenerationWorkload | None = None  # the workload every trial runs (task generate)
    ttft_slo_ms: float | None = default_of("ttft_slo_ms")  # generation: p99 bound on time to first token
    tpot_slo_ms: float | None = default_of("tpot_slo_ms")  # generation: p99 bound on time per output token

    def __post_init__(self) -> None:
        validate_study_name(self.study)
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective {self.objective!r} is not known; choose {' or '.join(OBJECTIVES)}")
        try:
            DriftCriterion(self.drift_metric, self.max_drift, self.drift_relative)
        except ValueError as exc:
            raise UserError(f"{flag('drift_metric')}/{flag('max_drift')}: {exc}") from None
        if self.drift_metric == "accuracy" and not self.data.labels:
            raise UserError(
                f"{flag('drift_metric')} accuracy needs labels: give {flag('data')} as an image folder with one "
                "subfolder per class, or a tensor file holding {'inputs': ..., 'labels': ...}"
            )
        if self.trials is not None and self.trials < 1:
            raise UserError(f"{flag('trials')} must be at least 1, got {self.trials}")
        if self.eval_samples < 1:
            raise UserError(f"{flag('eval_samples')} must be at least 1, got {self.eval_samples}")
        if self.finalists < 0 or self.finalist_repeats < 1:
            raise UserError(
                f"{flag('finalists')} must be >= 0 and {flag('finalist_repeats')} >= 1, got {self.finalists} and "
                f"{self.finalist_repeats}"
            )
        if not 0 <= self.finalist_share < 1:
            raise UserError(
                f"{flag('finalist_share')} is a fraction of the budget in [0, 1), got {self.finalist_share}"
            )
        if self.objective == "server" and self.task == "generate":
            if self.slo_ms is not None or (self.ttft_slo_ms is None and self.tpot_slo_ms is None):
                raise UserError(
                    f"{flag('scenario')} server with a language model searches the highest request rate whose p99 "
                    f"time to first token and per output token stay within bounds: give {flag('ttft_slo_ms')} "
                    f"and/or {flag('tpot_slo_ms')} (not {flag('slo_ms')}), e.g. {flag('ttft_slo_ms')} 1000 "
                    f"{flag('tpot_slo_ms')} 100"
                )
        elif self.objective == "server" and self.slo_ms is None:
            raise UserError(
                f"{flag('scenario')} server searches the highest request rate at a p99 latency bound: give it with "
                f"{flag('slo_ms')}, e.g. {flag('slo_ms')} 50"
            )
        if self.slo_ms is not None and (self.objective not in ("throughput", "server") or self.slo_ms <= 0):
            raise UserError(
                f"{flag('slo_ms')} must be a positive bound on p99 latency and goes with the offline or server "
                f"scenario ({flag('objective')} throughput), got {self.slo_ms}"
            )
        if self.objective == "pareto" and (self.speed_pruning or self.finalists or self.measure.window_min_iters < 100):
            raise UserError(
                f"{flag('objective')} pareto measures p99 (100 calls per measurement) and has no single value to "
                f"prune or re-measure finalists by: use it with {flag('speed_pruning')} {flag('finalists')} 0"
            )
        if self.slo_ms is not None and self.objective == "throughput" and self.measure.window_min_iters < 100:
            raise UserError(f"{flag('slo_ms')} needs at least 100 calls per measurement for a p99")
        if self.task not in TASKS:
            raise UserError(f"{flag('task')} {self.task!r} is not known; choose {' or '.join(TASKS)}")
        if (self.task == "generate") != (self.generation is not None):
            raise UserError(f"a generation study needs its workload ({flag('prompt_tokens')}, {flag('new_tokens')})")
        if self.task != "generate" and (self.ttft_slo_ms is not None or self.tpot_slo_ms is not None):
            raise UserError(
                f"{flag('ttft_slo_ms')} and {flag('tpot_slo_ms')} bound a generation study ({flag('task')} generate)"
            )
        if self.task == "generate" and self.slo_ms is not None:
            raise UserError(
                f"{flag('slo_ms')} bounds one call; for generation bound {flag('ttft_slo_ms')} or {flag('tpot_slo_ms')}"
            )
        for name, bound in (("ttft_slo_ms", self.ttft_slo_ms), ("tpot_slo_ms", self.tpot_slo_ms)):
            if bound is not None and (bound <= 0 or self.objective not in ("throughput", "server")):
                raise UserError(
                    f"{flag(name)} must be a positive p99 bound and goes with the offline or server scenario "
                    f"({flag('objective')} throughput)"
                )
        offline_p99 = self.ttft_slo_ms is not None and self.objective != "server"  # a server's p99 is its requests'
        if offline_p99 and self.measure.window_min_iters < 100:
            raise UserError(f"{flag('ttft_slo_ms')} needs at least 100 generations per measurement for a p99")
        if self.calibration_samples < 1:
            raise UserError(f"{flag('calibration_samples')} must be at least 1, got {self.calibration_samples}")

    @property
    def dir(self) -> Path:
        return study_dir(self.studies_root, self.study)

    @property
    def cache_dir(self) -> Path:
        """Artifacts and compile caches, shared by every study under the same studies folder."""
        return Path(self.studies_root) / ".cache"

    @property
    def criterion(self) -> DriftCriterion:
        return DriftCriterion(self.drift_metric, self.max_drift, self.drift_relative)

    @property
    def unit(self) -> str:
        """What throughput counts: generated tokens for a language model, samples otherwise."""
        return "tokens/s" if self.task == "generate" else "samples/s"

    @property
    def directions(self) -> list[Direction]:
        """pareto: throughput up and p99 latency down, together (a multi-objective study)."""
        directions: dict[str, list[Direction]] = {
            "throughput": ["maximize"],
            "latency": ["minimize"],
            "pareto": ["maximize", "minimize"],
            "server": ["maximize"],
        }
        return directions[self.objective]

    @property
    def scenario(self) -> str:
        """The MLPerf scenario the objective measures (a Pareto study is closed loop: offline)."""
        return scenario_of(self.objective)

    def identity(self) -> JsonObject:
        data = self.to_json()
        return {key: data[key] for key in IDENTITY_FIELDS}


def identity_differences(stored: JsonObject, current: JsonObject) -> list[str]:
    """Names of identity fields whose values differ, e.g. ['max_drift: 0.05 -> 0.1']. A language model's
    drift prompts are its workload's `drift_prompts` (absent: 4, what a study stored before it existed measured,
    whatever its `eval_samples` said)."""
    diffs = []
    for key in IDENTITY_FIELDS:
        old, new = stored.get(key, IDENTITY_DEFAULTS.get(key)), current.get(key)
        if key == "eval_samples" and current.get("generation") is not None:
            continue
        if old != new:
            if isinstance(old, dict) and isinstance(new, dict):
                keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                if keys:  # a field added since (absent = None) is no difference
                    diffs.append(f"{key} ({', '.join(keys)})")
            else:
                diffs.append(f"{key}: {old!r} -> {new!r}")
    return diffs


@dataclass(frozen=True)
class StoredSpec(Record):
    """What the results read of the spec a study stored (SearchSpec.to_json()), each field at the value a
    study had before the field existed: a study written by any autotune version reads back, and a study
    created by hand (tests, Optuna alone) reads as the defaults."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"model": ModelSource}

    objective: str = default_of("objective")
    task: str = IDENTITY_DEFAULTS["task"]
    model: ModelSource | None = None  # None: a study that stored no spec
    storage: str | None = None
    max_drift: float = float(default_of("max_drift"))
    drift_metric: str = IDENTITY_DEFAULTS["drift_metric"]
    drift_relative: bool = IDENTITY_DEFAULTS["drift_relative"]
    eval_samples: int | None = None
    slo_ms: float | None = None
    runtimes: list[str] | None = None  # the Python environments trials may run in besides the main one
    finalists: int | None = default_of("finalists")
    generation: dict[str, Any] | None = None  # the workload as stored (GenerationWorkload's JSON)

    @property
    def sequences_meaning(self) -> str:
        """What the study's `sequences` counted: "total" (every instance's together), or "per instance" in a
        study stored before they counted the total."""
        return "total" if (self.generation or {}).get("sequences") == "total" else "per instance"

    @classmethod
    def of(cls, study: Any) -> StoredSpec:
        """The spec stored on an Optuna study (the defaults when it stored none)."""
        return cls.from_json(study.user_attrs.get(Attr.SPEC) or {})

    @property
    def criterion(self) -> DriftCriterion:
        return DriftCriterion(self.drift_metric, self.max_drift, self.drift_relative)

    @property
    def scenario(self) -> str:
        """The MLPerf scenario the objective measures (a Pareto study is closed loop: offline)."""
        return scenario_of(self.objective)

    @property
    def model_name(self) -> str:
        return self.model.name if self.model is not None else "?"


def scenario_of(objective: str) -> str:
    return {"latency": "single-stream", "server": "server"}.get(objective, "offline")

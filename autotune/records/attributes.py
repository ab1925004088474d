"""The keys of what autotune keeps in Optuna's user attributes, on a study or on each of its trials.

Written and read through these names only, so a misspelt key is an AttributeError (and a mypy error),
not a silent None; the stored strings are unchanged, so studies written before read back the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.common.json_record import Record
from autotune.records.config import TrialConfig


class Attr:
    """One constant per user-attribute key (the stored name, lower case)."""

    ATTENTION_LAYERS = "attention_layers"
    BASELINE = "baseline"
    BUDGET = "budget"
    CALIBRATION = "calibration"
    COMMANDS = "commands"
    CONFIG = "config"
    CONFIG_SUMMARY = "config_summary"
    COVERAGE = "coverage"
    COVERAGE_QUEUE = "coverage_queue"  # on the study: the coverage trials held back, released one at a time
    DEFERRED = "deferred"
    DRIFT = "drift"
    DRIFT_REFERENCE = "drift_reference"
    ENV = "env"
    EVALUATION = "evaluation"
    EXECUTED_PRECISION = "executed_precision"
    FAIL_CAUSE = "fail_cause"
    FALLBACK_KEY = "fallback_key"
    FINALISTS = "finalists"
    FINGERPRINT = "fingerprint"
    HOST = "host"
    JOB = "job"
    LATE_COVERAGE = "late_coverage"  # studies begun before the coverage queue: the late plans alone
    LAYOUT = "layout"
    LAYOUT_QUEUE = "layout_queue"  # on the study: the layout round's splits held back, released one at a time
    LAYOUT_ROUND = "layout_round"  # on the study: the leader's trial number, once the layout round's splits are held
    LAYOUT_ROUNDS_LATER = "layout_rounds_later"  # on the study: the leaders of the layout rounds after the first
    MEASUREMENT = "measurement"
    MEASURE_SETTINGS = "measure_settings"
    MIXED_HARDWARE = "mixed_hardware"
    MODEL_FOR_TRIALS = "model_for_trials"
    NUMERICS_KEY = "numerics_key"
    ORCHESTRATOR = "orchestrator"
    ORDER = "order"
    PINNING = "pinning"
    PIN_PREFIXES = "pin_prefixes"
    PREPARE_S = "prepare_s"
    PRIOR = "prior"
    PRUNE_REASON = "prune_reason"
    REDUCTION_DEPTH = "reduction_depth"
    REFERENCE_NOTE = "reference_note"
    RELEASED_LAST = "released_last"  # on the study: "layout" or "coverage", which queue released the last trial
    RETRIES = "retries"
    RETRY_OF = "retry_of"
    RUNTIME = "runtime"  # TrialMetrics: the Python environment the trial ran in
    SCREENING = "screening"
    SEEDED = "seeded"
    SEQUENCES_ROUND = "sequences_round"  # generation: the trial given the most sequences, once enqueued (-1: none)
    SERVER = "server"
    SLO = "slo"
    SPEC = "spec"
    SPEED_GATE = "speed_gate"
    STDERR_TAIL = "stderr_tail"
    TOO_SLOW = "too_slow"
    TORCH_VERSION = "torch_version"  # TrialMetrics: trials stored before `runtime` have this only
    TRIAL_DIR = "trial_dir"
    VALID = "valid"


@dataclass(frozen=True)
class TrialAttrs(Record):
    """One trial's user attributes, typed: what the readers of a stored trial need, None (or False) where the
    trial has not recorded it (a pruned or failed one records less). Read only: the attributes are written
    one by one as the trial goes (`trial.set_user_attr(Attr.X, ...)`); the metrics are TrialMetrics."""

    config: dict[str, Any] | None = None  # TrialConfig.to_json(); `trial_config` is the typed view
    config_summary: str | None = None
    runtime: dict[str, Any] | None = None  # the Python environment the trial ran in (name, torch, ...)
    torch_version: str | None = None
    env: dict[str, str] | None = None  # the variables the configuration sets
    pinning: str | None = None  # numactl, numactl-cpu, taskset or none
    pin_prefixes: list[list[str]] | None = None  # one pinning command prefix per instance
    commands: list[str] | None = None
    job: dict[str, Any] | None = None  # what a worker needs to rebuild the trial
    measure_settings: dict[str, Any] | None = None
    fail_cause: str | None = None
    prune_reason: str | None = None
    baseline: bool = False  # the eager fp32 baseline trial

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> TrialAttrs:
        """The typed attributes of a stored trial (the fields a newer autotune added are ignored)."""
        return cls.from_json(trial.user_attrs)

    @property
    def trial_config(self) -> TrialConfig | None:
        """The trial's configuration, typed (None: not recorded, the trial was pruned before it had one)."""
        return None if self.config is None else TrialConfig.from_stored(self.config)


@dataclass(frozen=True)
class Orchestrator(Record):
    """Who runs a trial (its `orchestrator` attribute; on the study, each orchestrator of it): host, pid,
    the process's start time (a pid can be reused) and its CPUs. None where a record lacks it."""

    host: str | None = None
    pid: int | None = None
    started: float | None = None
    cpus: list[int] = field(default_factory=list)

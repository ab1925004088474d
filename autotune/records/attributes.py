"""The keys of what autotune keeps in Optuna's user attributes, on a study or on each of its trials.

Written and read through these names only, so a misspelt key is an AttributeError (and a mypy error),
not a silent None; the stored strings are unchanged, so studies written before read back the same.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from autotune.backends.precision import ExecutedPrecision
from autotune.common.json_record import Record, RecordError
from autotune.machine.runtimes import RuntimeRecord
from autotune.measure.drift import Drift
from autotune.measure.serving import ServerMetrics
from autotune.measure.speed_gate import GateVerdict
from autotune.measure.stopwatch import MeasureSettings
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.metrics import Measurement, Screening, TrialBudget

if TYPE_CHECKING:  # a program loading a winner (autotune.load, the IPEX runtime) has no Optuna
    import optuna


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
    MIX_SHARE = "mix_share"  # the compressed_share the mix search enqueued this trial at
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
class Orchestrator(Record):
    """Who runs a trial (its `orchestrator` attribute; on the study, each orchestrator of it): host, pid,
    the process's start time (a pid can be reused) and its CPUs. None where a record lacks it."""

    host: str | None = None
    pid: int | None = None
    started: float | None = None
    cpus: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TrialAttrs(Record):
    """One trial's user attributes, typed: what the readers of a stored trial need, None (or False) where the
    trial has not recorded it (a pruned or failed one records less). Read only: the attributes are written
    one by one as the trial goes (`trial.set_user_attr(Attr.X, ...)`); a completed trial's metrics read
    whole as TrialMetrics. A loop that reads several attributes of a trial reads `TrialAttrs.of` once."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "config": TrialConfig,
        "runtime": RuntimeRecord,
        "job": WorkerJob,
        "measure_settings": MeasureSettings,
        "budget": TrialBudget,
        "drift": Drift,
        "screening": Screening,
        "measurement": Measurement,
        "server": ServerMetrics,
        "executed_precision": ExecutedPrecision,
        "too_slow": GateVerdict,
        "orchestrator": Orchestrator,
    }

    # what ran, and how
    config: TrialConfig | None = None
    config_summary: str | None = None
    runtime: RuntimeRecord | None = None  # the Python environment the trial ran in
    torch_version: str | None = None  # trials stored before `runtime` have this only
    env: dict[str, str] | None = None  # the variables the configuration sets
    pinning: str | None = None  # numactl, numactl-cpu, taskset or none
    pin_prefixes: list[list[str]] | None = None  # one pinning command prefix per instance
    commands: list[str] | None = None
    job: WorkerJob | None = None  # what a worker needs to rebuild the trial
    measure_settings: MeasureSettings | None = None
    # why it ran: enqueued by a round (with its reason), or sampled
    baseline: bool = False  # the eager fp32 baseline trial
    coverage: bool = False
    prior: bool = False
    layout: bool = False
    order: str | None = None
    retries: int = 0
    retry_of: int | None = None
    orchestrator: Orchestrator | None = None
    host: str | None = None
    # its numerics, and what it measured before and while timing
    numerics_key: str | None = None
    fallback_key: str | None = None  # trials stored before it have the numerics key only
    drift_reference: str | None = None
    drift: Drift | None = None
    executed_precision: ExecutedPrecision | None = None
    screening: Screening | None = None
    too_slow: GateVerdict | None = None
    measurement: Measurement | None = None
    server: ServerMetrics | None = None
    valid: bool = True  # trials from before the noise checks count as valid
    prepare_s: float | None = None
    budget: TrialBudget | None = None  # where its time went
    # how it ended, when not COMPLETE
    fail_cause: str | None = None
    prune_reason: str | None = None

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> TrialAttrs:
        """The typed attributes of a stored or running trial (the fields a newer autotune added are ignored).
        A finished trial's are read once: its attributes no longer change, and loops over a study read them
        again and again."""
        import optuna

        if not isinstance(trial, optuna.trial.FrozenTrial) or not trial.state.is_finished():
            return cls.from_json(trial.user_attrs)
        key = id(trial)
        hit = _READ.get(key)
        if hit is not None and hit[0]() is trial:
            return hit[1]
        attrs = cls.from_json(trial.user_attrs)
        _READ[key] = (weakref.ref(trial, _forget(key)), attrs)
        return attrs

    @classmethod
    def _load(cls, name: str, value: object) -> object:
        """An attribute stored in a layout this autotune does not read (another version's, or one written by
        hand) reads as not recorded, as it did when each reader looked for the keys it needed."""
        try:
            return super()._load(name, value)
        except (RecordError, TypeError, ValueError):
            return None

    @property
    def fallback_or_numerics_key(self) -> str | None:
        """The key a precision fallback is shared under (older trials: their numerics key)."""
        return self.fallback_key if self.fallback_key is not None else self.numerics_key

    @property
    def pruned_on_drift(self) -> bool:
        return (self.prune_reason or "").startswith("drift")


# The attributes of finished trials read so far, by the trial object's id (dropped with the object).
_READ: dict[int, tuple[weakref.ref[optuna.trial.FrozenTrial], TrialAttrs]] = {}


def _forget(key: int) -> Callable[[object], None]:
    """What drops a trial's entry when the trial object goes."""

    def drop(_: object) -> None:
        _READ.pop(key, None)

    return drop

"""WorkerJob: what the runner hands one `python -m autotune.worker` process, and best.json keeps.

One record for the three tasks (the FP32 reference, an artifact's preparation, a trial's instance):
each task reads the fields it needs. The JSON it travels as is the layout the job dicts had, so an
older best.json still replays: a field at its default is left out, except the few always written.
It names its format (`autotune.job/1`); a job without one was written before formats were named and
is version 1, and a worker refuses a version it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from autotune.common.json_record import FORMAT, OpenRecord, Record, RecordError
from autotune.measure.drift import DriftCriterion
from autotune.measure.llm_serving import ServingPlan
from autotune.measure.speed_gate import SpeedGate
from autotune.measure.stopwatch import MeasureSettings
from autotune.model.dataset import DataSource
from autotune.model.generation import GenerationWorkload
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.records.reference import CalibrationSet

TASKS = ("reference", "prepare", "trial")
JOB_FORMAT = "autotune.job/1"


@dataclass(frozen=True)
class ServerSettings(Record):
    """The server scenario's arrivals: the p99 bound, the seed the arrival streams are drawn from, and the
    rates the rate search offers first (a finalist's: the leader's rate and +-10%)."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("first_rates",)

    slo_ms: float
    seed: int = 0
    first_rates: list[float] | None = None


@dataclass(frozen=True)
class WorkerJob(OpenRecord):
    format: str = field(default=JOB_FORMAT, kw_only=True, metadata=FORMAT)
    task: str  # one of TASKS
    model: ModelSource
    config: TrialConfig | None = None  # prepare, trial
    measure: MeasureSettings | None = None  # trial
    reference_path: str | None = None  # the FP32 outputs (written by the reference, read by the others)
    workdir: str | None = None
    artifact_dir: str | None = None  # the prepared artifact (built there by prepare, loaded by a trial)
    calibration_samples: int = 0
    calibration: CalibrationSet | None = None  # the calibration set's description (best.json replays it)
    calibration_description: str = "synthetic"  # prepare: what its calibration data was
    generation: GenerationWorkload | None = None  # a language model's workload
    server: ServerSettings | None = None  # the server scenario's arrival settings
    llm_server: ServingPlan | None = None  # a language model's server scenario: requests, bounds, seed
    # the reference task
    eval_samples: int = 0
    data: DataSource | None = None  # what drift (and calibration) is drawn from
    calibration_data: DataSource | None = None  # calibration from its own source instead
    weights_out: str | None = None  # where the reference saves the random init every trial loads
    # one attempt of a trial
    screen: bool = False
    measure_drift: bool = True
    speed_gate: SpeedGate | None = None
    drift_bound: DriftCriterion | None = None
    barrier_dir: str | None = None
    barrier_timeout_s: float = 0.0
    # one instance
    instance: int = 0
    instances: int = 1
    result_path: str | None = None
    stamps_path: str | None = None
    precision_path: str | None = None

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "model": ModelSource,
        "config": TrialConfig,
        "measure": MeasureSettings,
        "calibration": CalibrationSet,
        "generation": GenerationWorkload,
        "server": ServerSettings,
        "llm_server": ServingPlan,
        "data": DataSource,
        "calibration_data": DataSource,
        "speed_gate": SpeedGate,
        "drift_bound": DriftCriterion,
    }
    OMIT_DEFAULTS: ClassVar[bool] = True
    # Written even at their default: readers of best.json index them (job["calibration_samples"]).
    ALWAYS_WRITTEN: ClassVar[tuple[str, ...]] = ("task", "model", "calibration_samples", "artifact_dir")

    def trial_config(self) -> TrialConfig:
        """The configuration a prepare or trial job runs (a reference job has none)."""
        if self.config is None:
            raise RecordError(f"a {self.task} job needs its 'config' field")
        return self.config

    def workload(self) -> GenerationWorkload:
        """The generation workload of a language model's job."""
        if self.generation is None:
            raise RecordError(f"a {self.task} job of a language model needs its 'generation' field")
        return self.generation

    def measure_settings(self) -> MeasureSettings:
        """How a trial job measures."""
        if self.measure is None:
            raise RecordError(f"a {self.task} job needs its 'measure' field")
        return self.measure

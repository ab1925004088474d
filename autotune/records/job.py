"""WorkerJob: what the runner hands one `python -m autotune.worker` process, and best.json keeps.

One record for the three tasks (the FP32 reference, an artifact's preparation, a trial's instance):
each task reads the fields it needs. The JSON it travels as is the layout the job dicts had, so an
older best.json still replays: a field at its default is left out, except the few always written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from autotune.common.json_record import Record, RecordError
from autotune.measure.drift import DriftCriterion
from autotune.measure.speed_gate import SpeedGate
from autotune.measure.stopwatch import MeasureSettings
from autotune.model.generation import GenerationWorkload
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig

TASKS = ("reference", "prepare", "trial")


@dataclass(frozen=True)
class WorkerJob(Record):
    task: str  # one of TASKS
    model: ModelSource
    config: TrialConfig | None = None  # prepare, trial
    measure: MeasureSettings | None = None  # trial
    reference_path: str | None = None  # the FP32 outputs (written by the reference, read by the others)
    workdir: str | None = None
    artifact_dir: str | None = None  # the prepared artifact (built there by prepare, loaded by a trial)
    calibration_samples: int = 0
    calibration: dict[str, Any] | None = None  # the calibration set's description (best.json replays it)
    calibration_description: str = "synthetic"  # prepare: what its calibration data was
    generation: GenerationWorkload | None = None  # a language model's workload
    server: dict[str, Any] | None = None  # the server scenario's arrival settings
    # the reference task
    eval_samples: int = 0
    data: dict[str, Any] | None = None  # DataSource's dict
    calibration_data: dict[str, Any] | None = None
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

    NESTED: ClassVar[dict[str, type[Record]]] = {"speed_gate": SpeedGate, "generation": GenerationWorkload}
    # Written even at their default: readers of best.json index them (job["calibration_samples"]).
    ALWAYS_WRITTEN: ClassVar[tuple[str, ...]] = ("task", "model", "calibration_samples", "artifact_dir")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in self.ALWAYS_WRITTEN and value == f.default:
                continue
            data[f.name] = _dump_field(value)
        return data

    @classmethod
    def from_json(cls, data: Any) -> WorkerJob:
        if isinstance(data, dict):
            converted = {k: _load_field(k, v) for k, v in data.items()}
            return super().from_json(converted)
        return super().from_json(data)

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


def _dump_field(value: Any) -> Any:
    """The JSON of one field: the nested classes keep their own dict layout."""
    if isinstance(value, (Record, TrialConfig, MeasureSettings, ModelSource, DriftCriterion)):
        return value.to_json()
    return value


_FROM_JSON: dict[str, Any] = {
    "model": ModelSource.from_json,
    "config": TrialConfig.from_json,
    "measure": MeasureSettings.from_json,
    "drift_bound": lambda d: DriftCriterion(**d),
}


def _load_field(name: str, value: Any) -> Any:
    """A field read back from JSON: the nested classes built from their dicts (records left to NESTED)."""
    loader = _FROM_JSON.get(name)
    if loader is None or value is None or not isinstance(value, dict):
        return value
    return loader(value)

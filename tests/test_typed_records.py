"""The records that cross layers, typed all the way: the records best.json and a study nest read typed and
write back what they read."""

from __future__ import annotations

import json

import pytest
from conftest import TESTS

from autotune.common.json_record import OpenRecord, RecordError
from autotune.machine.runtimes import RuntimeRecord
from autotune.model.sources import ModelSource
from autotune.records.best import BestJson, DriftReport
from autotune.records.config import TrialConfig
from autotune.records.finalists import FinalistRound
from autotune.records.fingerprint import Fingerprint
from autotune.records.job import WorkerJob
from autotune.records.reference import CalibrationSet

STORED = TESTS / "data" / "stored"
MODEL = ModelSource("factory", f"{TESTS / 'tiny_models.py'}:tiny_cnn", (3, 16, 16))


def stored(name: str):
    return json.loads((STORED / name).read_text())


# ---- what best.json and a study keep, typed ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["classify-best.json", "generate-best.json", "server-best.json"])
def test_best_json_nests_records_where_it_held_mappings(name):
    best = BestJson.from_json(stored(name))
    assert isinstance(best.model, ModelSource) and isinstance(best.job, WorkerJob)
    assert isinstance(best.runtime, RuntimeRecord) and isinstance(best.fingerprint, Fingerprint)
    assert isinstance(best.drift, DriftReport) and best.drift.measured is not None
    assert best.drift_drop == best.drift.drop and best.max_drift == best.drift.max_drift == 0.05
    assert best.job.config == best.config and isinstance(best.job.calibration, CalibrationSet)
    assert best.metrics is not None and best.metrics.latency_ms is not None and best.metrics.measurement is not None
    assert best.fingerprint.hardware is not None and best.fingerprint.hardware.physical_cores
    assert best.latency_ms is not None and best.latency_ms.p50 == stored(name)["metrics"]["latency_ms"]["p50"]


def test_best_json_fields_a_newer_autotune_added_inside_a_nested_record_are_kept():
    data = stored("classify-best.json")
    newer = {
        **data,
        "drift": {**data["drift"], "added_later": 1},
        "fingerprint": {**data["fingerprint"], "hardware": {**data["fingerprint"]["hardware"], "l3_mib": 32}},
        "job": {**data["job"], "added_later": True},
    }
    assert BestJson.from_json(newer).to_json() == newer


def test_a_closest_candidate_written_by_hand_without_a_model_still_reads():
    closest = {
        "schema": "autotune.best/2",
        "meets_drift": False,
        "study": {"name": "s", "trial": 0},
        "objective": {"name": "throughput"},
        "selection": "NO configuration met the drift bound",
        "model": {},
        "config": TrialConfig("eager", "bf16", 1).to_json(),
        "drift": {},
        "job": None,
    }
    best = BestJson.from_json(closest)
    assert best.model is None and best.job is None and not best.timed


def test_a_stored_finalist_round_and_fingerprint_read_typed_and_write_back_as_they_were():
    attrs = stored("classify-study.json")["study"]["user_attrs"]
    round_ = FinalistRound.from_json(attrs["finalists"])
    assert round_.to_json() == attrs["finalists"]
    assert all(isinstance(c.config, TrialConfig) and c.summary is not None for c in round_.candidates)
    assert (
        round_.repeats == 1
        and len(round_.candidates) == 3
        and round_.last_trial >= max(c.trial for c in round_.candidates)
    )
    fingerprint = Fingerprint.from_json(attrs["fingerprint"])
    assert fingerprint.to_json() == attrs["fingerprint"]
    assert fingerprint.software is not None and "main" in fingerprint.software.runtimes


def test_an_open_record_keeps_what_it_does_not_know_and_leaves_out_what_its_file_lacked():
    runtime = RuntimeRecord.from_json({"python": "/p", "torch": "2.8.0", "packages": {}, "gpu": "none"})
    assert isinstance(runtime, OpenRecord) and runtime.name == "main" and runtime.extra == {"gpu": "none"}
    assert runtime.to_json() == {"python": "/p", "torch": "2.8.0", "packages": {}, "gpu": "none"}
    assert RuntimeRecord(name="ipex", torch="2.8.0").to_json() == {"name": "ipex", "torch": "2.8.0"}


def test_a_stored_record_that_is_not_a_mapping_is_one_clear_error():
    with pytest.raises(RecordError, match="a WorkerJob record must be a mapping"):
        WorkerJob.from_json(["trial"])

"""The records that cross layers, typed all the way: the job and result files name their format and a worker
refuses one it does not know; the records best.json and a study nest read typed and write back what they
read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import TESTS

from autotune.common.json_record import OpenRecord, RecordError, UnknownFormat
from autotune.machine.runtimes import RuntimeRecord
from autotune.model.sources import ModelSource
from autotune.records.best import BestJson, DriftReport
from autotune.records.config import TrialConfig
from autotune.records.finalists import FinalistRound
from autotune.records.fingerprint import Fingerprint
from autotune.records.job import JOB_FORMAT, WorkerJob
from autotune.records.metrics import InstanceResult, PrepareResult
from autotune.records.reference import RESULT_FORMAT, CalibrationSet, ReferenceResult

STORED = TESTS / "data" / "stored"
MODEL = ModelSource("factory", f"{TESTS / 'tiny_models.py'}:tiny_cnn", (3, 16, 16))


def stored(name: str):
    return json.loads((STORED / name).read_text())


# ---- formats: the job and result files name theirs ---------------------------------------------------------
def test_a_job_names_its_format_first_and_one_without_a_format_is_version_1():
    job = WorkerJob(task="reference", model=MODEL)
    written = job.to_json()
    assert next(iter(written.items())) == ("format", JOB_FORMAT) == ("format", "autotune.job/1")
    older = {k: v for k, v in written.items() if k != "format"}  # as best.json files before it keep their job
    assert WorkerJob.from_json(older) == job
    assert WorkerJob.from_json(older).to_json() == older  # and it is written back as it was


def test_a_job_of_a_format_this_autotune_does_not_read_is_refused_naming_both():
    later = {**WorkerJob(task="reference", model=MODEL).to_json(), "format": "autotune.job/2"}
    with pytest.raises(UnknownFormat, match=r"'autotune\.job/2'.*autotune\.job/1"):
        WorkerJob.from_json(later)


def test_a_worker_handed_a_job_of_an_unknown_format_refuses_it_in_one_line(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({**WorkerJob(task="reference", model=MODEL).to_json(), "format": "autotune.job/7"}))
    done = subprocess.run(
        [sys.executable, "-m", "autotune.worker", str(job)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "autotune.job/7" in lines[0] and "autotune.job/1" in lines[0]


def test_a_worker_handed_something_that_is_not_a_job_says_so_in_one_line(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model": MODEL.to_json()}))
    done = subprocess.run(
        [sys.executable, "-m", "autotune.worker", str(job)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "'task'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_results_a_worker_writes_name_their_format_and_an_unknown_one_is_refused():
    files = stored("classify-worker.json")
    result = InstanceResult.from_json(files["trial_result"])  # written before formats: version 1
    assert result.to_json()["format"] == RESULT_FORMAT == "autotune.result/1"
    for record, data in (
        (InstanceResult, files["trial_result"]),
        (PrepareResult, files["prepare_result"]),
        (ReferenceResult, files["reference_result"]),
    ):
        assert record.from_json(data).to_json() == {"format": RESULT_FORMAT, **data}, record.__name__
        with pytest.raises(UnknownFormat, match=r"autotune\.result/9"):
            record.from_json({**data, "format": "autotune.result/9"})


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

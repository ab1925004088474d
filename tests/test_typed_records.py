"""The records that cross layers, typed all the way: the job and result files name their format and a worker
refuses one it does not know; the records best.json nests read typed and write back what they read; the
search's settings take every default from the options, and messages name options as the command line
spells them."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS, closest_candidate, trial_metrics

from autotune.common.durations import parse_duration
from autotune.common.errors import UserError
from autotune.common.json_record import OpenRecord, RecordError, UnknownFormat
from autotune.machine.runtimes import RuntimeRecord
from autotune.model.sources import ModelSource
from autotune.records.best import BestJson, DriftReport
from autotune.records.config import TrialConfig
from autotune.records.finalists import FinalistRound
from autotune.records.fingerprint import Fingerprint
from autotune.records.job import JOB_FORMAT, WorkerJob
from autotune.records.metrics import InstanceResult, PrepareResult
from autotune.records.options import DEFAULT_EVAL_SAMPLES, OPTION_FIELDS, flag_names
from autotune.records.reference import RESULT_FORMAT, CalibrationSet, ReferenceResult
from autotune.records.spec import SearchSpec, StoredSpec

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
    best = BestJson.from_json(closest_candidate())
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


# ---- each default and flag name written once ---------------------------------------------------------------
DURATIONS = {"budget_s": "budget", "trial_timeout_s": "trial_timeout", "heartbeat_grace_s": "heartbeat_grace"}
SAME_NAMES = (
    "objective",
    "trials",
    "calibration_samples",
    "cover_backends",
    "speed_pruning",
    "finalists",
    "finalist_repeats",
    "finalist_share",
    "slo_ms",
    "ttft_slo_ms",
    "tpot_slo_ms",
)


def test_the_spec_takes_its_defaults_from_the_options():
    spec = {f.name: f for f in dataclasses.fields(SearchSpec)}
    for name in SAME_NAMES:
        assert spec[name].default == OPTION_FIELDS[name].default, name
    for field, option in DURATIONS.items():
        assert spec[field].default == parse_duration(OPTION_FIELDS[option].default), field
    assert spec["max_drift"].default == float(OPTION_FIELDS["max_drift"].default)
    # --eval-samples says nothing: a classifier's default set (a language model's prompts: search_spec)
    assert OPTION_FIELDS["eval_samples"].default is None and spec["eval_samples"].default == DEFAULT_EVAL_SAMPLES
    assert spec["studies_root"].default == OPTION_FIELDS["studies_dir"].default
    empty = StoredSpec.from_json({})  # a study that stored no spec reads as the options' defaults
    assert (empty.objective, empty.max_drift, empty.finalists) == (
        OPTION_FIELDS["objective"].default,
        float(OPTION_FIELDS["max_drift"].default),
        OPTION_FIELDS["finalists"].default,
    )


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"trials": 0}, "trials"),
        ({"eval_samples": 0}, "eval_samples"),
        ({"finalist_share": 1.5}, "finalist_share"),
        ({"objective": "pareto"}, "speed_pruning"),
        ({"slo_ms": -1.0}, "slo_ms"),
        ({"calibration_samples": 0}, "calibration_samples"),
        ({"max_drift": -0.1}, "max_drift"),
    ],
)
def test_a_refused_setting_names_its_option_as_the_command_line_spells_it(changes, option, tmp_path):
    with pytest.raises(UserError) as refused:
        SearchSpec(study="s", model=MODEL, storage="sqlite://", space_path="s.yaml", space={}, **changes)
    assert flag_names(option)[0] in str(refused.value)


def test_the_settings_modules_spell_no_option_in_their_messages():
    """The strings of records/spec.py and api.py (docstrings aside) name no option: flag() spells it."""
    spelled = {name for option in OPTION_FIELDS for name in flag_names(option)}
    root = Path(__file__).resolve().parent.parent / "autotune"
    for module in ("records/spec.py", "api.py"):
        tree = ast.parse((root / module).read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        texts = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        ]
        found = sorted({name for text in texts for name in spelled if re.search(re.escape(name) + r"\b", text)})
        assert found == [], module


def test_a_stored_record_that_is_not_a_mapping_is_one_clear_error():
    with pytest.raises(RecordError, match="a WorkerJob record must be a mapping"):
        WorkerJob.from_json(["trial"])


# ---- the finalist round, through its records -------------------------------------------------------------
def test_a_finalist_round_is_stored_as_records_and_best_json_shows_it_as_before(monkeypatch):
    """The round on a study made in memory, each run's measurement given (no process started): stored as the
    FinalistRound's JSON, decided, and shown in best.json in the layout best.json files already hold."""
    import time
    from types import SimpleNamespace

    import optuna

    from autotune.results.best_json import build_best
    from autotune.tuning import finalists

    metrics = trial_metrics

    configs = [TrialConfig("eager", "fp32", 2), TrialConfig("eager", "fp32", 4), TrialConfig("inductor", "fp32", 4)]
    speeds = [100.0, 150.0, 120.0]
    study = optuna.create_study(direction="maximize")
    for number, (config, speed) in enumerate(zip(configs, speeds)):
        attrs = {**metrics(speed).to_json(), "config": config.to_json(), "config_summary": config.summary()}
        study.add_trial(optuna.trial.create_trial(value=speed, user_attrs={**attrs, "baseline": number == 0}))
    by_config = {config.summary(): speed for config, speed in zip(configs, speeds)}
    monkeypatch.setattr(
        finalists,
        "run_config",
        lambda config, *_, **__: (metrics(by_config[config.summary()]), [], None),
    )
    ctx = SimpleNamespace(server=None)
    baseline = study.trials[0]
    decided = finalists.run_finalists(
        study,
        ctx,
        Path("/nonexistent"),
        2,
        3,
        time.monotonic() + 3600,
        600,
        lambda m: m.throughput_sps,
        baseline,
        print,
    )
    assert isinstance(decided, FinalistRound) and decided.winner_trial == 1 and decided.repeats == 3
    assert [c.trial for c in decided.candidates] == [1, 2, 0] and decided.candidates[2].baseline
    assert all(len(c.runs) == 3 and c.summary is not None and c.summary.eligible for c in decided.candidates)
    stored_round = study.user_attrs["finalists"]
    assert FinalistRound.from_json(stored_round).to_json() == stored_round == decided.to_json()
    assert [e["config"] for e in stored_round["candidates"]] == [
        configs[1].to_json(),
        configs[2].to_json(),
        configs[0].to_json(),
    ]

    best = build_best(study, Path("best.json"))
    assert best.trial == 1 and best.finalists is not None and best.selection.startswith("finalists: ")
    shown = best.to_json()["finalists"]
    layout = stored("classify-finalists-best.json")["finalists"]
    assert list(shown) == list(layout) and list(shown["candidates"][0]) == list(layout["candidates"][0])
    assert shown["candidates"][0]["config"] == configs[1].to_json() and shown["candidates"][0]["values"] == [150.0] * 3
    assert best.speedup == pytest.approx(1.5) and best.objective.revalidated_median == 150.0

"""The typed records that cross layer boundaries: what goes in comes back, a misspelt field is an
error rather than a silent None, and a stored record missing a field says which one."""

import json
from dataclasses import replace

import pytest

from autotune.common.json_record import RecordError
from autotune.measure.drift import Drift, DriftCriterion
from autotune.measure.speed_gate import SpeedGate
from autotune.measure.stopwatch import LatencySummary, MeasureSettings, latency_summary
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.metrics import FinalistRun, InstanceShare, Measurement, Screening, TrialMetrics


def sample_metrics() -> TrialMetrics:
    latency = latency_summary([0.010, 0.011, 0.012, 0.010, 0.013, 0.011])
    return TrialMetrics(
        throughput_sps=123.5,
        latency_ms=latency,
        measurement=Measurement(
            common_window_s=2.0,
            calls=6,
            samples=48,
            throughput_ci_rel=0.02,
            ci_confidence=0.95,
            ci_target_rel=0.02,
            ci_target_met=True,
            samples_per_call=8,
            noise_flags=["instance 0: call times spread"],
        ),
        drift=Drift(relative_l2=0.01, cosine_similarity=0.999, top1_agreement=1.0, samples=32),
        instances=[
            InstanceShare(
                pid=7,
                cpus=[0],
                throughput_sps=123.5,
                common_window_sps=120.0,
                latency_ms=latency,
                iterations=6,
                window_s=2.0,
            )
        ],
        screening=Screening(throughput_sps=118.0, p50_ms=11.0, ci_rel=None, calls=3),
        valid=False,
    )


def test_metrics_survive_the_study_storage_round_trip():
    metrics = sample_metrics()
    stored = json.loads(json.dumps(metrics.to_json()))  # what Optuna keeps as user attributes
    back = TrialMetrics.from_trial_attrs(stored, trial_number=4)
    assert back == metrics
    assert isinstance(back.latency_ms, LatencySummary) and isinstance(back.instances[0], InstanceShare)
    assert back.drift is not None and back.drift.relative_l2 == 0.01
    assert back.noisy_note() == " (noisy: instance 0: call times spread)"


def test_stored_field_names_are_the_ones_best_json_and_older_studies_use():
    stored = sample_metrics().to_json()
    assert {"throughput_sps", "latency_ms", "measurement", "valid", "drift", "screening"} <= set(stored)
    assert stored["latency_ms"]["p50"] == pytest.approx(11.0) and stored["measurement"]["throughput_ci_rel"] == 0.02


def test_a_misspelt_field_is_an_error_not_none():
    metrics = sample_metrics()
    with pytest.raises(AttributeError):
        metrics.throughput_spss  # noqa: B018


def test_a_stored_record_missing_a_field_names_it():
    stored = sample_metrics().to_json()
    del stored["measurement"]["calls"]
    with pytest.raises(RecordError, match=r"trial 4: the Measurement record lacks its 'calls' field"):
        TrialMetrics.from_trial_attrs(stored, trial_number=4)


def test_fields_a_newer_version_added_are_ignored_when_read():
    stored = {**sample_metrics().to_json(), "a_future_field": 1}
    assert TrialMetrics.from_json(stored) == sample_metrics()


def test_a_failed_finalist_run_from_an_older_study_still_reads():
    run = FinalistRun.from_json({"failed": "instance 0 killed by signal SIGKILL"})
    assert run.failed and run.value is None and run.valid is False


def test_the_drift_criterion_reads_the_record():
    drift = Drift(relative_l2=0.2, cosine_similarity=0.95, top1_agreement=0.75, samples=4)
    assert DriftCriterion("relative_l2", 0.1).exceeded(drift) and not DriftCriterion("relative_l2", 0.3).exceeded(drift)
    assert DriftCriterion("top1", 0.3).drop(drift) == pytest.approx(0.25)
    assert (
        drift.reused_by_another(3).reused_from == 3 and drift.reused_by_another(3).reused_by_another(9).reused_from == 3
    )


def test_screening_counts_over_the_common_window_as_the_full_measurement_does(tmp_path):
    """A runs alone at 20 calls/s, then at 10/s beside B; B then runs alone at 20/s. Each over its own
    window A and B make 15/s, 30/s summed; while both ran (what the full measurement counts), 20/s."""
    import numpy as np

    from autotune.measure.stopwatch import instance_throughput
    from autotune.records.metrics import InstanceScreen
    from autotune.runner.trials import combine_screens

    def calls(start: float, period: float, n: int) -> np.ndarray:
        begins = start + period * np.arange(n)
        return np.stack([begins, begins + period], axis=1)

    a = np.concatenate([calls(0.0, 0.05, 10), calls(0.5, 0.1, 5)])
    b = np.concatenate([calls(0.5, 0.1, 5), calls(1.0, 0.05, 10)])
    screens = []
    for name, stamps in (("a", a), ("b", b)):
        np.save(tmp_path / f"screen-{name}.npy", stamps)
        screens.append(
            InstanceScreen(
                throughput_sps=instance_throughput(stamps, 1),
                latency_ms=latency_summary(stamps[:, 1] - stamps[:, 0]),
                stamps_path=str(tmp_path / f"screen-{name}.npy"),
            )
        )
    assert sum(s.throughput_sps for s in screens) == pytest.approx(30.0)  # what screening used to report
    screening = combine_screens(screens)
    assert screening.throughput_sps == pytest.approx(20.0) and screening.calls == 10
    assert screening.p50_ms == pytest.approx(100.0)  # the shared calls' 100 ms, not the solo 50 ms


# ---- WorkerJob: the runner's job for a worker process -------------------------------------------
# A trial job's JSON as best.json has kept it (the layout an older best.json replays from).
STORED_TRIAL_JOB = {
    "task": "trial",
    "model": ModelSource("factory", "tiny_models.py:mlp", (16,)).to_json(),
    "config": {
        "backend": "eager",
        "precision": "fp32",
        "batch_size": 4,
        "allocator": "glibc",
        "instances": 1,
        "threads_per_instance": 1,
        "options": {},
        "runtime": "main",
        "openmp": "gnu",
        "kmp_affinity": None,
        "kmp_blocktime": None,
        "thp": False,
    },
    "measure": MeasureSettings().to_json(),
    "reference_path": "/study/reference/reference.pt",
    "workdir": "/study/cache",
    "artifact_dir": None,
    "calibration_samples": 64,
    "calibration": {"data": "synthetic", "samples": 64},
}


def test_a_stored_trial_job_reads_typed_and_writes_back_the_same_layout():
    job = WorkerJob.from_json(STORED_TRIAL_JOB)
    assert isinstance(job.config, TrialConfig) and job.config.batch_size == 4
    assert isinstance(job.model, ModelSource) and isinstance(job.measure, MeasureSettings)
    assert job.instance == 0 and job.measure_drift and not job.screen and job.speed_gate is None
    assert job.to_json() == json.loads(json.dumps(STORED_TRIAL_JOB))


def test_an_instance_job_round_trips_its_nested_records():
    gate = SpeedGate(min_samples_per_s=10.0, after_s=1.0, basis="the best trial's pace")
    job = replace(
        WorkerJob.from_json(STORED_TRIAL_JOB),
        screen=True,
        measure_drift=False,
        speed_gate=gate,
        drift_bound=DriftCriterion("accuracy", 0.01),
        instance=1,
        instances=2,
        stamps_path="/t/stamps-1.npy",
    )
    data = json.loads(json.dumps(job.to_json()))
    assert data["drift_bound"] == {"metric": "accuracy", "max_drop": 0.01, "relative": False}
    assert WorkerJob.from_json(data) == job


def test_a_job_without_its_task_or_config_says_so():
    with pytest.raises(RecordError, match="'task'"):
        WorkerJob.from_json({"model": STORED_TRIAL_JOB["model"]})
    reference = WorkerJob.from_json({"task": "reference", "model": STORED_TRIAL_JOB["model"]})
    with pytest.raises(RecordError, match="'config'"):
        reference.trial_config()


def test_the_trial_job_template_keeps_the_layout_best_json_stores():
    from types import SimpleNamespace

    from autotune.runner.trials import job_template

    config = TrialConfig("eager", "fp32", 4)
    model = ModelSource("factory", "tiny_models.py:mlp", (16,))
    calibration = {"data": "synthetic", "samples": 64}
    reference = SimpleNamespace(model=model, outputs_path="/r.pt", calibration=calibration, generation=None)
    ctx = SimpleNamespace(
        reference=reference,
        measure=MeasureSettings(),
        cache_dir="/c",
        calibration_samples=64,
        server=None,
        llm_server=None,
    )
    assert list(job_template(config, ctx, None).to_json().items()) == [  # type: ignore[arg-type]
        ("format", "autotune.job/1"),  # what a worker checks before it reads the rest
        ("task", "trial"),
        ("model", model.to_json()),
        ("config", config.to_json()),
        ("measure", MeasureSettings().to_json()),
        ("reference_path", "/r.pt"),
        ("workdir", "/c"),
        ("artifact_dir", None),
        ("calibration_samples", 64),
        ("calibration", calibration),
    ]

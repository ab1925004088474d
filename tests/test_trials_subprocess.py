"""Trials in real subprocesses: environment checks from inside, pinning, crashes, hangs, pruning hooks."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from conftest import TINY, require

from autotune.common.errors import TrialFailed
from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import discover_runtimes
from autotune.measure.stopwatch import MeasureSettings
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.metrics import ThreadsCheck
from autotune.runner.launch import run_instances
from autotune.runner.trials import TrialContext, compute_reference, plan_instances, run_config

MACHINE = probe_machine()
QUICK = MeasureSettings(warmup_min_iters=2, warmup_min_s=0.1, window_min_s=0.3, window_min_iters=3, window_max_s=5)


def source(factory: str = "tiny_cnn") -> ModelSource:
    return ModelSource("factory", f"{TINY}:{factory}", (3, 16, 16))


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("study")


@pytest.fixture(scope="module")
def reference(study_dir):
    return compute_reference(source(), study_dir, eval_samples=6, timeout_s=120)


def leftover_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in (proc.info["cmdline"] or [])):
            found.append(proc)
    return found


def run(config, reference, tmp_path, timeout=120, on_stage=None, model=None, screen=False, **context):
    ref = reference if model is None else replace(reference, model=model)
    ctx = TrialContext(MACHINE, ref, QUICK, tmp_path / "cache", **context)
    metrics, launches, _ = run_config(config, ctx, tmp_path / "trial", timeout, on_stage=on_stage, screen=screen)
    return metrics, launches


@pytest.mark.parametrize("allocator", ["glibc", "tcmalloc", "jemalloc"])
def test_allocator_is_really_preloaded(allocator, reference, tmp_path):
    require(allocator == "glibc" or allocator in MACHINE.allocators, allocator)
    metrics, launches = run(TrialConfig("eager", "fp32", 2, allocator, 1, 1), reference, tmp_path)
    inst = metrics.instances[0]
    assert inst.allocator is not None and inst.allocator.verified is True
    mapped = " ".join(inst.allocator.mapped)
    if allocator == "glibc":
        assert mapped == "" and "LD_PRELOAD" not in launches[0].env
    else:
        assert allocator in mapped and launches[0].env["LD_PRELOAD"] == MACHINE.allocators[allocator]
    assert inst.threads == ThreadsCheck(asked=1, torch=1, OMP_NUM_THREADS="1")
    assert inst.cpus == [MACHINE.cores[0].cpus[0]]
    assert metrics.drift.relative_l2 < 1e-5
    assert metrics.throughput_sps == pytest.approx(
        metrics.measurement.samples / metrics.measurement.common_window_s, abs=2
    )


def _launch_with_env(reference, tmp_path, config, change):
    trial_dir = tmp_path / "t"
    (trial_dir / "barrier").mkdir(parents=True)
    job = WorkerJob(
        task="trial",
        model=reference.model,
        config=config,
        measure=QUICK,
        reference_path=None,
        workdir=str(tmp_path),
        barrier_dir=str(trial_dir / "barrier"),
        barrier_timeout_s=30,
    )
    launch = plan_instances(config, MACHINE, trial_dir, job, tmp_path, discover_runtimes()["main"])[0]
    return run_instances([replace(launch, env=change(dict(launch.env)))], 60, trial_dir / "barrier")


def test_worker_refuses_to_run_without_the_allocator_it_was_asked_for(reference, tmp_path):
    require("tcmalloc" in MACHINE.allocators, "tcmalloc")
    config = TrialConfig("eager", "fp32", 2, "tcmalloc", 1, 1)
    with pytest.raises(TrialFailed, match="environment check failed: allocator 'tcmalloc'"):
        _launch_with_env(reference, tmp_path, config, lambda env: {k: v for k, v in env.items() if k != "LD_PRELOAD"})


def test_worker_refuses_to_run_without_the_openmp_it_was_asked_for(reference, tmp_path):
    config = TrialConfig("eager", "fp32", 2, "glibc", 1, 1, openmp="intel", kmp_blocktime=1)
    with pytest.raises(
        TrialFailed, match="environment check failed: Intel OpenMP asked for, but libiomp5 is not mapped"
    ):
        _launch_with_env(reference, tmp_path, config, lambda env: {k: v for k, v in env.items() if k != "LD_PRELOAD"})


def test_worker_refuses_to_run_with_another_thread_count(reference, tmp_path):
    require(MACHINE.physical_cores >= 2, "two physical cores")
    config = TrialConfig("eager", "fp32", 2, "glibc", 1, 2)
    with pytest.raises(TrialFailed, match="environment check failed: asked for 2 threads, torch runs with 1"):
        _launch_with_env(
            reference, tmp_path, config, lambda env: {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        )


def failure_of(factory: str, reference, tmp_path) -> TrialFailed:
    """How a trial of a faulty tiny model (tiny_models.py, at its BAD_BATCH of 4) fails."""
    with pytest.raises(TrialFailed) as info:
        run(
            TrialConfig("eager", "fp32", 4),
            reference,
            tmp_path,
            model=source(factory).with_weights(reference.model.weights_path),
        )
    return info.value


def test_crashing_trial_fails_with_cause_and_stderr(reference, tmp_path):
    failed = failure_of("crashing", reference, tmp_path)
    assert "SIGABRT" in failed.cause
    assert "Fatal Python error: Aborted" in failed.stderr_tail and "forward" in failed.stderr_tail


def test_a_failing_trials_cause_is_the_errors_message_even_when_it_starts_on_a_new_line(reference, tmp_path):
    """transformers' missing-package errors start with a newline: the cause still says what is missing."""
    cause = failure_of("missing_package", reference, tmp_path).cause
    assert "ImportError: requires the protobuf library but it was not found" in cause, cause


def test_hanging_trial_is_killed_at_its_timeout_with_its_python_stacks(reference, tmp_path):
    with pytest.raises(TrialFailed, match="timed out after 6s while preparing") as info:
        run(
            TrialConfig("eager", "fp32", 4),
            reference,
            tmp_path,
            timeout=6,
            model=source("hanging").with_weights(reference.model.weights_path),
        )
    # what it was doing when its time ran out: the model's forward, in its sleep loop
    assert "tiny_models.py" in info.value.stderr_tail and "in forward" in info.value.stderr_tail, info.value.stderr_tail
    assert leftover_processes(str(tmp_path / "trial")) == []


def test_a_worker_whose_model_never_finishes_being_destroyed_still_delivers_its_result(reference, tmp_path):
    """Nothing a worker built is destroyed before its process ends (worker/teardown.py): a model whose
    destructor blocks forever measures like any other, and no process is left behind."""
    metrics, _ = run(
        TrialConfig("eager", "fp32", 2, "glibc", 1, 1),
        reference,
        tmp_path,
        timeout=30,
        model=source("blocks_at_teardown").with_weights(reference.model.weights_path),
    )
    assert metrics.measurement.calls >= QUICK.window_min_iters and metrics.throughput_sps > 0
    assert leftover_processes(str(tmp_path / "trial")) == []


def test_two_instances_run_pinned_to_disjoint_cores(reference, tmp_path):
    require(MACHINE.physical_cores >= 2, "two physical cores")
    metrics, _ = run(TrialConfig("eager", "fp32", 2, "glibc", 2, 1), reference, tmp_path)
    first, second = metrics.instances
    assert first.pid != second.pid and set(first.cpus).isdisjoint(second.cpus)
    counted = metrics.measurement.samples / metrics.measurement.common_window_s
    assert metrics.throughput_sps == pytest.approx(counted, abs=4)  # both instances' calls, over the shared window
    assert metrics.throughput_sps == pytest.approx(sum(i.common_window_sps for i in metrics.instances))
    assert metrics.measurement.combined_early_late_rel is not None  # what their drift is judged by, together


def test_ready_hook_sees_drift_and_can_stop_the_trial(reference, tmp_path):
    seen = []

    class Stop(Exception):
        pass

    def on_stage(stage, payloads):
        if stage == "ready":  # after "prepared" (the artifact, none for eager)
            seen.extend(payloads)
            raise Stop

    with pytest.raises(Stop):
        run(TrialConfig("eager", "bf16", 2), reference, tmp_path, on_stage=on_stage)
    assert seen[0]["drift"]["relative_l2"] > 0 and seen[0]["drift"]["samples"] == 6
    assert leftover_processes(str(tmp_path / "trial")) == []


def test_screening_reaches_the_hook_before_the_full_window(reference, tmp_path):
    stages = []
    metrics, _ = run(
        TrialConfig("eager", "fp32", 2),
        reference,
        tmp_path,
        screen=True,
        on_stage=lambda stage, payloads: stages.append((stage, payloads)),
    )
    assert [s for s, _ in stages] == ["prepared", "ready", "screened"]  # the artifact, then the barriers
    screening = stages[2][1][0]
    assert screening["throughput_sps"] > 0 and screening["latency_ms"]["samples"] >= 3
    assert metrics.screening.throughput_sps == pytest.approx(screening["throughput_sps"])
    noise = metrics.instances[0].noise
    assert metrics.measurement.calls >= 3 and noise is not None and noise.cpu_s > 0


def test_interference_on_the_pinned_cpu_is_flagged_after_a_retry(reference, tmp_path):
    config = TrialConfig("eager", "fp32", 2, "glibc", 1, 1)
    cpus = ",".join(map(str, config.instance_cpus(MACHINE)[0]))
    spinner = subprocess.Popen(["taskset", "-c", cpus, sys.executable, "-c", "while True: pass"])
    try:
        metrics, _ = run(config, reference, tmp_path, screen=True)
    finally:
        spinner.kill()
        spinner.wait()
    attempts = metrics.measurement.attempts
    assert metrics.screening is not None and metrics.screening.calls >= 3  # the first attempt's, kept
    assert metrics.valid is False and len(attempts) == 2  # measured, found noisy, measured again, still noisy
    assert all(any("other processes used" in flag for flag in a.noise_flags) for a in attempts)
    noise = metrics.instances[0].noise
    assert noise is not None and (noise.foreign_cpu or 0.0) > 0.3


@pytest.mark.parametrize("allocator", ["tcmalloc", "jemalloc"])
def test_openvino_runs_with_a_preloaded_allocator(allocator, reference, tmp_path):
    require(allocator in MACHINE.allocators, allocator)
    # Without TBB_ENABLE_SANITIZERS, oneTBB's RTLD_DEEPBIND makes compile_model abort with jemalloc.
    config = TrialConfig("openvino", "fp32", 2, allocator, 1, 1, {"hint": "LATENCY", "streams": 1})
    metrics, launches = run(config, reference, tmp_path)
    checked = metrics.instances[0].allocator
    assert checked is not None and checked.verified is True and checked.asked == allocator
    assert launches[0].set_env["TBB_ENABLE_SANITIZERS"] == "1"


def test_a_machine_without_pinning_tools_marks_its_measurements_unpinned(reference, tmp_path):
    pinned, pinned_launches = run(TrialConfig("eager", "fp32", 2, "glibc", 1, 1), reference, tmp_path / "pinned")
    assert pinned.measurement.pinned is True and pinned_launches[0].argv[0] in ("numactl", "taskset")
    unpinned_ctx = TrialContext(replace(MACHINE, pinning="none"), reference, QUICK, tmp_path / "cache")
    metrics, launches, _ = run_config(TrialConfig("eager", "fp32", 2, "glibc", 1, 1), unpinned_ctx, tmp_path / "t", 120)
    assert metrics.measurement.pinned is False and launches[0].argv[0] not in ("numactl", "taskset")


def test_a_trial_is_not_timed_while_processes_it_started_are_busy(reference, tmp_path):
    """A library may start processes beside the timed calls (importing IPEX starts torch inductor's
    compile-worker pool: 31% of an instance's CPUs taken during an IPEX winner's window, measured at 0.4x
    its speed through autotune.load()). The warm-up waits until the processes a trial started are quiet,
    so the window is clean; their time is counted as theirs, never as another program's."""
    from tiny_models import BUSY_CHILD_S

    config = TrialConfig("eager", "fp32", 2, "glibc", 1, 1)
    model = source("spawns_busy_child").with_weights(reference.model.weights_path)
    metrics, _ = run(config, reference, tmp_path, model=model)
    assert metrics.valid, metrics.noise_flags
    warmup = metrics.measurement.warmup
    assert warmup.s >= BUSY_CHILD_S * 0.8, warmup  # it waited for the busy process (QUICK warms up 0.1 s)
    # what the busy process used meanwhile (less than its wall time where other load shares its CPU)
    assert warmup.children_cpu_s is not None and warmup.children_cpu_s > BUSY_CHILD_S * 0.2, warmup
    noise = metrics.instances[0].noise
    assert noise is not None and (noise.foreign_cpu or 0.0) < 0.15 and (noise.own_children_cpu or 0.0) < 0.15


def test_processes_a_trial_started_that_stay_busy_are_named_as_its_own_not_as_other_programs(reference, tmp_path):
    """Past the warm-up's cap (QUICK's: 10 s) a busy process it started is still running in the window: the
    measurement is flagged for it in its own words, and nothing is blamed on other programs."""
    config = TrialConfig("eager", "fp32", 2, "glibc", 1, 1)
    model = source("spawns_long_busy_child").with_weights(reference.model.weights_path)
    capped = replace(QUICK, warmup_max_s=0.5)
    ctx = TrialContext(MACHINE, replace(reference, model=model), capped, tmp_path / "cache", noisy_retries=0)
    metrics, _, _ = run_config(config, ctx, tmp_path / "trial", 120)
    assert any("processes it started itself used" in flag for flag in metrics.noise_flags), metrics.noise_flags
    assert not any("other processes used" in flag for flag in metrics.noise_flags), metrics.noise_flags
    noise = metrics.instances[0].noise
    assert noise is not None and (noise.own_children_cpu or 0.0) > 0.3 and (noise.foreign_cpu or 0.0) < 0.15

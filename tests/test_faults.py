"""Fault injection with real processes: trials that crash, hang, leak memory, leave without a result or
lose one instance; an orchestrator killed or interrupted; no configuration meeting the drift bound;
a full artifact cache. After each, the study's state is checked: nothing lost, nothing left running."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import AUTOTUNE, load_study, states, tiny, write_space
from test_trials_subprocess import leftover_processes


def search(searcher, model: str, *extra: str, space=None, timeout: float = 300):
    space = space or searcher.space(batch_size=[4])
    return searcher.search(*extra, model=tiny(model), space=space, timeout=timeout)


@pytest.mark.parametrize(
    "model,extra,cause",
    [
        ("segfaulting", [], "killed by signal SIGSEGV"),
        ("silent_exit", [], "exited without a valid result"),
        ("memory_hog", ["--memory-limit", "1G"], "over the trial memory limit of 1024 MiB"),
        ("hanging", ["--trial-timeout", "8s"], "timed out after 8s"),
    ],
)
def test_a_faulty_trial_fails_with_its_cause_and_the_study_goes_on(searcher, workdir, model, extra, cause):
    result = search(searcher, model, "--trials", "2", *extra)
    assert result.returncode == 0, result.stderr
    study = load_study(workdir, "s")
    assert states(study) == ["FAIL", "FAIL"]  # the first failure did not stop the second trial
    for trial in study.trials:
        assert cause in trial.user_attrs["fail_cause"], trial.user_attrs["fail_cause"]
        assert "stderr_tail" in trial.user_attrs
        assert leftover_processes(trial.user_attrs["trial_dir"]) == []
    assert "no trial completed" in result.stdout


def test_one_instance_dying_takes_its_siblings_down_and_is_recorded(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[4], instances=[2], threads_per_instance=[1])
    result = search(searcher, "dies_on_last_cpu", "--trials", "1", space=space)
    assert result.returncode == 0, result.stderr
    trial = load_study(workdir, "s").trials[0]
    assert trial.state.name == "FAIL" and trial.user_attrs["fail_cause"] == "instance 1 killed by signal SIGABRT"
    assert "Fatal Python error: Aborted" in trial.user_attrs["stderr_tail"]
    assert leftover_processes(trial.user_attrs["trial_dir"]) == []  # instance 0 was running: killed too


def test_a_killed_orchestrator_leaves_nothing_running_and_its_trial_is_failed_on_resume(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[4])
    args = [*AUTOTUNE, *searcher.search_args(model=tiny("hanging"), space=space, budget="5m")]
    proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trial_dir = workdir / "studies" / "s" / "trials" / "00000"
    deadline = time.monotonic() + 60
    while not (trial_dir / "stderr-0.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    proc.kill()  # SIGKILL: no handler runs in the orchestrator
    proc.wait()
    deadline = time.monotonic() + 10
    while leftover_processes(str(trial_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftover_processes(str(trial_dir)) == []
    assert states(load_study(workdir, "s")) == ["RUNNING"]
    again = search(searcher, "hanging", "--trials", "1", "--trial-timeout", "5s", space=space)
    assert again.returncode == 0, again.stderr
    assert (
        f"trial 0: the autotune process running it (host {socket.gethostname()}, pid {proc.pid}) died" in again.stdout
    )
    first, retry = load_study(workdir, "s").trials
    assert first.state.name == "FAIL" and "died" in first.user_attrs["fail_cause"]
    assert retry.user_attrs["retry_of"] == 0 and retry.params == first.params  # its configuration, queued again


def test_best_json_is_always_whole_when_export_is_killed_or_interrupted(searcher, workdir):
    assert search(searcher, "tiny_cnn", "--trials", "2").returncode == 0
    best = workdir / "studies" / "s" / "best.json"
    original = json.loads(best.read_text())
    rng = random.Random(7)
    for attempt in range(8):
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", "export", "--study", "s"],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(rng.uniform(0.2, 2.5))  # start-up, loading the study, writing: anywhere
        proc.send_signal(signal.SIGKILL if attempt % 2 else signal.SIGINT)
        proc.communicate(timeout=60)
        document = json.loads(best.read_text())  # never half a file: the old one or the new one
        assert document["schema"] == original["schema"] and document["config"] == original["config"]


def test_when_no_config_meets_the_drift_bound_the_closest_is_exported_and_marked(searcher, workdir):
    space = write_space(
        workdir / "space.yaml",
        backends={"eager": {"precision": ["bf16"], "memory_format": ["contiguous", "channels_last"]}},
    )
    result = search(searcher, "tiny_cnn", "--trials", "3", "--max-drift", "1e-5", space=space)
    assert result.returncode == 0, result.stderr
    assert "no trial met the drift bound" in result.stdout
    study = load_study(workdir, "s")
    assert set(states(study)) == {"PRUNED"}
    best = json.loads((workdir / "studies" / "s" / "best.json").read_text())
    assert best["meets_drift"] is False and best["metrics"] is None and "NO configuration met" in best["selection"]
    drops = {t.number: t.user_attrs["drift"]["relative_l2"] for t in study.trials}
    assert best["study"]["trial"] == min(drops, key=lambda n: (drops[n], n))
    assert (
        best["drift"]["drop"] == pytest.approx(min(drops.values()))
        and best["drift"]["drop"] > best["drift"]["max_drift"]
    )
    assert best["config"] == study.trials[best["study"]["trial"]].user_attrs["config"]


def test_the_artifact_cache_evicts_the_least_recently_used_past_its_cap(searcher, workdir):
    space = write_space(
        workdir / "space.yaml",
        batch_size=[4],
        backends={"onnxruntime": {"precision": ["fp32", "int8"]}, "openvino": {"precision": ["fp32"], "streams": [1]}},
    )
    result = search(
        searcher,
        "tiny_cnn",
        "--trials",
        "3",
        "--no-speed-pruning",
        "--cache-size",
        "1K",
        "--calibration-samples",
        "8",
        space=space,
    )
    assert result.returncode == 0, result.stderr
    trials = load_study(workdir, "s").trials
    assert states(load_study(workdir, "s")) == ["COMPLETE"] * 3
    built = [t.user_attrs["artifact"] for t in trials]
    assert built[0]["evicted"] == [] and len(built[1]["evicted"]) == 1 and len(built[2]["evicted"]) == 1
    assert built[1]["evicted"][0] == built[0]["dir"].rsplit("/", 1)[1]  # the least recently used went first
    remaining = [p for p in (workdir / "studies" / ".cache" / "artifacts").iterdir() if p.is_dir()]  # lock files stay
    assert [p.name for p in remaining] == [built[2]["dir"].rsplit("/", 1)[1]]

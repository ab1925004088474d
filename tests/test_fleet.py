"""One study, several workers, through a real PostgreSQL (and MariaDB) server: a worker killed mid-trial
has its trial failed by heartbeat and retried by another, nothing is lost or run twice, a second worker
on the same cores of a host is refused, and the winner is exported from a machine that ran nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import FAST, require, tiny, write_space

# every test here runs searches end to end, in workers pinned as a user pins them
pytestmark = pytest.mark.usefixtures("end_to_end")

STUDY = ["--study", "fleet"]
MODEL = ["--model", tiny(), "--input-shape", "3x16x16"]
FINISHED = {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL}


def pinned(cpus: str, *args: str, cwd: Path) -> subprocess.Popen:
    """autotune started as a user pins a worker: taskset -c CPUS autotune ..."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        ["taskset", "-c", cpus, sys.executable, "-m", "autotune.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def load(url: str) -> optuna.study.Study:
    from autotune.common.storage_urls import database_url

    return optuna.load_study(study_name="fleet", storage=database_url(url))


def running_trial_of(url: str, pid: int, timeout_s: float = 120) -> optuna.trial.FrozenTrial:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for trial in load(url).get_trials(states=(optuna.trial.TrialState.RUNNING,)):
            if (trial.user_attrs.get("orchestrator") or {}).get("pid") == pid and "config" in trial.user_attrs:
                return trial
        time.sleep(0.3)
    pytest.fail(f"worker {pid} started no trial within {timeout_s}s")


def kill_mid_trial(url: str, worker: subprocess.Popen) -> optuna.trial.FrozenTrial:
    """SIGKILL a worker a second into one of its trials, that trial still running (a short trial can end
    within the second, and the kill would then land between trials or in the next one)."""
    for _ in range(20):
        trial = running_trial_of(url, worker.pid)
        time.sleep(1.0)  # its trial's processes are measuring
        if load(url).trials[trial.number].state == optuna.trial.TrialState.RUNNING:
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
            assert load(url).trials[trial.number].state == optuna.trial.TrialState.RUNNING
            return trial
    pytest.fail(f"every trial of worker {worker.pid} ended within a second of starting")


def test_two_workers_share_a_postgres_study_and_a_killed_workers_trial_is_failed_by_heartbeat_and_retried(
    workdir, postgres
):
    require(len(os.sched_getaffinity(0)) >= 2, "two CPUs (two workers pinned to disjoint cores)")
    url = postgres()
    space = write_space(workdir / "space.yaml", batch_size=[2, 4, 8], threads_per_instance=[1])
    created = pinned(
        "0", "search", *MODEL, *STUDY, "--storage", url, "--space", str(space), "--trials", "1", *FAST, cwd=workdir
    )
    code, out, err = finish(created)
    assert code == 0, err
    assert "created study 'fleet' in postgresql://autotune@127.0.0.1" in out

    grace = ["--heartbeat-grace", "4s"]
    worker = ["join", *STUDY, "--storage", url, *grace]
    doomed = pinned("0", *worker, "--trials", "3", "--studies-dir", "studies-a", cwd=workdir)
    survivor = pinned("1", *worker, "--trials", "5", "--studies-dir", "studies-b", cwd=workdir)
    killed = kill_mid_trial(url, doomed)

    # Beside the survivor, on its cores: refused (timing on shared cores corrupts both).
    code, _, err = finish(pinned("1", *worker, "--trials", "1", "--studies-dir", "studies-c", cwd=workdir), timeout=120)
    assert code == 2 and "overlap" in err and f"pid {survivor.pid}" in err, err

    code, out, err = finish(survivor)
    assert code == 0, err
    assert f"trial {killed.number}: its worker (host " in out and "no heartbeat for over 4s" in out, out

    study = load(url)
    trials = study.get_trials()
    owners = [t.user_attrs["orchestrator"]["pid"] for t in trials]
    assert all(t.state in FINISHED for t in trials), [t.state.name for t in trials]  # nothing left running or waiting
    assert owners.count(survivor.pid) == 5 and owners.count(created.pid) == 1  # each worker's --trials, exactly
    assert len(trials) == 1 + 5 + owners.count(doomed.pid)  # and nothing else: no trial lost or run twice
    assert all(t.user_attrs.get("host") for t in trials)

    dead = study.trials[killed.number]
    assert dead.state == optuna.trial.TrialState.FAIL
    assert (
        "no heartbeat for over 4s" in dead.user_attrs["fail_cause"]
        and f"pid {doomed.pid}" in dead.user_attrs["fail_cause"]
    )
    retries = [t for t in trials if t.user_attrs.get("retry_of") == killed.number]
    assert len(retries) == 1 and retries[0].params == dead.params  # queued once, run once, by the survivor
    assert retries[0].state != optuna.trial.TrialState.FAIL and owners[retries[0].number] == survivor.pid
    assert sum(1 for t in trials if t.user_attrs.get("baseline") and "retry_of" not in t.user_attrs) == 1

    # Export from a machine that ran none of it: only the storage URL (from the environment, as a fleet keeps it).
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    exported = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "export", *STUDY, "-o", "best.json"],
        cwd=elsewhere,
        env={**os.environ, "AUTOTUNE_STORAGE": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    best = json.loads((elsewhere / "best.json").read_text())
    clean = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert best["study"]["trial"] == max(clean, key=lambda t: t.value).number
    assert best["study"]["storage"].startswith("postgresql://autotune@127.0.0.1")


def test_a_trial_failed_by_optunas_own_heartbeat_check_carries_its_cause_and_is_queued_again(workdir):
    """Optuna fails stale trials itself at the start of every trial, besides autotune's check after every
    trial: whichever gets there first, the trial says which worker went silent and runs again."""
    from autotune.records.attributes import Attr
    from autotune.tuning.storage import open_storage

    said: list[str] = []
    storage = open_storage(f"sqlite:///{workdir / 'fleet.db'}", grace_period_s=2, say=said.append)
    study = optuna.create_study(study_name="fleet", storage=storage)
    trial = study.ask()
    trial.suggest_categorical("batch_size", [2, 4, 8])
    trial.set_user_attr(Attr.ORCHESTRATOR, {"host": "node-7", "pid": 4242, "started": 1.0, "cpus": [0]})
    storage.record_heartbeat(trial._trial_id)
    time.sleep(3.5)  # past the 2 s grace

    optuna.storages.fail_stale_trials(study)  # what optimize() runs before each trial

    dead = study.trials[trial.number]
    assert dead.state == optuna.trial.TrialState.FAIL
    cause = dead.user_attrs.get(Attr.FAIL_CAUSE, "")
    assert "host node-7, pid 4242" in cause and "no heartbeat for over 2s" in cause, dead.user_attrs
    retries = [t for t in study.trials if t.user_attrs.get(Attr.RETRY_OF) == trial.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.WAITING
    assert said == [f"trial {trial.number}: {cause}; marked FAIL and its configuration queued again"]


def test_a_search_runs_on_mysql_and_resumes_there(searcher, workdir, mariadb):
    url = mariadb()
    space = write_space(workdir / "space.yaml", batch_size=[2, 4], threads_per_instance=[1])
    args = ["search", *MODEL, *STUDY, "--storage", url, "--space", str(space), "--trials", "1", *FAST]
    first = searcher(*args)
    assert first.returncode == 0, first.stderr
    again = searcher(*args)
    assert again.returncode == 0, again.stderr
    assert "resuming study 'fleet' in mysql://autotune@127.0.0.1" in again.stdout
    study = load(url)
    assert len(study.trials) == 2 and all(t.state != optuna.trial.TrialState.FAIL for t in study.trials)
    assert (workdir / "studies" / "fleet" / "best.json").exists()


def test_the_fleet_guide_uses_real_options_and_valid_manifests():
    """docs/manual/fleet.md: every autotune command parses with the real CLI, the Kubernetes Job is valid YAML
    whose command does too, and the systemd unit's ExecStart as well."""
    import shlex

    import yaml

    from autotune.cli import build_parser

    guide = (Path(__file__).resolve().parent.parent / "docs" / "manual" / "fleet.md").read_text()
    parser = build_parser()
    commands = [
        line.split("#")[0].strip()
        for line in guide.splitlines()
        if "autotune " in line and not line.startswith(("#", "|"))
    ]
    commands = [c[c.index("autotune ") :] for c in commands if c.startswith(("autotune ", "numactl ", "ExecStart="))]
    assert len(commands) >= 8
    for command in commands:
        parser.parse_args(shlex.split(command)[1:])  # an unknown option raises (exit 2)
    job = next(doc for block in guide.split("```yaml")[1:] for doc in yaml.safe_load_all(block.split("```")[0]))
    container = job["spec"]["template"]["spec"]["containers"][0]
    parser.parse_args(container["command"][1:])
    assert job["kind"] == "Job" and job["spec"]["parallelism"] == job["spec"]["completions"]

"""Several autotune processes on one study: who runs what where, and the trials of one that died.

Optuna's heartbeat tells that a trial's process stopped; this module adds what a user needs to act on
it: the cause on the failed trial (which host and pid went silent), a retry of the same configuration
picked up by whichever worker asks next, and a refusal to let two processes time trials on the same
cores of one host, which would corrupt both measurements.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Callable
from typing import Any

import optuna
import psutil

from autotune.common.errors import UserError
from autotune.machine.probe import format_cpu_ranges
from autotune.records.attributes import Attr, Orchestrator, TrialAttrs

MAX_RETRIES = 2  # a configuration whose orchestrator died twice in a row is not tried a third time
KEPT_ON_RETRY = (
    "baseline",
    "coverage",
    "prior",
    "layout",
    "order",
    "mix_share",
)  # why the trial was enqueued: the retry plays the same role (and a mix's share: the retry runs the same mix)
WORKER_KEY = "worker:"


def orchestrator_record() -> dict[str, Any]:
    """Who runs a trial: host, pid, the process's start time (a pid can be reused) and its CPUs."""
    return Orchestrator(
        host=socket.gethostname(),
        pid=os.getpid(),
        started=psutil.Process().create_time(),
        cpus=sorted(os.sched_getaffinity(0)),
    ).to_json()


def is_alive(record: Orchestrator) -> bool:
    """Whether the process a record names still runs (on this host)."""
    if record.pid is None or record.started is None:
        return False
    try:
        return abs(psutil.Process(record.pid).create_time() - record.started) < 1.0
    except (psutil.Error, TypeError):
        return False


def _or_unknown(value: Any) -> Any:
    return "?" if value is None else value


def retry_abandoned_trial(study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Enqueue the configuration of a trial whose orchestrator died, for whichever one asks next.

    Optuna's RetryFailedTrialCallback would copy every user attribute, the dead trial's cause and
    config included; the retry carries only why it was enqueued and which trial it repeats."""
    retries = TrialAttrs.of(trial).retries
    params = trial.params or trial.system_attrs.get("fixed_params")  # an enqueued trial that died before suggesting
    if not params or retries >= MAX_RETRIES:
        return
    kept = {key: trial.user_attrs[key] for key in KEPT_ON_RETRY if key in trial.user_attrs}
    study.enqueue_trial(params, user_attrs={**kept, Attr.RETRY_OF: trial.number, Attr.RETRIES: retries + 1})


# How the causes of trials whose process went away begin: the trial said nothing of its configuration.
SILENT_WORKER = "its worker ("
DEAD_ORCHESTRATOR = "the autotune process running it ("
ABANDONED = (SILENT_WORKER, DEAD_ORCHESTRATOR)


def silent_worker_cause(trial: optuna.trial.FrozenTrial, grace_s: Any) -> str:
    """Why a trial whose heartbeat stopped is failed: which host and pid went silent."""
    owner = TrialAttrs.of(trial).orchestrator or Orchestrator()
    where = f"host {_or_unknown(owner.host)}, pid {_or_unknown(owner.pid)}"
    return f"{SILENT_WORKER}{where}) sent no heartbeat for over {grace_s}s: it died or lost the database"


def dead_orchestrator_cause(host: str, pid: int | None) -> str:
    """Why a trial left running by a process of this host that is gone is failed."""
    return f"{DEAD_ORCHESTRATOR}host {host}, pid {_or_unknown(pid)}) died"


def record_silent_worker(storage: optuna.storages.BaseStorage, trial_id: int, grace_s: Any) -> None:
    """Write the cause on a trial found stale, before anyone fails it: Optuna's own check (at the start of
    every trial) and ours (after every trial) find the same trials, and whichever fails it, the cause is
    already there (a finished trial's attributes can no longer be written)."""
    trial = storage.get_trial(trial_id)
    if trial.state != optuna.trial.TrialState.RUNNING or TrialAttrs.of(trial).fail_cause is not None:
        return
    try:
        storage.set_trial_user_attr(trial_id, Attr.FAIL_CAUSE, silent_worker_cause(trial, grace_s))
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # another orchestrator failed it first, with the same cause


class SilentWorkerRetry:
    """The storage's callback for each trial whose heartbeat stopped that this process failed: queue its
    configuration again and say so."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.say = say

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        retry_abandoned_trial(study, trial)
        if self.say is not None:
            cause = TrialAttrs.of(trial).fail_cause or "its worker sent no heartbeat"
            self.say(f"trial {trial.number}: {cause}; marked FAIL and its configuration queued again")


def fail_abandoned_trials(study: optuna.study.Study, say: Callable[[str], None], dead_pids: bool = True) -> None:
    """Fail the trials left RUNNING by a process that died, with the cause, and queue each again.

    An orchestrator anywhere is found dead by its stale heartbeat, through Optuna's own check (the storage
    records the cause and its callback retries and says so); with `dead_pids` (when a run starts: a crashed
    run being resumed) one of this host also by its pid being gone, without waiting."""
    storage = study._storage
    host = socket.gethostname()
    if dead_pids:
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            owner = TrialAttrs.of(trial).orchestrator or Orchestrator()
            if owner.host != host or owner.pid == os.getpid() or is_alive(owner):
                continue
            cause = dead_orchestrator_cause(host, owner.pid)
            try:
                storage.set_trial_user_attr(trial._trial_id, Attr.FAIL_CAUSE, cause)
                if not storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another orchestrator failed it first
            retry_abandoned_trial(study, storage.get_trial(trial._trial_id))
            say(f"trial {trial.number}: {cause}; marked FAIL and its configuration queued again")
    with warnings.catch_warnings():  # Optuna marks fail_stale_trials experimental; it does nothing without heartbeats
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class AbandonedTrialsCheck:
    """Optuna callback: after every trial, fail the trials of orchestrators whose heartbeat stopped (Optuna
    checks only at a trial's start, so a worker's last trial would otherwise leave them running)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        fail_abandoned_trials(study, self.say, dead_pids=False)


def register_orchestrator(study: optuna.study.Study) -> dict[str, Any]:
    """Record this process as an orchestrator of the study, and refuse to start beside an earlier live one
    of the same host whose CPUs overlap ours: trials timed on shared cores corrupt each other."""
    me = orchestrator_record()
    storage = study._storage
    storage.set_study_system_attr(study._study_id, f"{WORKER_KEY}{me['host']}:{me['pid']}", me)
    for key, stored in storage.get_study_system_attrs(study._study_id).items():
        if not key.startswith(WORKER_KEY):
            continue
        other = Orchestrator.from_json(stored)
        if other.host != me["host"] or other.pid == me["pid"]:
            continue
        earlier = (other.started or 0, other.pid or 0) < (me["started"], me["pid"])
        shared = sorted(set(other.cpus or ()) & set(me["cpus"]))
        if earlier and shared and is_alive(other):
            raise UserError(
                f"another autotune process (pid {other.pid}) is timing trials of study {study.study_name!r} on "
                "this host "
                f"on CPUs {format_cpu_ranges(other.cpus)}, which overlap this one's "
                f"({format_cpu_ranges(me['cpus'])}): "
                "parallel timing on shared cores corrupts both; pin each to its own cores (e.g. 'taskset -c 0-7 "
                "autotune join ...' "
                "and 'taskset -c 8-15 autotune join ...') or wait for it to finish"
            )
    return me

"""What a trial writes into its Optuna user attributes.

The study is the search's only record: the report, the finalists, a resumed run and other hosts of a fleet
read a trial's config, the keys its drift and fallbacks are reused by, its metrics, how to launch it again,
and, when it failed, the cause and its log. Everything a trial stores is written here.
"""

from __future__ import annotations

import socket
from pathlib import Path

import optuna

from autotune.common.errors import TrialFailed
from autotune.machine.probe import MachineProbe
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.config import TrialConfig, pin_prefix
from autotune.records.job import WorkerJob
from autotune.records.metrics import TrialMetrics
from autotune.records.spec import SearchSpec
from autotune.results.optuna_artifacts import attach_trial_log
from autotune.runner.launch import InstanceLaunch


def record_suggested(
    trial: optuna.trial.Trial,
    config: TrialConfig,
    numerics_key: str,
    drift_reference: str,
    fallback_key: str,
    mixed_hardware: list[str] | None,
) -> None:
    """The sampled config and the keys later trials look it up by: its numerics (for drift), the reference
    its drift is measured against, its numerics without scheduling options (for fallbacks), and its host."""
    trial.set_user_attr(Attr.CONFIG, config.to_json())
    trial.set_user_attr(Attr.CONFIG_SUMMARY, config.summary())
    trial.set_user_attr(Attr.NUMERICS_KEY, numerics_key)
    trial.set_user_attr(Attr.DRIFT_REFERENCE, drift_reference)  # what its drift is measured against
    trial.set_user_attr(Attr.FALLBACK_KEY, fallback_key)
    trial.set_user_attr(Attr.HOST, socket.gethostname())
    if mixed_hardware:
        trial.set_user_attr(Attr.MIXED_HARDWARE, mixed_hardware)


def record_completed(
    trial: optuna.trial.Trial,
    spec: SearchSpec,
    machine: MachineProbe,
    config: TrialConfig,
    trial_dir: Path,
    metrics: TrialMetrics,
    launches: list[InstanceLaunch],
    template: WorkerJob,
) -> None:
    """Everything a completed trial stores: its metrics field by field, and how to launch it again."""
    for key, value in metrics.to_json().items():
        trial.set_user_attr(key, value)
    commands = [launch.shell_command() for launch in launches]
    trial.set_user_attr(Attr.ENV, launches[0].set_env)
    trial.set_user_attr(Attr.COMMANDS, commands)
    trial.set_user_attr(Attr.PIN_PREFIXES, [pin_prefix(cpus, machine) for cpus in config.instance_cpus(machine)])
    trial.set_user_attr(Attr.JOB, template.to_json())
    trial.set_user_attr(Attr.PINNING, machine.pinning)
    trial.set_user_attr(Attr.MEASURE_SETTINGS, spec.measure.to_json())
    trial.set_user_attr(Attr.TRIAL_DIR, str(trial_dir))
    attach_trial_log(trial, spec.dir, trial_dir, TrialAttrs(commands=commands))


def record_failure(
    trial: optuna.trial.Trial, spec: SearchSpec, trial_dir: Path, timeout: float, exc: TrialFailed
) -> None:
    """The cause (a timeout cut short by the budget says so), what the failure carried, and the log's tail."""
    cause = exc.cause
    if "timed out" in cause and timeout < spec.trial_timeout_s:
        cause = f"budget ran out: {cause}"
    trial.set_user_attr(Attr.FAIL_CAUSE, cause)
    for key, value in exc.attrs.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr(Attr.STDERR_TAIL, exc.stderr_tail[-3000:])
    trial.set_user_attr(Attr.TRIAL_DIR, str(trial_dir))
    attach_trial_log(trial, spec.dir, trial_dir, TrialAttrs(fail_cause=cause))


def record_pruned(trial: optuna.trial.Trial, spec: SearchSpec, trial_dir: Path) -> None:
    """A trial pruned at a barrier keeps its log, which says how far it got."""
    attach_trial_log(trial, spec.dir, trial_dir, TrialAttrs())


def record_interrupted(trial: optuna.trial.Trial) -> None:
    """Ctrl-C (or SIGTERM / SIGHUP) stopped the trial: said so, not left looking like a crash."""
    trial.set_user_attr(Attr.FAIL_CAUSE, "interrupted (Ctrl-C)")

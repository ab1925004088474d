"""The search: an Optuna study whose objective measures one configuration in fresh processes.

Creates or resumes the study, computes the FP32 reference once, enqueues the eager baseline,
runs trials within the wall-clock budget, and exports the winner. Ctrl-C loses nothing.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from rich.live import Live

from autotune.common.errors import TrialFailed, UserError
from autotune.common.storage_urls import mask_url
from autotune.machine.fingerprint import fingerprint
from autotune.machine.probe import MachineProbe, probe_machine
from autotune.machine.runtimes import discover_runtimes
from autotune.records.config import pin_prefix
from autotune.results.best_json import closest_candidate, export_best
from autotune.results.optuna_artifacts import attach_to_study, attach_trial_log
from autotune.results.progress import LiveStatus, ProgressPrinter
from autotune.results.selection import baseline_trial
from autotune.runner.trials import TrialContext, compute_reference, run_config, screening_value
from autotune.search.finalists import run_finalists
from autotune.search.fleet import AbandonedTrialsCheck, fail_abandoned_trials, orchestrator_record, register_worker
from autotune.search.pruners import DriftPruner, SpeedPruner
from autotune.search.space import InfeasibleConfig, SearchSpace
from autotune.search.spec import SearchSpec, identity_differences
from autotune.search.storage import open_storage

MIN_TRIAL_S = 10.0


@dataclass
class SearchOutcome:
    study: optuna.study.Study
    best_path: Path | None
    interrupted: bool = False


def baseline_throughput(study: optuna.study.Study) -> float | None:
    trial = baseline_trial(study)
    return trial.user_attrs.get("throughput_sps") if trial else None


def open_study(
    spec: SearchSpec, machine: MachineProbe, runtimes: dict[str, Any] | None = None
) -> tuple[optuna.study.Study, bool]:
    """Create the study, or resume it after checking the settings are the same."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(spec.storage, spec.heartbeat_grace_s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True)
    study = optuna.create_study(
        study_name=spec.study,
        storage=storage,
        directions=spec.directions,
        sampler=sampler,
        pruner=DriftPruner(spec.criterion, wrapped=SpeedPruner() if spec.speed_pruning else None),
        load_if_exists=True,
    )
    if not study.metric_names:  # how optuna-dashboard labels the objectives
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(
                {
                    "throughput": ["samples/s"],
                    "latency": ["p50 ms per call"],
                    "pareto": ["samples/s", "p99 ms per call"],
                }[spec.objective]
            )
    stored = study.user_attrs.get("spec")
    if stored is None:
        study.set_user_attr("spec", {**spec.to_dict(), "storage": mask_url(spec.storage)})
        study.set_user_attr("fingerprint", fingerprint(machine, runtimes))
        return study, True
    stored_identity = {k: stored.get(k) for k in spec.identity()}
    diffs = identity_differences(stored_identity, spec.identity())
    if diffs:
        raise UserError(
            f"study {spec.study!r} exists with different settings ({'; '.join(diffs)}): "
            "rerun with the same settings to resume, or pick a new --study name"
        )
    return study, False


class Objective:
    """Optuna objective: suggest a config, measure it in fresh processes, record everything."""

    def __init__(self, spec: SearchSpec, space: SearchSpace, ctx: TrialContext, deadline: float) -> None:
        self.spec, self.space, self.ctx, self.deadline = spec, space, ctx, deadline
        self.status: LiveStatus | None = None  # the live panel, told which trial runs

    def __call__(self, trial: optuna.trial.Trial) -> float:
        trial.set_user_attr("orchestrator", orchestrator_record())  # first: a run that dies from here on is detected
        try:
            config = self.space.suggest(trial)
        except InfeasibleConfig as exc:
            trial.set_user_attr("prune_reason", f"not launched: {exc}")
            raise optuna.TrialPruned(str(exc)) from None
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("config_summary", config.summary())
        if self.status is not None:
            self.status.running = f"trial {trial.number}: {config.summary()}"
        trial.set_user_attr("numerics_key", config.numerics_key())
        trial.set_user_attr("host", socket.gethostname())
        if self.spec.mixed_hardware:
            trial.set_user_attr("mixed_hardware", self.spec.mixed_hardware)
        remaining = self.deadline - time.monotonic()
        timeout = min(self.spec.trial_timeout_s, remaining)
        trial_dir = self.spec.dir / "trials" / f"{trial.number:05d}"
        known_drift = same_numerics_drift(trial.study, config.numerics_key())
        if known_drift is not None:
            trial.set_user_attr("drift", known_drift)
            if self._drift_prunes(trial, known_drift):
                verdict = self.spec.criterion.verdict(known_drift)
                reason = f"{verdict}, as measured by trial {known_drift['reused_from']} (same numerics): not launched"
                trial.set_user_attr("prune_reason", reason)
                raise optuna.TrialPruned(reason)

        def on_stage(stage: str, payloads: list[dict[str, Any]]) -> None:
            if stage == "ready":
                drift = payloads[0].get("drift")
                if drift is None:
                    return  # reused: already judged before launch
                trial.set_user_attr("drift", drift)
                if self._drift_prunes(trial, drift):
                    reason = self.spec.criterion.verdict(drift)
                    trial.set_user_attr("prune_reason", reason)
                    raise optuna.TrialPruned(reason)
            elif stage == "screened":
                screening = screening_value(payloads)
                trial.set_user_attr("screening", screening)
                value = screening["throughput_sps"] if self.spec.objective == "throughput" else screening["p50_ms"]
                trial.report(value, step=0)
                if trial.should_prune():
                    speed = getattr(trial.study.pruner, "wrapped", None)
                    verdict = (
                        speed.verdict(trial.study, value, screening["ci_rel"])
                        if isinstance(speed, SpeedPruner)
                        else None
                    )
                    unit = "samples/s" if self.spec.objective == "throughput" else "ms"
                    reason = (
                        f"screening {value:.3g} {unit} is clearly worse than the best clean trial "
                        f"#{verdict['best_trial']} ({verdict['best_value']:.3g} {unit}, margin "
                        f"{verdict['margin']:.0%} with its noise)"
                        if verdict
                        else f"screening {value:.3g} {unit}: pruned"
                    )
                    trial.set_user_attr("prune_reason", reason)
                    raise optuna.TrialPruned(reason)

        try:
            metrics, launches, template = run_config(
                config,
                self.ctx,
                trial_dir,
                timeout,
                on_stage=on_stage,
                screen=self.spec.speed_pruning and self.spec.measure.screen_s > 0,
                known_drift=known_drift,
            )
            value = objective_value(self.spec.objective, metrics)
        except TrialFailed as exc:
            cause = exc.cause
            if "timed out" in cause and timeout < self.spec.trial_timeout_s:
                cause = f"budget ran out: {cause}"
            trial.set_user_attr("fail_cause", cause)
            trial.set_user_attr("stderr_tail", exc.stderr_tail[-3000:])
            trial.set_user_attr("trial_dir", str(trial_dir))
            attach_trial_log(trial, self.spec.dir, trial_dir, {"fail_cause": cause})
            raise
        except optuna.TrialPruned:
            attach_trial_log(trial, self.spec.dir, trial_dir, {})
            raise
        except KeyboardInterrupt:
            trial.set_user_attr("fail_cause", "interrupted (Ctrl-C)")
            raise
        for key, metric in metrics.items():
            trial.set_user_attr(key, metric)
        commands = [launch.shell_command() for launch in launches]
        trial.set_user_attr("env", launches[0].set_env)
        trial.set_user_attr("commands", commands)
        trial.set_user_attr(
            "pin_prefixes", [pin_prefix(cpus, self.ctx.machine) for cpus in config.instance_cpus(self.ctx.machine)]
        )
        trial.set_user_attr("job", template)
        trial.set_user_attr("pinning", self.ctx.machine.pinning)
        trial.set_user_attr("measure_settings", self.spec.measure.to_dict())
        trial.set_user_attr("trial_dir", str(trial_dir))
        attach_trial_log(trial, self.spec.dir, trial_dir, {"commands": commands})
        if self.spec.slo_ms is not None:
            self._check_slo(trial, metrics)
        return value

    def _drift_prunes(self, trial: optuna.trial.Trial, drift: dict[str, Any]) -> bool:
        """Optuna's pruner decides (DriftPruner); a multi-objective study cannot ask it, so the same
        criterion is applied directly there."""
        if len(trial.study.directions) > 1:
            return self.spec.criterion.exceeded(drift)
        return trial.should_prune()

    def _check_slo(self, trial: optuna.trial.Trial, metrics: dict[str, Any]) -> None:
        """--slo-ms: a config whose p99 latency per call exceeds the bound is measured and kept in the
        study, but PRUNED, so it never wins, becomes a finalist or sets the speed pruner's bar."""
        p99 = (metrics.get("latency_ms") or {}).get("p99")
        slo = {"bound_ms": self.spec.slo_ms, "p99_ms": p99, "met": p99 is not None and p99 <= self.spec.slo_ms}
        trial.set_user_attr("slo", slo)
        if not slo["met"]:
            reason = (
                f"latency SLO: p99 {p99:.1f} ms > {self.spec.slo_ms:g} ms"
                if p99 is not None
                else "latency SLO: too few calls for a p99 (needs 100)"
            )
            trial.set_user_attr("prune_reason", reason)
            raise optuna.TrialPruned(reason)


def same_numerics_drift(study: optuna.study.Study, numerics_key: str) -> dict[str, Any] | None:
    """Drift depends on numerics (backend, precision, options), not on threads, allocator or instances:
    the drift an earlier trial measured for the same numerics, marked as reused, or None."""
    for earlier in study.get_trials(deepcopy=False):
        drift = earlier.user_attrs.get("drift")
        if drift and "reused_from" not in drift and earlier.user_attrs.get("numerics_key") == numerics_key:
            return {**drift, "reused_from": earlier.number}
    return None


def objective_value(objective: str, metrics: dict[str, Any]) -> float | tuple[float, float]:
    """What Optuna optimizes: samples/s, median latency per call in ms, or (samples/s, p99 ms) for pareto."""
    if objective == "throughput":
        return metrics["throughput_sps"]
    if objective == "pareto":
        p99 = metrics["latency_ms"]["p99"]
        if p99 is None:
            raise TrialFailed("too few calls for a p99 latency (needs 100)")
        return metrics["throughput_sps"], p99
    p50 = metrics["latency_ms"]["p50"]
    if p50 is None:
        raise TrialFailed("too few iterations for a median latency; raise --measure-seconds")
    return p50


class BudgetGuard:
    """Optuna callback: stop before a trial would start with too little budget left to finish."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.durations: list[float] = []

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.datetime_start and trial.datetime_complete:
            self.durations.append((trial.datetime_complete - trial.datetime_start).total_seconds())
        typical = statistics.median(self.durations[-5:]) if self.durations else MIN_TRIAL_S
        if self.deadline - time.monotonic() < max(MIN_TRIAL_S, typical):
            study.stop()


def _enqueue_first_trials(study: optuna.study.Study, space: SearchSpace, spec: SearchSpec, console: Console) -> None:
    """The eager fp32 baseline first, then one trial per backend x precision."""
    baseline = space.baseline_params()
    if baseline is None:
        console.print(
            "note: the space has no eager fp32/glibc/1-instance config: speedups are not reported", markup=False
        )
    else:
        study.enqueue_trial(baseline, user_attrs={"baseline": True})
    if spec.cover_backends:
        for params in space.coverage_params():
            if params != baseline:
                study.enqueue_trial(params, user_attrs={"coverage": True})
    study.set_user_attr("seeded", True)


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM / SIGHUP take the Ctrl-C path: trial processes killed, trial recorded, best exported."""
    raise KeyboardInterrupt


def run_search(spec: SearchSpec, console: Console) -> SearchOutcome:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate_as_interrupt)
    started = time.monotonic()
    deadline = started + spec.budget_s
    reserve = spec.finalist_share * spec.budget_s if spec.finalists > 0 else 0.0
    search_deadline = deadline - reserve  # the finalists' share of the budget is kept for the end
    machine = probe_machine()
    runtimes = discover_runtimes(spec.runtimes)
    space = SearchSpace.from_dict(spec.space, machine, runtimes)
    for note in space.notes:
        console.print(f"note: {note}", markup=False)
    for backend, names in space.runtimes.items():
        if names != ["main"]:
            console.print(
                f"{backend} runs in runtime {' or '.join(runtimes[n].describe() for n in names)}", markup=False
            )
    spec.dir.mkdir(parents=True, exist_ok=True)
    study, created = open_study(spec, machine, runtimes)
    console.print(
        f"{'created' if created else 'resuming'} study {spec.study!r} in {mask_url(spec.storage)} "
        f"({len(study.trials)} trials so far); budget {spec.budget_s:.0f}s",
        markup=False,
    )
    register_worker(study)  # refused beside another process of this study on the same cores of this host

    def say(line: str) -> None:
        console.print(line, markup=False)

    fail_abandoned_trials(study, say)
    try:
        reference = compute_reference(
            spec.model,
            spec.dir,
            spec.eval_samples,
            min(spec.trial_timeout_s, spec.budget_s),
            spec.data,
            spec.calibration_data,
            spec.calibration_samples,
        )
    except TrialFailed as exc:
        raise UserError(
            f"the model does not run in FP32 eager mode, so there is no reference to compare with ({exc.cause}); "
            f"see {spec.dir / 'reference' / 'stderr.log'}"
        ) from None
    study.set_user_attr("model_for_trials", reference.model.to_dict())
    study.set_user_attr("evaluation", reference.evaluation)
    study.set_user_attr("calibration", reference.calibration)
    if not study.user_attrs.get("seeded"):  # also when the run that created the study died before this
        _enqueue_first_trials(study, space, spec, console)
    ctx = TrialContext(
        machine,
        reference,
        spec.measure,
        spec.cache_dir,
        spec.calibration_samples,
        runtimes=runtimes,
        memory_limit_mib=spec.memory_limit_mib,
        cache_size_mib=spec.cache_size_mib,
    )
    objective = Objective(spec, space, ctx, search_deadline)
    printer = ProgressPrinter(console, started, spec.budget_s, lambda: baseline_throughput(study))
    status = LiveStatus(study, started, spec.budget_s, lambda: baseline_throughput(study))
    objective.status = status
    interrupted = False
    # The live panel only on a terminal: logs and CI get the plain lines alone.
    live = (
        Live(status, console=console, refresh_per_second=1, transient=True)
        if console.is_terminal
        else contextlib.nullcontext()
    )
    with live:
        try:
            study.optimize(
                objective,
                n_trials=spec.trials,
                timeout=max(0.0, search_deadline - time.monotonic() - MIN_TRIAL_S),
                catch=(TrialFailed,),
                callbacks=[printer, status, AbandonedTrialsCheck(say), BudgetGuard(search_deadline)],
                gc_after_trial=False,
            )
            if spec.finalists > 0:
                status.running = "finalists: the top configurations re-measured, interleaved"
                run_finalists(
                    study,
                    ctx,
                    spec.dir / "finalists",
                    spec.finalists,
                    spec.finalist_repeats,
                    deadline,
                    spec.trial_timeout_s,
                    lambda metrics: objective_value(spec.objective, metrics),
                    baseline_trial(study),
                    lambda line: console.print(line, markup=False),
                )
        except KeyboardInterrupt:
            interrupted = True
            console.print(
                "interrupted: the running trial was stopped and recorded; run the same command to resume", markup=False
            )
    best_path = None
    if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False)) or closest_candidate(
        study
    ):
        best_path = export_best(study, spec.dir / "best.json")
        attach_to_study(study, spec.dir, best_path, "application/json")
    return SearchOutcome(study, best_path, interrupted)

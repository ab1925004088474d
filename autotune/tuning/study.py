"""The search: an Optuna study whose objective measures one configuration in fresh processes.

Creates or resumes the study, computes the FP32 reference once, enqueues the eager baseline,
runs trials within the wall-clock budget, and exports the winner. Ctrl-C loses nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console
from rich.live import Live

from autotune.backends import backend_module, engine_of
from autotune.backends.generation import precision_variant
from autotune.backends.precision import ExecutedPrecision
from autotune.common.errors import TrialFailed, UserError
from autotune.common.storage_urls import mask_url
from autotune.machine.fingerprint import fingerprint
from autotune.machine.generation_probe import probe_generation
from autotune.machine.probe import UNPINNED_WARNING, MachineProbe, probe_machine
from autotune.machine.runtimes import Runtime, discover_runtimes
from autotune.measure.drift import Drift
from autotune.measure.llm_load import RequestMix
from autotune.measure.llm_serving import LENGTH_SPREAD, LatencyBounds, ServingPlan
from autotune.measure.speed_gate import SpeedGate
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.config import TrialConfig, clean_environment
from autotune.records.fingerprint import Fingerprint
from autotune.records.job import ServerSettings, WorkerJob
from autotune.records.metrics import ReadyReport, TrialMetrics
from autotune.records.spec import SearchSpec, StoredSpec, identity_differences
from autotune.results.best_json import closest_candidate, export_best
from autotune.results.optuna_artifacts import attach_to_study
from autotune.results.progress import LiveStatus, ProgressPrinter
from autotune.results.selection import baseline_trial, metrics_of
from autotune.runner.launch import InstanceLaunch
from autotune.runner.trials import Reference, TrialContext, compute_reference, run_config, screening_value
from autotune.tuning.drift_check import drift_sequences, judge_measured_drift, reuse_known_drift
from autotune.tuning.drift_check import same_numerics_drift as same_numerics_drift  # where callers look for it
from autotune.tuning.finalists import run_finalists
from autotune.tuning.fleet import (
    AbandonedTrialsCheck,
    fail_abandoned_trials,
    orchestrator_record,
    register_orchestrator,
)
from autotune.tuning.hopeless import Proposal, hopeless_family, precision_variant_of
from autotune.tuning.layouts import HeldPlan, LayoutRound, coverage_batch
from autotune.tuning.mix_search import MixBisection
from autotune.tuning.payoff import coverage_preferences, int8_first_backend, order_by_payoff
from autotune.tuning.priors import prior_kind, read_prior, sibling_storages
from autotune.tuning.pruners import DriftPruner, SpeedPruner
from autotune.tuning.recording import (
    record_completed,
    record_failure,
    record_interrupted,
    record_pruned,
    record_suggested,
)
from autotune.tuning.slos import check_latency_bounds
from autotune.tuning.space import InfeasibleConfig, SearchSpace, family, guided_attrs
from autotune.tuning.speed_screening import first_too_slow, judge_screening, speed_gate_for, stop_too_slow
from autotune.tuning.stage_times import FinalistReserve, StageClock, deferral
from autotune.tuning.storage import open_storage

MIN_TRIAL_S = 10.0
SERVER_SEED = 20_241  # the Poisson arrivals' seed: every trial of a study is offered the same streams


def serving_plan(spec: SearchSpec) -> ServingPlan | None:
    """What a language model's server scenario offers every trial: requests around the workload's prompt and
    output lengths, the p99 TTFT and TPOT bounds, seeded arrivals, probes of the measuring window's length."""
    if spec.objective != "server" or spec.generation is None:
        return None
    workload = spec.generation
    return ServingPlan(
        RequestMix(workload.prompt_tokens, workload.new_tokens, LENGTH_SPREAD),
        LatencyBounds(spec.ttft_slo_ms, spec.tpot_slo_ms),
        SERVER_SEED,
        probe_min_s=spec.measure.window_min_s,
        probe_max_s=spec.measure.window_max_s,
    )


@dataclass
class SearchOutcome:
    study: optuna.study.Study
    best_path: Path | None
    interrupted: bool = False


def baseline_throughput(study: optuna.study.Study) -> float | None:
    """The baseline's throughput, or in the server scenario its sustained request rate."""
    trial = baseline_trial(study)
    if trial is None:
        return None
    metrics = metrics_of(trial)
    return metrics.sustained_rps if metrics.sustained_rps is not None else metrics.throughput_sps


def open_study(
    spec: SearchSpec,
    machine: MachineProbe,
    runtimes: dict[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[optuna.study.Study, bool]:
    """Create the study, or resume it after checking the settings are the same; `say` tells of trials
    failed because their worker went silent."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(spec.storage, spec.heartbeat_grace_s, say)
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
            latency = "TPOT" if spec.task == "generate" else "ms per call"
            study.set_metric_names(
                {
                    "throughput": [spec.unit],
                    "latency": [f"p50 {latency}"],
                    "pareto": [spec.unit, f"p99 {latency}"],
                    "server": [f"requests/s at p99 <= {spec.slo_ms or 0:g} ms"],
                }[spec.objective]
            )
    stored = study.user_attrs.get(Attr.SPEC)
    if stored is None:
        study.set_user_attr(Attr.SPEC, {**spec.to_json(), "storage": mask_url(spec.storage)})
        study.set_user_attr(Attr.FINGERPRINT, fingerprint(machine, runtimes))
        return study, True
    stored_identity = {k: stored.get(k) for k in spec.identity()}
    if spec.generation is not None and StoredSpec.from_json(stored).sequences_meaning != "total":
        raise UserError(
            f"study {spec.study!r} was stored when --sequences counted sequences per instance; now they count all "
            "instances together, so its trials ran other workloads than a resumed search would: its results "
            "read as before ('autotune show', export, compare), and a new --study name searches with the new meaning"
        )
    diffs = identity_differences(stored_identity, spec.identity())
    if diffs:
        raise UserError(
            f"study {spec.study!r} exists with different settings ({'; '.join(diffs)}): "
            "rerun with the same settings to resume, or pick a new --study name"
        )
    return study, False


class Objective:
    """Optuna objective: suggest a config, measure it in fresh processes, record everything.

    It orders the steps of a trial; the checks live in their own modules: drift (tuning/drift_check.py),
    speed pruning (tuning/speed_screening.py), latency bounds (tuning/slos.py), and what a trial stores
    (tuning/recording.py)."""

    def __init__(
        self, spec: SearchSpec, space: SearchSpace, ctx: TrialContext, search_deadline: Callable[[], float]
    ) -> None:
        self.spec, self.space, self.ctx, self.search_deadline = spec, space, ctx, search_deadline
        self.status: LiveStatus | None = None  # the live panel, told which trial runs

    @property
    def deadline(self) -> float:
        """When the search's share of the budget ends (it moves as trials say what a finalist run costs)."""
        return self.search_deadline()

    def __call__(self, trial: optuna.trial.Trial) -> float | tuple[float, float]:
        trial.set_user_attr(Attr.ORCHESTRATOR, orchestrator_record())  # first: a run that dies from here on is detected
        sampled = TrialAttrs.of(trial).order is None  # enqueued trials say why they run now themselves
        if sampled:
            trial.set_user_attr(Attr.ORDER, f"sampled by {type(trial.study.sampler).__name__} after the coverage round")
        config = self._suggest(trial)
        self._defer_costly_coverage(trial, config)
        timeout = min(self.spec.trial_timeout_s, self.deadline - time.monotonic())
        trial_dir = self.spec.dir / "trials" / f"{trial.number:05d}"
        self._known_fallback(trial, config)
        # its own numerics' drift, beyond the bound, prunes first
        known_drift = reuse_known_drift(
            trial, self.spec.criterion, self.ctx.reference.digest, drift_sequences(self.spec.task, config.batch_size)
        )
        if sampled:
            self._skip_hopeless_family(trial, config)
        gate = speed_gate_for(trial, config, self.spec.task)
        metrics, launches, template = self._measure(trial, config, trial_dir, timeout, known_drift, gate)
        if metrics.drift is None:  # never reached the ready barrier's check: not kept, whatever its speed
            record_failure(trial, self.spec, trial_dir, timeout, TrialFailed("its drift from FP32 was not measured"))
            raise TrialFailed("its drift from FP32 was not measured")
        try:
            value = objective_value(self.spec.objective, metrics)
        except TrialFailed as exc:
            record_failure(trial, self.spec, trial_dir, timeout, exc)
            raise
        record_completed(trial, self.spec, self.ctx.machine, config, trial_dir, metrics, launches, template)
        check_latency_bounds(trial, self.spec, metrics)
        return value

    def _defer_costly_coverage(self, trial: optuna.trial.Trial, config: TrialConfig) -> None:
        """A coverage trial of a backend whose preparation already took too much of the time left is
        pruned unlaunched, saying so (tuning/stage_times.py); the sampler may still come back to it."""
        if not TrialAttrs.of(trial).coverage:
            return
        earlier = [
            (t.number, precision_variant_of(attrs.config), attrs.budget)
            for t in trial.study.get_trials(deepcopy=False)
            if (attrs := TrialAttrs.of(t)).budget is not None
            and attrs.config is not None
            and attrs.config.backend == config.backend
        ]
        precision = precision_variant(config.precision, config.options)
        reason = deferral(config.backend, precision, earlier, self.deadline - time.monotonic())
        if reason:
            trial.set_user_attr(Attr.PRUNE_REASON, reason)
            trial.set_user_attr(Attr.DEFERRED, True)
            raise optuna.TrialPruned(reason)

    def _skip_hopeless_family(self, trial: optuna.trial.Trial, config: TrialConfig) -> None:
        """A sampled config of a family whose every launched trial lost by far is pruned unlaunched
        (tuning/hopeless.py): pruned, so the sampler ranks it worst, as a known fallback. Sampled: a trial
        that came without an `order`, which everything the search enqueues itself carries."""
        attrs = TrialAttrs.of(trial)
        proposal = Proposal(
            config.backend,
            precision_variant(config.precision, config.options),
            attrs.fallback_key or "",
            attrs.drift_reference or "",
            drift_sequences(self.spec.task, config.batch_size),
        )
        host = socket.gethostname() if self.spec.mixed_hardware else None  # other CPUs' verdicts do not apply
        reason = hopeless_family(trial.study, proposal, self.spec.criterion, self.spec.objective, trial.number, host)
        if reason:
            trial.set_user_attr(Attr.PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)

    def _suggest(self, trial: optuna.trial.Trial) -> TrialConfig:
        """The sampler's config, recorded on the trial; one that cannot run is pruned unlaunched."""
        try:
            config = self.space.suggest(trial)
        except InfeasibleConfig as exc:
            trial.set_user_attr(Attr.PRUNE_REASON, f"not launched: {exc}")
            raise optuna.TrialPruned(str(exc)) from None
        record_suggested(
            trial,
            config,
            numerics_key=numerics_key_of(config, self.space),
            drift_reference=self.ctx.reference.digest,
            fallback_key=self._fallback_key(config),
            mixed_hardware=self.spec.mixed_hardware,
        )
        if self.status is not None:
            self.status.running = f"trial {trial.number}: {config.summary()}"
        return config

    def _known_fallback(self, trial: optuna.trial.Trial, config: TrialConfig) -> None:
        """A config whose numerics an earlier trial found not to run its claimed precision is pruned with
        that cause, unlaunched. Pruned, not failed: TPE learns nothing from a FAIL and proposes the same
        region again and again (a 60-minute mobilenet_v3_large search on an AVX2 EPYC sampled 520 OpenVINO
        bf16 configurations after its first fell back), while a pruned trial without a value ranks worst."""
        found = known_fallback(trial.study, TrialAttrs.of(trial).fallback_key, socket.gethostname())
        if found is not None:
            number, precision = found
            reason = f"{precision.cause} (as trial {number} with the same numerics found): not launched"
            trial.set_user_attr(Attr.EXECUTED_PRECISION, precision.to_json())
            trial.set_user_attr(Attr.PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)

    def _fallback_key(self, config: TrialConfig) -> str:
        """The numerics without the options that only schedule the work: OpenVINO bf16 on a CPU without
        bf16 falls back to f32 whatever its hint and streams (an efficientnet_b0 search launched each of
        its combinations once, to fail 4-8 s later)."""
        return numerics_key_of(config, self.space, without=self.space.specs[config.backend].scheduling_options)

    def _measure(
        self,
        trial: optuna.trial.Trial,
        config: TrialConfig,
        trial_dir: Path,
        timeout: float,
        known_drift: Drift | None,
        gate: SpeedGate | None = None,
    ) -> tuple[TrialMetrics, list[InstanceLaunch], WorkerJob]:
        """Run the config; the barriers ask the pruners (drift, then screening) before the timed window.
        A failure is recorded with its cause and the trial's log."""

        clock = StageClock()

        def on_stage(stage: str, payloads: list[dict[str, Any]]) -> None:
            clock.reached(stage, payloads)
            if stage == "ready":  # drift first: a warm-up the gate stopped comes with it, kept for reuse
                judge_measured_drift(trial, ReadyReport.from_json(payloads[0]).drift, self.spec.criterion)
                stop_too_slow(trial, config, self.spec.objective, first_too_slow(payloads))
            elif stage == "screened":
                screening = screening_value(payloads, self.spec.measure.ci_confidence)
                judge_screening(trial, screening, self.spec.objective, self.spec.task)

        metrics: TrialMetrics | None = None
        try:
            metrics, launches, template = run_config(
                config,
                self.ctx,
                trial_dir,
                timeout,
                on_stage=on_stage,
                screen=self.spec.speed_pruning and self.spec.measure.screen_s > 0,
                known_drift=known_drift,
                speed_gate=gate,
                drift_bound=self.spec.criterion,
            )
            return metrics, launches, template
        except TrialFailed as exc:
            record_failure(trial, self.spec, trial_dir, timeout, exc)
            raise
        except optuna.TrialPruned:
            record_pruned(trial, self.spec, trial_dir)
            raise
        except KeyboardInterrupt:
            record_interrupted(trial)
            raise
        finally:
            trial.set_user_attr(Attr.BUDGET, clock.spent(metrics).to_json())


def known_fallback(
    study: optuna.study.Study, fallback_key: str | None, host: str
) -> tuple[int, ExecutedPrecision] | None:
    """What the backend executes depends on numerics (backend, precision, the options that choose
    kernels, runtime) and the machine (a fleet may mix CPUs with and without bf16), not on batch,
    threads, instances or the options that only schedule the work: the first earlier trial with the
    same `fallback_key` on this host that found a precision fallback, with its record, or None."""
    for earlier in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)):
        attrs = TrialAttrs.of(earlier)
        precision = attrs.executed_precision
        same = attrs.fallback_or_numerics_key == fallback_key and attrs.host == host
        if same and precision is not None and precision.fallback:
            return earlier.number, precision
    return None


def numerics_key_of(config: TrialConfig, space: SearchSpace, without: tuple[str, ...] = ()) -> str:
    """config.numerics_key with the version of its artifact's builder, where it has one: a study resumed
    after a builder changed (vit_b_16's int8 moved from static to transformer schemes) must measure the
    new artifacts' drift and precision, not reuse the old ones'. Text generation's weights keep theirs."""
    builds = space.task != "generate" and space.specs[config.backend].builds_artifact(config.precision)
    builder = backend_module(config.backend).ARTIFACT_VERSION if builds else None
    return config.numerics_key(without=without, builder=builder)


def objective_value(objective: str, metrics: TrialMetrics) -> float | tuple[float, float]:
    """What Optuna optimizes: samples/s, median latency per call in ms, or (samples/s, p99 ms) for pareto.
    A language model's latency is its time per output token (TPOT), and throughput generated tokens/s."""
    if objective == "throughput":
        return metrics.throughput_sps
    if objective == "server":
        if metrics.sustained_rps is None:
            raise TrialFailed("the server scenario's rate search did not run")
        return metrics.sustained_rps
    latency = metrics.generation.tpot_ms if metrics.generation else metrics.latency_ms
    if objective == "pareto":
        p99 = latency.p99
        if p99 is None:
            raise TrialFailed("too few calls for a p99 latency (needs 100)")
        return metrics.throughput_sps, p99
    p50 = latency.p50
    if p50 is None:
        raise TrialFailed("too few iterations for a median latency; raise --measure-seconds")
    return p50


def primary_objective_value(objective: str, metrics: TrialMetrics) -> float:
    """The single value the finalists compare: a Pareto study's is its throughput."""
    value = objective_value(objective, metrics)
    return value[0] if isinstance(value, tuple) else value


class BudgetGuard:
    """Optuna callback: stop before a trial would start with too little budget left to finish."""

    def __init__(self, deadline: Callable[[], float]) -> None:
        self.deadline = deadline
        self.durations: list[float] = []

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.datetime_start and trial.datetime_complete:
            self.durations.append((trial.datetime_complete - trial.datetime_start).total_seconds())
        typical = statistics.median(self.durations[-5:]) if self.durations else MIN_TRIAL_S
        if self.deadline() - time.monotonic() < max(MIN_TRIAL_S, typical):
            study.stop()


def more_sequences_pay(spec: SearchSpec) -> bool:
    """Whether the coverage and layout rounds may give a language model more sequences than the baseline's:
    not under a token latency bound, since more sequences lengthen every prefill and decode step."""
    return spec.ttft_slo_ms is None and spec.tpot_slo_ms is None


@dataclass(frozen=True)
class FirstTrials:
    """What a new study's first trials are chosen from: the study, its space and spec, this machine, the
    FP32 reference (what it measured of the model orders the int8 coverage) and where notes are said."""

    study: optuna.study.Study
    space: SearchSpace
    spec: SearchSpec
    machine: MachineProbe
    reference: Reference
    console: Console


def _enqueue_first_trials(first: FirstTrials) -> None:
    """The eager fp32 baseline first, then the winners of earlier studies on this machine
    (tuning/priors.py), then one trial per backend x precision, highest expected payoff on this machine
    first (tuning/payoff.py), each recording why it runs where it does; where a layout round runs, the
    coverage waits on the study, released a trial at a time (tuning/layouts.py)."""
    study, space, spec, console = first.study, first.space, first.spec, first.console
    baseline = _enqueue_baseline(study, space, console)
    stored = Fingerprint.of(study)
    hardware = stored.hardware.to_json() if stored and stored.hardware else {}
    storages = [study._storage, *sibling_storages(spec.dir.parent, spec.dir / "study.db")]  # Optuna: no accessor
    prior = read_prior(storages, study.study_name, hardware, prior_kind(spec))
    winners = _enqueue_prior_winners(study, space, prior.winners, baseline, console)
    # a prior winner covers its backend x precision: the coverage round does not measure that family again
    covered = {family(params) for params in winners}
    if spec.cover_backends:
        _enqueue_coverage(first, baseline, covered, prior.family_speedups)
    study.set_user_attr(Attr.SEEDED, True)


def _enqueue_baseline(study: optuna.study.Study, space: SearchSpace, console: Console) -> dict[str, Any] | None:
    """The eager fp32 baseline, first: every speedup is relative to it. None (said so) when the space has none."""
    baseline = space.baseline_params()
    if baseline is None:
        console.print(
            "note: the space has no eager fp32/glibc/1-instance config: speedups are not reported", markup=False
        )
    else:
        study.enqueue_trial(
            baseline, user_attrs={Attr.BASELINE: True, Attr.ORDER: "baseline: first, every speedup is relative to it"}
        )
    return baseline


def _enqueue_prior_winners(
    study: optuna.study.Study,
    space: SearchSpace,
    winners: list[tuple[dict[str, Any], str]],
    baseline: dict[str, Any] | None,
    console: Console,
) -> list[dict[str, Any]]:
    """The earlier studies' winners, narrowed to the values this space offers (one whose backend it does
    not offer is left out, said so), each once and not again as the baseline; returns those enqueued."""
    enqueued = [baseline]
    for winner, why in winners:
        params, dropped = space.offered_params(winner)
        if not params:
            console.print(
                f"note: {why.removeprefix('prior: ')} runs {winner.get('backend')}, which this space does not "
                "offer: not tried",
                markup=False,
            )
            continue
        if dropped:
            why += f" (sampled here: {', '.join(dropped)}, outside this space)"
        if params not in enqueued:
            attrs = {Attr.PRIOR: True, Attr.ORDER: why, **guided_attrs(params)}
            study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
            enqueued.append(params)
    if len(enqueued) > 1:
        console.print(f"{len(enqueued) - 1} winner(s) of earlier studies on this machine tried first", markup=False)
    return [params for params in enqueued[1:] if params is not None]


def _enqueue_coverage(
    first: FirstTrials,
    baseline: dict[str, Any] | None,
    covered: set[tuple[Any, Any]],
    family_speedups: dict[tuple[str, str], tuple[float, str]],
) -> None:
    """One trial per backend x precision not yet covered, highest expected payoff first; queued on the
    study for the layout round to release one at a time where it runs, enqueued at once otherwise."""
    study, space, spec, machine, reference = first.study, first.space, first.spec, first.machine, first.reference
    preferences = coverage_preferences(machine.isa)
    batch = coverage_batch(space, spec.objective, more_sequences_pay(spec))
    plans = [
        p
        for p in space.coverage_params(
            {key: pref.value for key, pref in preferences.items()},
            batch,
            alongside=[key for key, pref in preferences.items() if pref.alongside],
        )
        if p != baseline and family(p) not in covered
    ]
    _note_int8_ordering(reference, space, first.console)
    study.set_user_attr(Attr.ATTENTION_LAYERS, reference.attention_layers)  # what ordered the int8 coverage
    study.set_user_attr(Attr.REDUCTION_DEPTH, reference.reduction_depth)  # and whether int8 is expected to lose
    int8_first = int8_first_backend(machine.isa, reference.attention_layers)
    # the engines the baseline and earlier studies' winners measure already: none of them in the engine round
    measured = {engine_of(str(b), str(p), space.task) for b, p in covered} | ({"eager"} if baseline else set())
    ordered = order_by_payoff(
        plans, machine.isa, space.task, family_speedups, int8_first, reference.reduction_depth, preferences, measured
    )
    if batch != space.baseline_batch_size:
        where = (
            f"; {batch} {space.batch_param}, the most the space lists within 8x the baseline's: a decode step "
            "reads every weight once for all of them (tuning/layouts.coverage_batch)"
        )
        ordered = [replace(plan, order=plan.order + where) for plan in ordered]
    if LayoutRound.applies(space, spec.objective):
        # released one at a time, so the layout round can run as soon as a family leads; the families
        # expected to lose are last in the payoff order, so they run after the round (tuning/layouts.py)
        queue = [
            HeldPlan(
                plan.params, plan.order, late=plan.expected_to_lose and not plan.engine_round, first=plan.engine_round
            ).to_json()
            for plan in ordered
        ]
        study.set_user_attr(Attr.COVERAGE_QUEUE, queue)
    else:
        for plan in ordered:
            study.enqueue_trial(plan.params, user_attrs={Attr.COVERAGE: True, Attr.ORDER: plan.order})


def _note_int8_ordering(reference: Reference, space: SearchSpace, console: Console) -> None:
    """Says when the int8 coverage is ordered on less than usual: a reference from before attention layers
    or the reduction depth were measured."""
    if reference.attention_layers is None and space.task != "generate":
        console.print(
            "note: this study's reference was computed before attention layers were counted, so its int8 "
            "coverage starts with OpenVINO's (a new study counts them)",
            markup=False,
        )
    if reference.reduction_depth is None and space.task != "generate":
        console.print(
            "note: the model's reduction depth was not measured (a reference from before it was, or no "
            "convolution or linear layer ran as a Python module), so its int8 coverage is ordered by the CPU alone",
            markup=False,
        )


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM / SIGHUP take the Ctrl-C path: trial processes killed, trial recorded, best exported."""
    raise KeyboardInterrupt


def run_search(spec: SearchSpec, console: Console) -> SearchOutcome:
    """Open (or resume) the study, compute the reference, run trials until the search's share of the
    budget is spent, re-measure the finalists, and export the winner."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate_as_interrupt)

    def say(line: str) -> None:
        console.print(line, markup=False)

    started = time.monotonic()
    deadline = started + spec.budget_s
    machine = probe_machine()
    if machine.pinning == "none":
        say(UNPINNED_WARNING)
    runtimes = discover_runtimes(spec.runtimes)
    space = _search_space(spec, machine, runtimes, say)
    spec.dir.mkdir(parents=True, exist_ok=True)
    study, created = open_study(spec, machine, runtimes, say)
    say(
        f"{'created' if created else 'resuming'} study {spec.study!r} in {mask_url(spec.storage)} "
        f"({len(study.trials)} trials so far); budget {spec.budget_s:.0f}s"
    )
    register_orchestrator(study)  # refused beside another process of this study on the same cores of this host
    fail_abandoned_trials(study, say)
    reference = _reference(spec, study)
    if reference.note is not None:
        say(f"note: {reference.note.message}")
    if not study.user_attrs.get(Attr.SEEDED):  # also when the run that created the study died before this
        _enqueue_first_trials(FirstTrials(study, space, spec, machine, reference, console))
    ctx = TrialContext(
        machine,
        reference,
        spec.measure,
        spec.cache_dir,
        spec.calibration_samples,
        runtimes=runtimes,
        memory_limit_mib=spec.memory_limit_mib,
        cache_size_mib=spec.cache_size_mib,
        server=ServerSettings(spec.slo_ms, SERVER_SEED) if spec.objective == "server" and spec.slo_ms else None,
        llm_server=serving_plan(spec),
    )
    # The finalists' reserve is kept for the end, sized from what trials cost once some have completed.
    reserve = FinalistReserve(
        study, deadline, spec.budget_s, spec.finalist_share, spec.finalists, spec.finalist_repeats
    )
    interrupted = _optimize(
        spec, study, Objective(spec, space, ctx, reserve.search_deadline), started, deadline, console
    )
    best_path = None
    complete = any(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    if complete or closest_candidate(study):
        best_path = export_best(study, spec.dir / "best.json")
        attach_to_study(study, spec.dir, best_path, "application/json")
    return SearchOutcome(study, best_path, interrupted)


def _search_space(
    spec: SearchSpec, machine: MachineProbe, runtimes: dict[str, Runtime], say: Callable[[str], None]
) -> SearchSpace:
    """The space the YAML asks for, narrowed to what this machine and its runtimes offer (said so)."""
    listed = spec.space.get("backends") if isinstance(spec.space, dict) else None
    wanted = list(listed) if isinstance(listed, dict) else None
    generation = (
        probe_generation(runtimes, clean_environment(dict(os.environ)), wanted) if spec.task == "generate" else None
    )
    space = SearchSpace.parse(
        spec.space,
        machine,
        runtimes,
        spec.task,
        generation.unavailable if generation else None,
        # padded batches that wait for requests (max_wait_ms); a language model's engine batches continuously
        spec.objective == "server" and spec.task != "generate",
        generation.routes if generation else None,
    )
    for note in space.notes:
        say(f"note: {note}")
    for backend, names in space.runtimes.items():
        if names != ["main"]:
            say(f"{backend} runs in runtime {' or '.join(runtimes[n].describe() for n in names)}")
    return space


def _reference(spec: SearchSpec, study: optuna.study.Study) -> Reference:
    """The FP32 eager outputs every trial is compared with (computed once per study), recorded on it;
    refused when they are constant across inputs and nothing could make drift see past that."""
    try:
        reference = compute_reference(
            spec.model,
            spec.dir,
            spec.eval_samples,
            min(spec.trial_timeout_s, spec.budget_s),
            spec.data,
            spec.calibration_data,
            spec.calibration_samples,
            spec.generation,
        )
    except TrialFailed as exc:
        raise UserError(
            f"the model does not run in FP32 eager mode, so there is no reference to compare with ({exc.cause}); "
            f"see {spec.dir / 'reference' / 'stderr.log'}"
        ) from None
    if reference.note is not None and not reference.note.drift_measurable:
        # Every search bounds drift, and against this reference any numerics would pass the bound.
        raise UserError(reference.note.message)
    study.set_user_attr(Attr.REFERENCE_NOTE, reference.note.to_json() if reference.note else None)
    study.set_user_attr(Attr.MODEL_FOR_TRIALS, reference.model.to_json())
    study.set_user_attr(Attr.EVALUATION, reference.evaluation.to_json() if reference.evaluation else None)
    study.set_user_attr(Attr.CALIBRATION, reference.calibration.to_json())
    return reference


def _optimize(
    spec: SearchSpec,
    study: optuna.study.Study,
    objective: Objective,
    started: float,
    deadline: float,
    console: Console,
) -> bool:
    """Trials, then the finalist round, under the progress printer and (on a terminal) the live panel.
    Returns whether the run was interrupted."""

    def say(line: str) -> None:
        console.print(line, markup=False)

    mixes = MixBisection(objective.space)
    layouts = LayoutRound(objective.space, spec.objective, more_sequences_pay(spec))
    # a run resumed after its last trial was interrupted: no callback ran for it, so the next share or layout
    # is queued now (the mix first: the layout round releases only when none waits)
    mixes(study)
    layouts(study)
    printer = ProgressPrinter(console, started, spec.budget_s, lambda: baseline_throughput(study))
    status = LiveStatus(study, started, spec.budget_s, lambda: baseline_throughput(study))
    objective.status = status
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
                # the budget's end at the latest; BudgetGuard stops at the search's (moving) share of it
                timeout=max(0.0, deadline - time.monotonic() - MIN_TRIAL_S),
                catch=(TrialFailed,),
                callbacks=[
                    printer,
                    status,
                    AbandonedTrialsCheck(say),
                    mixes,  # ahead of the layout round: it releases only when none waits
                    layouts,
                    BudgetGuard(objective.search_deadline),
                ],
                gc_after_trial=False,
            )
            if spec.finalists > 0:
                status.running = "finalists: the top configurations re-measured, interleaved"
                run_finalists(
                    study,
                    objective.ctx,
                    spec.dir / "finalists",
                    spec.finalists,
                    spec.finalist_repeats,
                    deadline,
                    spec.trial_timeout_s,
                    lambda metrics: primary_objective_value(spec.objective, metrics),
                    baseline_trial(study),
                    say,
                )
        except KeyboardInterrupt:
            say("interrupted: the running trial was stopped and recorded; run the same command to resume")
            return True
    return False

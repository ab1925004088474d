"""best.json: the winner, how to reproduce it, what it measured, and what it is valid for.

Reads the stored study only; never re-runs the search. Schema documented in docs/manual/reference/best-json.md.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import optuna

from autotune.common.errors import UserError
from autotune.common.files import write_json_atomic
from autotune.common.json_record import RecordError
from autotune.machine.runtimes import MAIN, RuntimeRecord, replay_env
from autotune.measure.drift import Drift
from autotune.measure.serving import ServerMetrics
from autotune.model.sources import ModelSource
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.best import (
    METRIC_KEYS,
    Baseline,
    BestJson,
    BestMetrics,
    DriftReport,
    FinalistCandidate,
    Finalists,
    Launch,
    MixSummary,
    ObjectiveInfo,
    ParetoPoint,
    ProbeSummary,
    SequencesSplit,
    ServerSummary,
    StudyInfo,
    TotalBest,
)
from autotune.records.config import UNSET_IN_COMMANDS, TrialConfig
from autotune.records.finalists import FinalistEntry, FinalistRound
from autotune.records.fingerprint import Fingerprint
from autotune.records.options import flag
from autotune.records.reference import CalibrationSet, EvaluationSet, ReferenceNote
from autotune.records.spec import StoredSpec
from autotune.results.selection import (
    baseline_trial,
    best_by_total,
    clean_trials,
    drift_of,
    finalist_round,
    metrics_of,
    primary_value,
)
from autotune.runner.launch import shell_command
from autotune.runner.trials import replay_argv

SCHEMA = "autotune.best/2"


def _counts(study: optuna.study.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] = counts.get(trial.state.name.lower(), 0) + 1
    return counts


def replay_commands(attrs: TrialAttrs, best_path: Path) -> list[str]:
    """One command per instance that re-runs the winner from best.json, pinned as it was tuned, in the
    runtime it ran in (another runtime gets this autotune on PYTHONPATH)."""
    python, env = replay_env(attrs.runtime, attrs.env or {})
    return [
        shell_command(env, [*prefix, *replay_argv(best_path.resolve(), i, python)], UNSET_IN_COMMANDS)
        for i, prefix in enumerate(attrs.pin_prefixes or [])
    ]


def choose_winner(study: optuna.study.Study) -> tuple[optuna.trial.FrozenTrial, FinalistRound | None, str]:
    """The winning trial, the finalist record that chose it (if current), and why it won.

    A finalist round decides when it is newer than every completed trial; otherwise the best clean
    single measurement. A measurement flagged as noisy never wins.
    """
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        raise UserError(f"study {study.study_name!r} has no COMPLETE trial yet: run 'autotune search' first")
    clean = clean_trials(study)
    if not clean:
        last_flags = "; ".join(metrics_of(complete[-1]).noise_flags)
        raise UserError(
            f"every completed trial of study {study.study_name!r} was flagged as noisy (the last: {last_flags}): "
            "rerun 'autotune search' on a quieter machine (same command resumes)"
        )
    record = finalist_round(study)  # from the stored runs, with the current selection rule
    # A noisy contender may win the finalist round: its interleaved clean runs decided, not its flag.
    by_number = {t.number: t for t in complete}
    if record is not None and record.winner_trial in by_number and record.last_trial >= max(t.number for t in complete):
        return by_number[record.winner_trial], record, f"finalists: {record.selection}"
    return clean[0], None, "best clean single measurement (no finalist round after the last trial)"


def _finalist_view(record: FinalistRound | None, winner: int) -> Finalists | None:
    """best.json's summary of the finalist round: every candidate's repeats and their spread."""
    if record is None:
        return None
    return Finalists(
        selection=record.selection or "",
        order=record.order,
        repeats=record.repeats,
        seconds=record.seconds,
        left_out=record.left_out,  # candidates the time left had no room for
        candidates=[_finalist_candidate(c, winner) for c in record.candidates],
    )


def _finalist_candidate(c: FinalistEntry, winner: int) -> FinalistCandidate:
    summary = c.summary
    if summary is None:  # decided before it is read: every entry has its summary
        raise RecordError(f"the finalist round's entry for trial {c.trial} has no summary")
    return FinalistCandidate(
        trial=c.trial,
        winner=c.trial == winner,
        candidate=c.candidate,
        baseline=c.baseline,
        config=c.config,
        search_value=c.search_value,
        values=[r.value for r in c.runs],
        runs=c.runs,
        median=summary.median,
        min=summary.min,
        max=summary.max,
        spread_rel=summary.spread_rel,
        noise_rel=summary.noise_rel,
        clean_runs=summary.runs,  # the median and range are over these only
        eligible=summary.eligible,
    )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _study_info(study: optuna.study.Study, spec: StoredSpec, trial: int) -> StudyInfo:
    return StudyInfo(name=study.study_name, storage=spec.storage, trial=trial, trials=_counts(study))


def _baseline(baseline: optuna.trial.FrozenTrial | None) -> Baseline | None:
    """The eager fp32 baseline as best.json records it (the server scenario: with its sustained rate)."""
    if baseline is None:
        return None
    metrics = metrics_of(baseline)
    return Baseline(
        trial=baseline.number,
        config=TrialAttrs.of(baseline).config,
        throughput_sps=metrics.throughput_sps,
        latency_ms=metrics.latency_ms,
        sustained_rps=baseline.values[0] if metrics.sustained_rps is not None else None,
    )


def _study_drift(study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> DriftReport:
    evaluation = study.user_attrs.get(Attr.EVALUATION)
    calibration = study.user_attrs.get(Attr.CALIBRATION)
    note = study.user_attrs.get(Attr.REFERENCE_NOTE)
    return drift_report(
        drift_of(trial),
        StoredSpec.of(study),
        EvaluationSet.from_json(evaluation) if evaluation else None,
        CalibrationSet.from_json(calibration) if calibration else None,
        ReferenceNote.from_json(note) if note else None,
    )


def _model_for_trials(study: optuna.study.Study, spec: StoredSpec) -> ModelSource | None:
    """How trials built the model: with the weights the reference saved (a random init's), else as specified."""
    stored = study.user_attrs.get(Attr.MODEL_FOR_TRIALS)
    return ModelSource.from_json(stored) if stored else spec.model


def build_best(study: optuna.study.Study, best_path: Path) -> BestJson:
    """The best.json record: the winner chosen by the finalist round, or the best clean trial."""
    best, record, why = choose_winner(study)
    spec = StoredSpec.of(study)
    attrs = TrialAttrs.of(best)
    baseline = baseline_trial(study)
    base_sps = metrics_of(baseline).throughput_sps if baseline else None
    stored = metrics_of(best).to_json()
    metrics = BestMetrics.from_json({key: stored[key] for key in METRIC_KEYS})
    pareto = len(study.directions) > 1
    speedup, source = _speedup(record, best, base_sps, spec.objective, baseline.values[0] if baseline else None)
    return BestJson(
        schema=SCHEMA,
        created=_now(),
        meets_drift=not spec.criterion.exceeded(drift_of(best)),
        study=_study_info(study, spec, best.number),
        objective=ObjectiveInfo(
            name=spec.objective,
            direction=_directions(study),
            value=primary_value(best),
            values=best.values if pareto else None,
            revalidated_median=_revalidated(record, best.number),
        ),
        selection=why,
        scenario=spec.scenario,
        server=server_summary(metrics.server) if metrics.server else None,
        llm_server=metrics_of(best).llm_server,
        pareto_front=pareto_front(study) if pareto else None,
        finalists=_finalist_view(record, best.number),
        model=_model_for_trials(study, spec),
        config=_config_of(attrs, best.number),
        runtime=attrs.runtime or RuntimeRecord(name=MAIN, torch=attrs.torch_version),
        environment=attrs.env or {},
        launch=Launch(
            pinning=attrs.pinning,
            pin_prefixes=attrs.pin_prefixes,
            commands=replay_commands(attrs, best_path),
            note="one command per instance, started together; each re-measures its instance and prints JSON",
        ),
        job=attrs.job,
        metrics=metrics,
        measure_settings=attrs.measure_settings,
        drift=_study_drift(study, best),
        baseline=_baseline(baseline),
        speedup_vs_baseline=speedup,
        speedup_source=source,
        fingerprint=Fingerprint.of(study),
        sequences=_sequences_split(study, spec, attrs.config) if spec.task == "generate" else None,
        mix=_mix(metrics),
    )


def _mix(metrics: BestMetrics) -> MixSummary | None:
    """The winner's mix, from what its build reported (None: a whole-model type)."""
    details = metrics.backend_details or {}
    if "kept_layers" not in details:
        return None
    return MixSummary(
        compressed_share=float(details["compressed_share"]),
        low_type=str(details["precision"]),
        kept_type=str(details["kept_type"]),
        kept_layers=list(details["kept_layers"]),
        compressed_layers=int(details["compressed_layers"]),
        sensitivity_method=str((details.get("sensitivity") or {}).get("method", "")),
        # the file's matrices by type (a GGUF's tensor types, an IR's weight types), else the modules' as the
        # executed-precision check counted them (torchao)
        executed=dict(
            details.get("tensor_types")
            or details.get("weight_types")
            or (metrics.executed_precision.counts if metrics.executed_precision else {})
        ),
    )


def _sequences_split(study: optuna.study.Study, spec: StoredSpec, config: TrialConfig | None) -> SequencesSplit | None:
    """A generation winner's total sequences and their split, with each total's best clean trial."""
    if config is None:
        return None
    by_total = []
    for total, trial in best_by_total(study).items():
        recorded = TrialAttrs.of(trial).config
        if recorded is not None:
            by_total.append(
                TotalBest(
                    total=total,
                    trial=trial.number,
                    value=primary_value(trial),
                    instances=recorded.instances,
                    per_instance=recorded.batch_size,
                    config=recorded.summary(),
                )
            )
    return SequencesSplit(
        total=config.total_batch,
        instances=config.instances,
        per_instance=config.batch_size,
        meaning=spec.sequences_meaning,
        by_total=by_total,
    )


def _config_of(attrs: TrialAttrs, trial: int) -> TrialConfig:
    if attrs.config is None:
        raise RecordError(f"trial {trial} recorded no config")
    return attrs.config


def drift_report(
    drift: Drift | None,
    spec: StoredSpec,
    evaluation: EvaluationSet | None,
    calibration: CalibrationSet | None,
    reference_note: ReferenceNote | None = None,
) -> DriftReport:
    """The winner's drift: every metric, the one bounded with its drop and bound, and what it was
    measured on (`reference`: set when the FP32 outputs were constant across inputs, saying what was done)."""
    criterion = spec.criterion
    # a study from before the evaluation set was recorded: its synthetic inputs, as that layout had them
    evaluation = evaluation or EvaluationSet(
        data="synthetic seeded random inputs",
        samples=spec.eval_samples,
        synthetic=True,
        absent=("labels", "reference_accuracy"),
    )
    return DriftReport(
        measured=drift,
        metric=criterion.metric,
        drop=criterion.drop(drift) if drift else None,
        max_drift=criterion.max_drop,
        relative=criterion.relative,
        criterion=criterion.describe(),
        data=f"{evaluation.data}: {evaluation.samples} evaluation samples, FP32 eager outputs as reference"
        + (" (synthetic: says little about accuracy)" if evaluation.synthetic else ""),
        evaluation=evaluation,
        calibration=calibration,
        reference=reference_note,
    )


def _revalidated(record: FinalistRound | None, trial: int) -> float | None:
    return record.median_of(trial) if record is not None else None


def _speedup(
    record: FinalistRound | None,
    best: optuna.trial.FrozenTrial,
    base_sps: float | None,
    objective: str | None,
    base_value: float | None = None,
) -> tuple[float | None, str]:
    """Throughput over the baseline's, and how it was measured: from the interleaved finalist runs when
    both were re-measured."""
    if objective == "server":  # the sustained request rates, the winner's over the baseline's
        return _server_speedup(record, best, base_value)
    alike = _finalist_speedup(record, best) if objective == "throughput" else None
    if alike is not None:
        return alike, "medians of the interleaved finalist runs (winner and baseline re-measured alike)"
    sps = metrics_of(best).throughput_sps
    return (
        sps / base_sps if base_sps and sps else None,
        "one search measurement each (winner and baseline trials)",
    )


def _finalist_speedup(record: FinalistRound | None, best: optuna.trial.FrozenTrial) -> float | None:
    """The winner's finalist median over the baseline's, when the round re-measured both."""
    if record is None:
        return None
    base, median = record.baseline_median(), record.median_of(best.number)
    return median / base if base and median else None


def _server_speedup(
    record: FinalistRound | None, best: optuna.trial.FrozenTrial, base_value: float | None
) -> tuple[float | None, str]:
    """The server scenario's speedup: sustained rate over the baseline's, from the interleaved finalist
    runs when both were re-measured, else from their search trials."""
    alike = _finalist_speedup(record, best)
    if alike is not None:
        return alike, "sustained rates, medians of the interleaved finalist runs (re-measured alike)"
    return (
        best.value / base_value if base_value and best.value else None,
        "sustained rates, one search measurement each (winner and baseline trials)",
    )


def server_summary(server: ServerMetrics) -> ServerSummary:
    """best.json's `server`: the sustained rate at the bound, the batching policy a server should use,
    and the rate search's probes (each: offered and achieved rate, p50/p90/p99, the model's call time
    under that load, queue at start and end)."""
    return ServerSummary(
        sustained_rps=server.sustained_rps,
        slo_ms=server.slo_ms,
        max_batch=server.max_batch,
        max_wait_ms=server.max_wait_ms,
        upper_bound_rps=server.upper_bound_rps,
        batching=server.batching,
        routing=server.routing,
        rule=server.rule,
        probes=[
            ProbeSummary(
                rate_rps=p.rate_rps,
                achieved_rps=p.achieved_rps,
                p50_ms=p.latency_ms.p50,
                p90_ms=p.latency_ms.p90,
                p99_ms=p.latency_ms.p99,
                p99_ci_ms=p.p99_ci_ms,
                requests=p.requests,
                call_mean_ms=p.call_ms.mean if p.call_ms else None,
                call_p99_ms=p.call_ms.p99 if p.call_ms else None,
                queue_start=p.queue_start,
                queue_end=p.queue_end,
                sustained=p.sustained,
                why=p.why,
            )
            for p in server.probes
        ],
    )


def _directions(study: optuna.study.Study) -> str | list[str]:
    names = [d.name.lower() for d in study.directions]
    return names[0] if len(names) == 1 else names


def pareto_front(study: optuna.study.Study) -> list[ParetoPoint]:
    """A Pareto study's non-dominated clean trials (throughput up, p99 down), fastest first: each one
    is a valid answer; which to deploy depends on the latency the application can take."""
    clean = {t.number for t in clean_trials(study)}
    front = [t for t in study.best_trials if t.number in clean]
    return [
        ParetoPoint(
            trial=t.number,
            throughput_sps=t.values[0],
            p99_ms=t.values[1],
            config=(attrs := TrialAttrs.of(t)).config,
            config_summary=attrs.config_summary,
        )
        for t in sorted(front, key=lambda t: -t.values[0])
    ]


def closest_candidate(study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
    """The trial whose measured drift came closest to the bound, when none met it (nothing COMPLETE)."""
    criterion = StoredSpec.of(study).criterion
    measured = [
        (criterion.drop(drift), t)
        for t in study.get_trials(deepcopy=False)
        if (drift := drift_of(t)) is not None and TrialAttrs.of(t).config and criterion.exceeded(drift)
    ]
    measured = [(drop, t) for drop, t in measured if drop is not None]
    return min(measured, key=lambda pair: (pair[0], pair[1].number))[1] if measured else None


def build_closest(study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> BestJson:
    """best.json for a study where no configuration met the drift bound: the closest one, marked so,
    with its drift and how to run it, but no speed (it was never timed)."""
    spec = StoredSpec.of(study)
    attrs = TrialAttrs.of(trial)
    drift = _study_drift(study, trial)
    return BestJson(
        schema=SCHEMA,
        created=_now(),
        meets_drift=False,
        study=_study_info(study, spec, trial.number),
        objective=ObjectiveInfo(name=spec.objective, direction=_directions(study)),
        selection=(
            f"NO configuration met the drift bound ({drift.criterion}); this is the closest candidate: "
            f"trial {trial.number} with {drift.metric} drop {drift.drop or 0.0:.4g}. It was not timed. Loosen "
            f"{flag('max_drift')}, give calibration data ({flag('data')} / {flag('calibration_data')}), or add "
            "precisions closer to fp32 to the space"
        ),
        model=_model_for_trials(study, spec),
        config=_config_of(attrs, trial.number),
        runtime=attrs.runtime,
        environment=attrs.env,
        drift=drift,
        fingerprint=Fingerprint.of(study),
    )


def export_best(study: optuna.study.Study, path: str | Path) -> Path:
    """Write best.json: the winner; when no trial completed because none met the drift bound, the
    closest candidate marked `meets_drift: false`. Atomic: a reader never sees half a file."""
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        closest = closest_candidate(study)
        if closest is not None:
            return write_json_atomic(path, build_closest(study, closest).to_json())
    return write_json_atomic(path, build_best(study, Path(path)).to_json())


def read_best(best_path: Path) -> BestJson:
    """A best.json with a timed winner, or one line saying what is wrong with it."""
    try:
        best = BestJson.read(best_path)
    except RecordError as exc:
        raise UserError(str(exc)) from None
    if not best.meets_drift or not best.job:
        raise UserError(
            f"{best_path} holds no timed winner (no configuration met the drift bound): nothing to re-measure"
        )
    return best

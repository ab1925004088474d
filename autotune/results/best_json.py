"""best.json: the winner, how to reproduce it, what it measured, and what it is valid for.

Reads the stored study only; never re-runs the search. Schema documented in docs/manual/reference/best-json.md.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import optuna

from autotune.common.errors import UserError
from autotune.common.files import write_json_atomic
from autotune.common.json_record import RecordError
from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import MAIN, replay_env, runtimes_with
from autotune.measure.drift import Drift
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.best import (
    METRIC_KEYS,
    Baseline,
    BestJson,
    BestMetrics,
    FinalistCandidate,
    Finalists,
    Launch,
    ObjectiveInfo,
    ParetoPoint,
    ServerSummary,
    StudyInfo,
    config_from_json,
)
from autotune.records.config import UNSET_IN_COMMANDS
from autotune.records.spec import StoredSpec
from autotune.results.selection import (
    baseline_trial,
    clean_trials,
    decide,
    drift_of,
    maximizes,
    metrics_of,
    primary_value,
)
from autotune.runner.launch import shell_command
from autotune.runner.trials import Reference, TrialContext, replay_argv

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


def choose_winner(study: optuna.study.Study) -> tuple[optuna.trial.FrozenTrial, dict[str, Any] | None, str]:
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
    maximize = maximizes(study)
    record = study.user_attrs.get(Attr.FINALISTS)
    if record:
        record = decide(record, maximize)  # from the stored runs, with the current selection rule
    # A noisy contender may win the finalist round: its interleaved clean runs decided, not its flag.
    by_number = {t.number: t for t in complete}
    if (
        record
        and record.get("winner_trial") in by_number
        and record.get("last_trial", -1) >= max(t.number for t in complete)
    ):
        return by_number[record["winner_trial"]], record, f"finalists: {record['selection']}"
    return clean[0], None, "best clean single measurement (no finalist round after the last trial)"


def _finalist_view(record: dict[str, Any] | None, winner: int) -> Finalists | None:
    """best.json's summary of the finalist round: every candidate's repeats and their spread."""
    if record is None:
        return None
    return Finalists(
        selection=record["selection"],
        order=record["order"],
        repeats=record["repeats"],
        seconds=record["seconds"],
        left_out=record.get("left_out", []),  # candidates the time left had no room for
        candidates=[_finalist_candidate(c, winner) for c in record["candidates"]],
    )


def _finalist_candidate(c: dict[str, Any], winner: int) -> FinalistCandidate:
    summary = c["summary"]
    return FinalistCandidate(
        trial=c["trial"],
        winner=c["trial"] == winner,
        candidate=c["candidate"],
        baseline=c["baseline"],
        config=c.get("config"),
        search_value=c["search_value"],
        values=[r.get("value") for r in c["runs"]],
        runs=c["runs"],
        median=summary["median"],
        min=summary["min"],
        max=summary["max"],
        spread_rel=summary["spread_rel"],
        noise_rel=summary["noise_rel"],
        clean_runs=summary["runs"],  # the median and range are over these only
        eligible=summary.get("eligible", True),
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
    config = baseline.user_attrs.get(Attr.CONFIG)
    return Baseline(
        trial=baseline.number,
        config=None if config is None else config_from_json(config, "baseline.config"),
        throughput_sps=metrics.throughput_sps,
        latency_ms=metrics.latency_ms.to_json(),
        sustained_rps=baseline.values[0] if metrics.server else None,
    )


def _study_drift(study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    return drift_report(
        drift_of(trial),
        StoredSpec.of(study),
        study.user_attrs.get(Attr.EVALUATION),
        study.user_attrs.get(Attr.CALIBRATION),
        study.user_attrs.get(Attr.REFERENCE_NOTE),
    )


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
        pareto_front=pareto_front(study) if pareto else None,
        finalists=_finalist_view(record, best.number),
        model=study.user_attrs.get(Attr.MODEL_FOR_TRIALS, spec.model),
        config=config_from_json(attrs.config),
        runtime=attrs.runtime or {"name": MAIN, "torch": attrs.torch_version},
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
        fingerprint=study.user_attrs.get(Attr.FINGERPRINT),
    )


def drift_report(
    drift: Drift | None,
    spec: StoredSpec,
    evaluation: dict[str, Any] | None,
    calibration: dict[str, Any] | None,
    reference_note: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The winner's drift: every metric, the one bounded with its drop and bound, and what it was
    measured on (`reference`: set when the FP32 outputs were constant across inputs, saying what was done)."""
    criterion = spec.criterion
    evaluation = evaluation or {
        "data": "synthetic seeded random inputs",
        "samples": spec.eval_samples,
        "synthetic": True,
    }
    return {
        **(drift.to_json() if drift else {}),
        "metric": criterion.metric,
        "drop": criterion.drop(drift) if drift else None,
        "max_drift": criterion.max_drop,
        "relative": criterion.relative,
        "criterion": criterion.describe(),
        "data": f"{evaluation['data']}: {evaluation['samples']} evaluation samples, FP32 eager outputs as reference"
        + (" (synthetic: says little about accuracy)" if evaluation.get("synthetic") else ""),
        "evaluation": evaluation,
        "calibration": calibration,
        "reference": reference_note,
    }


def _revalidated(record: dict[str, Any] | None, trial: int) -> float | None:
    for candidate in (record or {}).get("candidates", []):
        if candidate["trial"] == trial:
            return candidate["summary"]["median"]
    return None


def _speedup(
    record: dict[str, Any] | None,
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


def _finalist_speedup(record: dict[str, Any] | None, best: optuna.trial.FrozenTrial) -> float | None:
    """The winner's finalist median over the baseline's, when the round re-measured both."""
    if not record:
        return None
    medians = {c["trial"]: c["summary"]["median"] for c in record["candidates"]}
    base = next((c["summary"]["median"] for c in record["candidates"] if c.get("baseline")), None)
    return medians[best.number] / base if base and medians.get(best.number) else None


def _server_speedup(
    record: dict[str, Any] | None, best: optuna.trial.FrozenTrial, base_value: float | None
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


def server_summary(server: dict[str, Any]) -> ServerSummary:
    """best.json's `server`: the sustained rate at the bound, the batching policy a server should use,
    and the rate search's probes (each: offered and achieved rate, p50/p90/p99, the model's call time
    under that load, queue at start and end)."""
    return ServerSummary(
        sustained_rps=server["sustained_rps"],
        slo_ms=server["slo_ms"],
        max_batch=server["max_batch"],
        max_wait_ms=server["max_wait_ms"],
        upper_bound_rps=server["upper_bound_rps"],
        batching=server["batching"],
        routing=server["routing"],
        rule=server["rule"],
        probes=[
            {
                "rate_rps": p["rate_rps"],
                "achieved_rps": p["achieved_rps"],
                "p50_ms": p["latency_ms"]["p50"],
                "p90_ms": p["latency_ms"]["p90"],
                "p99_ms": p["latency_ms"]["p99"],
                "p99_ci_ms": p["p99_ci_ms"],
                "requests": p["requests"],
                "call_mean_ms": (p.get("call_ms") or {}).get("mean"),
                "call_p99_ms": (p.get("call_ms") or {}).get("p99"),
                "queue_start": p["queue_start"],
                "queue_end": p["queue_end"],
                "sustained": p["sustained"],
                "why": p["why"],
            }
            for p in server["probes"]
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
            config=t.user_attrs.get(Attr.CONFIG),
            config_summary=t.user_attrs.get(Attr.CONFIG_SUMMARY),
        )
        for t in sorted(front, key=lambda t: -t.values[0])
    ]


def closest_candidate(study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
    """The trial whose measured drift came closest to the bound, when none met it (nothing COMPLETE)."""
    criterion = StoredSpec.of(study).criterion
    measured = [
        (criterion.drop(drift), t)
        for t in study.get_trials(deepcopy=False)
        if (drift := drift_of(t)) is not None and t.user_attrs.get(Attr.CONFIG) and criterion.exceeded(drift)
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
            f"NO configuration met the drift bound ({drift['criterion']}); this is the closest candidate: "
            f"trial {trial.number} with {drift['metric']} drop {drift['drop']:.4g}. It was not timed. Loosen "
            "--max-drift, "
            "give calibration data (--data / --calibration-data), or add precisions closer to fp32 to the space"
        ),
        model=study.user_attrs.get(Attr.MODEL_FOR_TRIALS, spec.model),
        config=config_from_json(attrs.config),
        runtime=attrs.runtime,
        environment=attrs.env,
        drift=drift,
        fingerprint=study.user_attrs.get(Attr.FINGERPRINT),
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


def context_from_best(best: BestJson | dict[str, Any]) -> TrialContext:
    """What re-measuring an exported winner needs, from best.json alone: its reference, weights,
    measurement settings, caches and runtime."""
    best = BestJson.from_json(best)
    job = best.worker_job
    if job is None or job.reference_path is None or job.workdir is None:
        raise RecordError("best.json: its job lacks the reference, the work folder or the job itself")
    return TrialContext(
        probe_machine(),
        Reference(
            Path(job.reference_path),
            job.model,
            job.calibration or {"data": "synthetic", "samples": job.calibration_samples},
            generation=job.generation,
        ),
        job.measure_settings(),
        Path(job.workdir),
        job.calibration_samples,
        runtimes=runtimes_with(best.runtime),
        server={k: v for k, v in job.server.items() if k != "first_rates"} if job.server else None,
    )

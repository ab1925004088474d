"""Which trials may win and which one does: the study's baseline, its clean trials in order, its
direction, and the finalist round's decision rule (a win must exceed the noise; ties go to the
simpler configuration). Shared by the search (pruners, finalists) and everything that reads a study.

The rule reads the round as the study stores it (records/finalists.FinalistRound's JSON): export decides
again from the stored runs, and a round stored by an older autotune is decided by today's rule.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, TypeVar

import optuna

from autotune.backends import complexity_rank
from autotune.common.json_record import JsonObject
from autotune.measure.drift import Drift
from autotune.measure.serving import RELATIVE_TOLERANCE
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.config import TrialConfig
from autotune.records.finalists import FinalistRound
from autotune.records.metrics import FinalistRun, TrialMetrics
from autotune.records.spec import StoredSpec


def baseline_trial(study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
    """The completed eager fp32 baseline trial, if the study has one."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if TrialAttrs.of(trial).baseline:
            return trial
    return None


def metrics_of(trial: optuna.trial.FrozenTrial) -> TrialMetrics:
    """The typed metrics of a COMPLETE trial, from its stored user attributes."""
    return TrialMetrics.from_trial_attrs(trial.user_attrs, trial.number)


def drift_of(trial: optuna.trial.FrozenTrial) -> Drift | None:
    """The drift a trial measured or reused (PRUNED trials have one too), or None."""
    return TrialAttrs.of(trial).drift


def relative_noise(trial: optuna.trial.FrozenTrial) -> float:
    """Relative half-width of a completed trial's throughput (or median latency) confidence interval; for
    the server scenario, the rate search's tolerance."""
    attrs = TrialAttrs.of(trial)
    if attrs.server is not None:
        return RELATIVE_TOLERANCE
    value = attrs.measurement.throughput_ci_rel if attrs.measurement else None
    return float(value) if value is not None and math.isfinite(value) else 0.0


def is_valid(trial: optuna.trial.FrozenTrial) -> bool:
    """A completed measurement that no noise check flagged (trials from before the checks count as valid)."""
    return trial.state == optuna.trial.TrialState.COMPLETE and TrialAttrs.of(trial).valid


def noisy_contenders(study: optuna.study.Study) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials flagged noisy: never winners on their own measurement, but candidates for the
    finalist round when they measured ahead of the best clean trial."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if not TrialAttrs.of(t).valid
    ]


def throughput_unit(study: optuna.study.Study) -> str:
    """tokens/s for a generation study (generated tokens), samples/s otherwise."""
    return "tokens/s" if StoredSpec.of(study).task == "generate" else "samples/s"


def is_server(study: optuna.study.Study) -> bool:
    """A study of the server scenario: its value is a sustained request rate at a p99 bound."""
    return StoredSpec.of(study).objective == "server"


def primary_unit(study: optuna.study.Study) -> str:
    """What the study's value counts: requests/s sustained (server), tokens/s or samples/s, or ms."""
    if is_server(study):
        return "requests/s"
    return throughput_unit(study) if maximizes(study) else "ms"


def maximizes(study: optuna.study.Study) -> bool:
    """Whether the primary value grows with goodness: throughput, and a Pareto study's first objective."""
    return study.directions[0] == optuna.study.StudyDirection.MAXIMIZE


def primary_value(trial: optuna.trial.FrozenTrial) -> float:
    """The trial's value; for a Pareto study (throughput, p99) its throughput."""
    return trial.values[0]


def sequences_total(trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> int | None:
    """A trial's concurrent sequences in all (per instance x instances, from its recorded config): the
    workload a generation trial ran, whatever the study's `sequences` meant when it was stored; None without
    a recorded config."""
    config = TrialAttrs.of(trial).config
    return None if config is None else config.total_batch


def workload_of(study: optuna.study.Study, trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> int | None:
    """The total sequences a generation trial's speed is compared within (only trials that ran the same
    work compare); None for other studies, whose trials all compare."""
    return sequences_total(trial) if StoredSpec.of(study).task == "generate" else None


def clean_trials(study: optuna.study.Study, total: int | None = None) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials no noise check flagged, best first in the study's direction (a Pareto study:
    by throughput): the only ones that may win, set the speed pruner's bar or become finalists. `total`:
    a generation study's trials of that many sequences in all only."""
    clean = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if is_valid(t) and (total is None or sequences_total(t) == total)
    ]
    return sorted(clean, key=primary_value, reverse=maximizes(study))


def best_by_total(study: optuna.study.Study) -> dict[int, optuna.trial.FrozenTrial]:
    """A generation study's best clean trial at each total sequences it measured, fewest first."""
    best: dict[int, optuna.trial.FrozenTrial] = {}
    for trial in clean_trials(study):  # best first: the first of each total is its best
        total = sequences_total(trial)
        if total is not None and total not in best:
            best[total] = trial
    return dict(sorted(best.items()))


PRECISION_COMPLEXITY = {"fp32": 0, "bf16": 1, "int8": 2}


MIN_TIE_NOISE = 0.01  # never call a gap under 1% a win


def complexity(config: JsonObject) -> tuple:
    """Fewer moving parts first: the backend's own rank (its SPEC's complexity: eager < inductor < IPEX <
    ONNX Runtime < OpenVINO < torchao < llama.cpp); fp32 < bf16 < int8; one instance; the system allocator;
    then the smaller batch (lower latency)."""
    recorded = TrialConfig.from_json(config)
    return (
        complexity_rank(recorded.backend),
        PRECISION_COMPLEXITY.get(recorded.precision, len(PRECISION_COMPLEXITY)),
        recorded.instances,
        recorded.allocator != "glibc",
        recorded.batch_size,
        recorded.max_wait_ms or 0.0,  # the server scenario: no wait is the simpler policy
    )


def summarize_runs(
    values: list[float], ci_rels: list[float], rounds: list[float | None] | None = None
) -> dict[str, Any]:
    """Median, range and relative noise of one candidate's repeated measurements; `rounds` keeps each
    interleaved round's clean value (None where that run failed or was flagged) for paired comparison."""
    paired = {"rounds": rounds} if rounds is not None else {}
    if not values:
        return {"median": None, "min": None, "max": None, "spread_rel": None, "noise_rel": None, "runs": 0, **paired}
    median = statistics.median(values)
    spread = (max(values) - min(values)) / 2 / median if median else None
    noise = max([spread or 0.0, statistics.median(ci_rels) if ci_rels else 0.0, MIN_TIE_NOISE])
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread_rel": spread,
        "noise_rel": noise,
        "runs": len(values),
        **paired,
    }


MIN_PAIRED_ROUNDS = 3

T = TypeVar("T")


def interleaved_schedule(entries: list[T], repeats: int) -> list[tuple[int, T]]:
    """(round, entry) in running order: every entry once per round, each round starting one entry later
    (A B C, B C A, C A B), so run k of every entry is in round k and no entry keeps one place."""
    return [
        (round_index, entries[(round_index + place) % len(entries)])
        for round_index in range(repeats)
        for place in range(len(entries))
    ]


def paired_ratios(best: dict[str, Any], other: dict[str, Any], maximize: bool) -> list[float]:
    """How much better the best did than the other in each interleaved round both measured cleanly.

    The finalist round runs A B C, B C A, C A B: a shared machine that slows down for a round slows every
    candidate in it, which widens each candidate's own spread but cancels in the per-round ratio."""
    pairs = zip(best.get("rounds") or [], other.get("rounds") or [])
    return [(a / b if maximize else b / a) for a, b in pairs if a is not None and b is not None and a > 0 and b > 0]


def paired_win(best: dict[str, Any], other: dict[str, Any], maximize: bool) -> tuple[float, float] | None:
    """(median gain, its noise) when the best beat the other in every one of 3+ shared rounds by a median
    gain beyond the ratios' own half-range (and 1%); None otherwise."""
    ratios = paired_ratios(best, other, maximize)
    if len(ratios) < MIN_PAIRED_ROUNDS or min(ratios) <= 1.0:
        return None
    median = statistics.median(ratios)
    noise = max((max(ratios) - min(ratios)) / 2 / median, MIN_TIE_NOISE)
    return (median - 1.0, noise) if median - 1.0 > noise else None


def select_winner(candidates: list[dict[str, Any]], maximize: bool) -> tuple[int, str]:
    """Index of the winning candidate and why.

    Each candidate has `config` and `summary` (from summarize_runs). Only a candidate whose runs were
    mostly clean may win (`eligible`): one lucky clean run among noisy ones proves nothing. Candidates
    whose median is within the noise of the best median tie with it, unless (3+ runs each) every run of
    the best beat every run of theirs, or (3+ rounds both measured cleanly) the best won every round and
    its median per-round gain exceeds the per-round ratios' half-range; among the tied the simplest
    config wins.
    """
    measured = [
        i for i, c in enumerate(candidates) if c["summary"]["median"] is not None and c["summary"].get("eligible", True)
    ]
    if not measured:
        raise ValueError("no candidate has a majority of clean finalist measurements")
    ordered = sorted(measured, key=lambda i: candidates[i]["summary"]["median"], reverse=maximize)
    top = candidates[ordered[0]]["summary"]
    if len(ordered) == 1:
        only = "the only candidate re-measured" if len(candidates) == 1 else "only one candidate has clean measurements"
        return ordered[0], only

    def gap(i: int) -> float:
        other = candidates[i]["summary"]["median"]
        smaller = min(top["median"], other)
        return abs(top["median"] - other) / smaller if smaller > 0 else math.inf

    def noise(i: int) -> float:
        return max(top["noise_rel"], candidates[i]["summary"]["noise_rel"])

    def separated(i: int) -> bool:
        """With 3+ runs each, every run of the best beats every run of the other."""
        other = candidates[i]["summary"]
        if min(top["runs"], other["runs"]) < 3:
            return False
        return top["min"] > other["max"] if maximize else top["max"] < other["min"]

    def paired(i: int) -> tuple[float, float] | None:
        return paired_win(top, candidates[i]["summary"], maximize)

    tied = [ordered[0], *(i for i in ordered[1:] if gap(i) <= noise(i) and not separated(i) and not paired(i))]
    runner_up = ordered[1]
    if len(tied) == 1:
        if gap(runner_up) <= noise(runner_up) and separated(runner_up):
            return ordered[0], (
                f"beats the runner-up by {gap(runner_up):.1%}: every run of it beat every run of the runner-up "
                f"(noise {noise(runner_up):.1%})"
            )
        if gap(runner_up) <= noise(runner_up):
            gain, paired_noise = paired(runner_up) or (0.0, 0.0)
            rounds = len(paired_ratios(top, candidates[runner_up]["summary"], maximize))
            return ordered[0], (
                f"beats the runner-up in each of {rounds} interleaved rounds, by a median {gain:.1%} per round, "
                f"more than the rounds' paired noise ({paired_noise:.1%}; the medians' gap {gap(runner_up):.1%} "
                f"is within the unpaired noise {noise(runner_up):.1%})"
            )
        return ordered[0], (
            f"beats the runner-up by {gap(runner_up):.1%}, more than the noise ({noise(runner_up):.1%})"
        )
    simplest = min(tied, key=lambda i: complexity(candidates[i]["config"]))
    others = ", ".join(
        f"#{candidates[i]['trial']} ({gap(i):.1%} from the best, noise {noise(i):.1%})" for i in tied if i != ordered[0]
    )
    if simplest == ordered[0]:
        return simplest, f"fastest, and the simplest of the configs within the noise of it: {others}"
    return (
        simplest,
        f"tie within the noise with the fastest (#{candidates[ordered[0]]['trial']}): the simpler config wins; "
        f"tied: {others}",
    )


def decide(record: dict[str, Any], maximize: bool) -> dict[str, Any]:
    """Summarize each entry's clean runs and pick the winner; export re-decides from the stored runs."""
    for entry in record["candidates"]:
        runs = [FinalistRun.from_json(r) for r in entry["runs"]]
        clean = [r.value for r in runs if r.valid and r.value is not None]
        cis = [r.ci_rel for r in runs if r.valid and r.value is not None and r.ci_rel is not None]
        rounds = [r.value if r.valid else None for r in runs]  # run k of every entry is round k
        entry["summary"] = {
            **summarize_runs(clean, cis, rounds),
            "of_runs": len(runs),
            "eligible": len(clean) > len(runs) / 2,  # a majority clean: 2 of 3
        }
    contenders = [e for e in record["candidates"] if e["candidate"]]
    # the round had time for every round of fewer candidates only
    left_out = ", ".join(f"#{number}" for number in record.get("left_out") or [])
    note = f"; left out, their rounds would not fit the time left: {left_out}" if left_out else ""
    try:
        index, reason = select_winner(contenders, maximize)
        record.update(winner_trial=contenders[index]["trial"], selection=reason + note)
    except ValueError as exc:
        record.update(winner_trial=None, selection=str(exc) + note)
    return record


def finalist_round(study: optuna.study.Study) -> FinalistRound | None:
    """The study's finalist round, decided again from its stored runs with the current rule (None: no round
    ran)."""
    stored = study.user_attrs.get(Attr.FINALISTS)
    return FinalistRound.from_json(decide(stored, maximizes(study))) if stored else None

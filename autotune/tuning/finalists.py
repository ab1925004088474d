"""The end of a search: the top few configs re-measured in fresh processes, interleaved, several times.

One lucky measurement must not pick the winner. Candidates (and the eager baseline, for an interleaved
speedup) run in rounds, each round every entry once, so a slow drift of a shared machine hits all alike;
each round starts one entry later (A B C, B C A, C A B), so no entry always runs in the same place
(after the baseline, first after a pause), which would bias the paired per-round comparison. The winner
must beat the runner-up by more than the noise; otherwise the simpler config wins the tie.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.common.errors import TrialFailed
from autotune.measure.drift import Drift
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.finalists import FinalistEntry, FinalistRound
from autotune.records.metrics import FinalistRun, TrialMetrics
from autotune.results.selection import (
    clean_trials,
    decide,
    interleaved_schedule,
    maximizes,
    noisy_contenders,
    primary_value,
    workload_of,
)
from autotune.runner.trials import TrialContext, run_config


def pick_candidates(study: optuna.study.Study, count: int) -> list[optuna.trial.FrozenTrial]:
    """The best `count` clean trials with distinct configs, best first; and any trial flagged noisy
    whose value put it ahead of the best clean one (one extra place each, at most `count`), right after
    the best clean one: a noise flag must not bury the fastest configuration, and the interleaved repeats
    decide it. In this order a round too short for all of them keeps the first (candidates_that_fit)."""
    picked, seen = [], set()
    leading = clean_trials(study)[:1]
    # a generation study's finalists ran the leader's total sequences: only the same work compares
    total = workload_of(study, leading[0]) if leading else None
    for trial in clean_trials(study, total):
        key = TrialAttrs.of(trial).config_summary or str(trial.params)
        if key not in seen:
            seen.add(key)
            picked.append(trial)
        if len(picked) == count:
            break
    if not picked:
        return picked
    maximize = maximizes(study)
    best = primary_value(picked[0])
    ahead_of_best = []
    contenders = [t for t in noisy_contenders(study) if total is None or workload_of(study, t) == total]
    for trial in sorted(contenders, key=primary_value, reverse=maximize)[:count]:
        key = TrialAttrs.of(trial).config_summary or str(trial.params)
        ahead = primary_value(trial) > best if maximize else primary_value(trial) < best
        if ahead and key not in seen:
            seen.add(key)
            ahead_of_best.append(trial)
    return [picked[0], *ahead_of_best, *picked[1:]]


def run_finalists(
    study: optuna.study.Study,
    ctx: TrialContext,
    work_dir: Path,
    count: int,
    repeats: int,
    deadline: float,
    timeout_s: float,
    objective_value: Callable[[TrialMetrics], float],
    baseline: optuna.trial.FrozenTrial | None,
    log: Callable[[str], None],
) -> FinalistRound | None:
    """Re-measure the top candidates (and the baseline) in interleaved rounds; store and return the record."""
    maximize = maximizes(study)
    picked = pick_candidates(study, count)
    if not picked:
        return None
    time_left_s = deadline - time.monotonic()
    picked, left_out = fit_round(picked, baseline, repeats, time_left_s)
    if left_out:
        log(
            f"finalists: {len(picked)} candidate(s) fit {repeats} interleaved rounds in the {time_left_s:.0f} s left; "
            f"left out: {', '.join('#' + str(t.number) for t in left_out)}"
        )
    entries = finalist_entries(picked, baseline)
    # The server scenario: every entry is probed first at the leading trial's rate and +-10%, so their
    # latency-against-rate curves meet at the same rates; the rate search then narrows in between.
    lead = picked[0].value or 0.0
    server_rates = [lead, 1.1 * lead, 0.9 * lead] if ctx.server and lead > 0 else None
    stored = study.get_trials(deepcopy=False)  # one read of the storage: `study.trials` reads them all each time
    trials = {e.trial: stored[e.trial] for e in entries}
    started = time.monotonic()
    log(f"finalists: re-measuring trials {', '.join('#' + str(e.trial) for e in entries)} x{repeats}, interleaved")
    rounds = _InterleavedRounds(ctx, work_dir, deadline, timeout_s, objective_value, server_rates, log)
    rounds.run(entries, trials, repeats)
    record = FinalistRound(
        repeats=repeats,
        seconds=time.monotonic() - started,
        candidates=entries,
        last_trial=max(t.number for t in study.get_trials(deepcopy=False)),
        order="rounds over the candidates and the baseline, each starting one entry later, fresh processes per run",
        left_out=[t.number for t in left_out],
        server_rates=server_rates,
        host=socket.gethostname(),
    )
    decided = FinalistRound.from_json(decide(record.to_json(), maximize))
    study.set_user_attr(Attr.FINALISTS, decided.to_json())
    return decided


def finalist_entries(
    picked: list[optuna.trial.FrozenTrial], baseline: optuna.trial.FrozenTrial | None
) -> list[FinalistEntry]:
    """The round's entries, each to collect its runs: the candidates in their order, then the baseline
    when it is not among them (it runs every round for the interleaved speedup without being a candidate)."""
    base_number = baseline.number if baseline is not None else None
    entries = [_entry(t, candidate=True, baseline=t.number == base_number) for t in picked]
    if baseline is not None and base_number not in {t.number for t in picked}:
        entries.append(_entry(baseline, candidate=False, baseline=True))
    return entries


def _entry(trial: optuna.trial.FrozenTrial, candidate: bool, baseline: bool) -> FinalistEntry:
    config = TrialAttrs.of(trial).config
    if config is None:  # a completed trial always recorded its config
        raise TrialFailed(f"trial {trial.number} recorded no config to re-measure")
    return FinalistEntry(trial.number, config, trial.value, candidate=candidate, baseline=baseline)


@dataclass
class _InterleavedRounds:
    """The interleaved rounds' settings, shared by every run in them."""

    ctx: TrialContext
    work_dir: Path
    deadline: float
    timeout_s: float
    objective_value: Callable[[TrialMetrics], float]
    server_rates: list[float] | None
    log: Callable[[str], None]

    def run(self, entries: list[FinalistEntry], trials: dict[int, optuna.trial.FrozenTrial], repeats: int) -> None:
        """Every entry once per round, `repeats` rounds, each run appended to its entry's runs; stops
        when the next run would not fit the time left."""
        seconds = {number: _trial_seconds(trial) for number, trial in trials.items()}
        # A rate search stops early, not with a failure, when its time runs short: it keeps the full timeout.
        timeouts = {
            number: self.timeout_s if self.ctx.server else finalist_timeout(measuring + preparing, self.timeout_s)
            for number, (measuring, preparing) in seconds.items()
        }
        # Drift depends on numerics (a language model's also on its sequences, each entry's own): the search
        # already measured it for every entry.
        known_drift = {number: _search_drift(trial) for number, trial in trials.items()}
        for round_index, entry in interleaved_schedule(entries, repeats):
            if not run_fits(trials[entry.trial], self.deadline - time.monotonic()):
                self.log("finalists: budget reached; deciding on the runs made so far")
                break
            self._run_once(entry, round_index, timeouts[entry.trial], known_drift[entry.trial])

    def _run_once(self, entry: FinalistEntry, round_index: int, timeout: float, known_drift: Drift | None) -> None:
        """One re-measurement of the entry in fresh processes, appended to its runs (a failed one with its
        cause) and logged."""
        run_dir = self.work_dir / f"round{round_index}-trial{entry.trial:05d}"
        label = f"finalists: round {round_index + 1} trial #{entry.trial}"
        try:
            metrics, _, _ = run_config(
                entry.config,
                self.ctx,
                run_dir,
                timeout,
                known_drift=known_drift,
                server_rates=self.server_rates,
                server_round=round_index + 1,  # fresh arrivals each round, the same for every candidate in it
            )
        except TrialFailed as exc:
            entry.runs.append(FinalistRun(failed=exc.cause))
            self.log(f"{label} FAILED: {exc.cause}")
            return
        value = self.objective_value(metrics)
        served = metrics.llm_server or metrics.server
        if served is not None and value <= 0:  # no rate sustained this time: a failed run, not a value
            cause = f"no rate sustained: {served.verdict}"
            entry.runs.append(FinalistRun(failed=cause))
            self.log(f"{label} FAILED: {cause}")
            return
        entry.runs.append(FinalistRun.of(value, metrics))
        self.log(f"{label} {value:.2f}{metrics.noisy_note()}")


def fit_round(
    picked: list[optuna.trial.FrozenTrial], baseline: optuna.trial.FrozenTrial | None, repeats: int, time_left_s: float
) -> tuple[list[optuna.trial.FrozenTrial], list[optuna.trial.FrozenTrial]]:
    """The picked candidates whose every round fits the time left (candidates_that_fit), in their order,
    and those left out. The baseline runs every round in any case (for the speedup): when it is among
    the picked, it keeps its place, takes no other candidate's and is never left out."""
    base_number = baseline.number if baseline is not None else None
    others = [t for t in picked if t.number != base_number]
    fitting = candidates_that_fit(
        [finalist_run_s(t) for t in others],
        finalist_run_s(baseline) if baseline is not None else 0.0,
        repeats,
        time_left_s,
    )
    left_out = {t.number for t in others[fitting:]}
    return [t for t in picked if t.number not in left_out], others[fitting:]


def candidates_that_fit(candidate_s: list[float], baseline_s: float, repeats: int, time_left_s: float) -> int:
    """How many of the candidates (best first, each with what one run of it costs; the baseline left out)
    the round takes: the most whose every round, with the baseline's run, fits the time left; at least one.

    Rounds cut short by the budget leave one or two runs per candidate, too few for a gap of 5-10% to
    exceed the noise, and the tie then goes to the simpler config: a 20-minute vit_b_16 search re-measured
    3 candidates for 2 of 3 rounds and exported the one 10% slower. Fewer candidates, each measured in
    every round, keep the decision on complete evidence; the search already measured those left out."""
    for count in range(len(candidate_s), 1, -1):
        if repeats * (sum(candidate_s[:count]) + baseline_s) <= time_left_s:
            return count
    return min(1, len(candidate_s))


START_S = 5.0  # a finalist run's process start, which its trial's `starting_s` shares with the drift evaluation


def finalist_run_s(trial: optuna.trial.FrozenTrial) -> float:
    """What one finalist run of the trial should cost: its trial's time without the drift evaluation (a
    finalist reuses the search's drift) and without its artifact's preparation (the round reuses the
    cached artifact), unless another host built it (a fleet: this host's cache may not hold it)."""
    attrs = TrialAttrs.of(trial)
    budget = attrs.budget
    if budget is None:  # a trial from before the budget was recorded
        return _trial_seconds(trial)[0]
    elsewhere = attrs.host not in (None, socket.gethostname())
    run_s = budget.total_s - budget.preparing_s - budget.starting_s + START_S
    return max(START_S, run_s + (budget.preparing_s if elsewhere else 0.0))


def run_fits(trial: optuna.trial.FrozenTrial, time_left_s: float) -> bool:
    """Whether one more finalist run of the trial fits the time left, by the estimate the round was sized
    with (finalist_run_s): the trial's wall time, which holds its drift evaluation, would stop a round
    that fit before its last run, and the tie rule then decides on fewer runs than planned."""
    return time_left_s >= finalist_run_s(trial)


def finalist_timeout(trial_s: float, trial_timeout_s: float) -> float:
    """How long one re-measurement may take: three times what its trial took in the search (with its
    artifact's preparation: a cache that evicted the artifact, or another host's, builds it again) and
    half a minute for a slow start, never more than the trial timeout. A run that hangs then costs
    minutes, not the rest of the budget (an efficientnet_b0 finalist whose trial took 40 s hung for 10
    minutes under the 600-second timeout)."""
    return min(trial_timeout_s, 3.0 * trial_s + 30.0)


def _search_drift(trial: optuna.trial.FrozenTrial) -> Drift | None:
    drift = TrialAttrs.of(trial).drift
    return None if drift is None else drift.reused_by_another(trial.number)


def _trial_seconds(trial: optuna.trial.FrozenTrial) -> tuple[float, float]:
    """How long the trial took in the search: the seconds without its artifact's preparation (what a
    finalist run with a cached artifact takes), and the preparation's."""
    if trial.datetime_start and trial.datetime_complete:
        prepare_s = TrialAttrs.of(trial).prepare_s or 0.0
        return max(5.0, (trial.datetime_complete - trial.datetime_start).total_seconds() - prepare_s), prepare_s
    return 30.0, 0.0

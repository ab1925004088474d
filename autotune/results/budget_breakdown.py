"""Where a study's budget went: its trials' time by stage (each trial's `budget`, tuning/stage_times.py),
the finalist round, and the rest of the study's wall time (the sampler, orchestration, trials that
never reached their first barrier, and stored trials from before stages were recorded)."""

from __future__ import annotations

import optuna

from autotune.common.durations import format_duration
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.finalists import FinalistRound

STAGES = (
    ("preparing", "preparing_s"),
    ("loading and compiling", "loading_s"),
    ("starting and drift", "starting_s"),
    ("warm-up", "warmup_s"),
    ("screening", "screening_s"),
    ("measuring", "measuring_s"),
)


def budget_breakdown(study: optuna.study.Study) -> list[tuple[str, float]]:
    """(stage, seconds) over the study's wall time, from its first trial's start to its last event; the
    stages are summed over trials (trials of a fleet run side by side, so they may exceed the wall time,
    and `other` is then 0)."""
    trials = study.get_trials(deepcopy=False)
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    if not starts or not ends:
        return []
    sums = dict.fromkeys((name for name, _ in STAGES), 0.0)
    for trial in trials:
        budget = TrialAttrs.of(trial).budget
        if budget is None:
            continue
        for name, field in STAGES:
            sums[name] += getattr(budget, field)
    stored = study.user_attrs.get(Attr.FINALISTS)
    finalists = (FinalistRound.from_json(stored).seconds or 0.0) if stored else 0.0
    wall = (max(ends) - min(starts)).total_seconds() + finalists
    rows = [*sums.items(), ("finalists", finalists)]
    rows.append(("other (sampler, orchestration, unrecorded)", max(0.0, wall - sum(v for _, v in rows))))
    return rows


def budget_line(study: optuna.study.Study) -> str | None:
    """One line for `autotune show`: the wall time and each stage's share."""
    rows = budget_breakdown(study)
    total = sum(seconds for _, seconds in rows)
    if not rows or total <= 0:
        return None
    parts = ", ".join(f"{name} {format_duration(s)} ({s / total:.0%})" for name, s in rows if s >= 0.5)
    return f"where the time went ({format_duration(total)}): {parts}"

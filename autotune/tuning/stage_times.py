"""Where a trial's time goes: the orchestrator stamps the barriers a trial reaches (ready, screened)
and splits its wall time into preparing, loading and compiling, warm-up, screening and measuring
(records.metrics.TrialBudget, stored on the trial as `budget`; results.budget sums a study's).

What that costs decides too: a coverage trial whose backend already took more than a set share of the
budget left just to prepare and load (an export, a quantization, inductor's compile) is deferred:
skipped, with the reason, so the rest of the round is measured first.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import optuna

from autotune.records.attributes import TrialAttrs
from autotune.records.metrics import ReadyReport, TrialBudget, TrialMetrics

DEFER_SHARE = 0.25  # a backend whose preparation alone took more than this share of the time left waits
RESERVE_MARGIN = 1.5  # the finalists' reserve: this many times the round's estimated cost
RESERVE_AFTER = 3  # completed trials before their costs size the reserve


class StageClock:
    """The monotonic times a trial started, had its artifact (`prepared`) and reached each barrier."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.stages: dict[str, float] = {}
        self.before_ready: tuple[float, float] | None = None  # (loading, warm-up) the workers said at "ready"

    def reached(self, stage: str, payloads: list[dict[str, Any]] | None = None) -> None:
        """`payloads`: the instances' barrier payloads; at "ready" they say what loading and warm-up took,
        which is all a trial pruned there leaves to split its time by."""
        self.stages.setdefault(stage, time.monotonic())
        if stage == "ready" and payloads:
            reports = [ReadyReport.from_json(p) for p in payloads]
            loading = max(r.load_s + r.first_call_s for r in reports)
            self.before_ready = (loading, max(r.warmup_s for r in reports))

    def spent(self, metrics: TrialMetrics | None) -> TrialBudget:
        """The trial's time until now, split as far as what is known allows (see TrialBudget)."""
        end = time.monotonic()
        ready, screened = self.stages.get("ready"), self.stages.get("screened")
        before_timing = (ready if ready is not None else end) - self.start
        screening = screened - ready if ready is not None and screened is not None else 0.0
        measuring = end - (screened if screened is not None else ready) if ready is not None else 0.0
        preparing = loading = warmup = 0.0
        prepared = self.stages.get("prepared")
        if metrics is None and prepared is not None:  # pruned or failed: the artifact's time is known
            preparing = min(prepared, ready if ready is not None else end) - self.start
        if metrics is None and self.before_ready is not None:  # pruned at or after the ready barrier
            loading, warmup = self.before_ready
        if metrics is not None:
            preparing = metrics.prepare_s
            loading = (metrics.load_s or 0.0) + (metrics.first_call_s or 0.0)
            warmup = max((share.warmup_s or 0.0 for share in metrics.instances), default=0.0)
        # never more than the time before the barrier (a reused artifact costs nothing here)
        scale = min(1.0, before_timing / (preparing + loading + warmup)) if preparing + loading + warmup else 1.0
        preparing, loading, warmup = preparing * scale, loading * scale, warmup * scale
        return TrialBudget(
            total_s=end - self.start,
            starting_s=max(0.0, before_timing - preparing - loading - warmup),
            preparing_s=preparing,
            loading_s=loading,
            warmup_s=warmup,
            screening_s=screening,
            measuring_s=measuring,
        )


class FinalistReserve:
    """When the search must stop so the finalist round fits: the budget's end less a reserve. At most
    `share` of the budget (--finalist-share); once RESERVE_AFTER trials have completed, their cost sizes
    it instead: the round's runs ((finalists + baseline) x repeats), each about a completed trial's time
    without its artifact's preparation (which the round reuses), times RESERVE_MARGIN. A fixed share
    left a 60-minute resnet50 search 10 of its 12 reserved minutes unused."""

    def __init__(
        self, study: optuna.study.Study, deadline: float, budget_s: float, share: float, finalists: int, repeats: int
    ) -> None:
        self.study, self.deadline = study, deadline
        self.cap = share * budget_s if finalists > 0 else 0.0
        self.runs = (finalists + 1) * repeats

    def reserve_s(self) -> float:
        costs = [
            budget.total_s - budget.preparing_s
            for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if (budget := _budget_of(t)) is not None
        ]
        if not self.cap or len(costs) < RESERVE_AFTER:
            return self.cap
        return min(self.cap, RESERVE_MARGIN * self.runs * statistics.median(costs))

    def search_deadline(self) -> float:
        return self.deadline - self.reserve_s()


def _budget_of(trial: optuna.trial.FrozenTrial) -> TrialBudget | None:
    return TrialAttrs.of(trial).budget


def deferral(
    backend: str, precision: str, earlier: list[tuple[int, str, TrialBudget]], remaining_s: float
) -> str | None:
    """Why a coverage trial of `backend` at `precision` should wait, or None: `earlier` are (trial number,
    precision, budget) of this study's trials of the same backend; the costliest start (processes,
    artifact, loading and compiling, drift) of those at the same precision is the estimate, else the
    cheapest of the others'. An artifact is built for its precision (an int8 quantization says nothing
    of what an fp32 export costs), so another precision's preparation is left out; and its drift
    evaluation runs at its precision's speed, so one slow precision says little of another (a language
    model's int4 weights with fp32 activations took eager 576 s to start and load on a Xeon with AMX,
    which deferred eager's fp32 and SmoothQuant coverage trials; its bf16 had taken 11 s)."""
    if not earlier:
        return None

    def cost(item: tuple[int, str, TrialBudget]) -> float:  # before the timed windows, warm-up (a setting) left out
        _, other, budget = item
        return budget.starting_s + budget.loading_s + (budget.preparing_s if other == precision else 0.0)

    same = [item for item in earlier if item[1] == precision]
    costliest = max(same, key=cost) if same else min(earlier, key=cost)
    number, other, _ = costliest
    seconds = cost(costliest)
    if seconds <= DEFER_SHARE * remaining_s:
        return None
    what = "start, prepare and load" if other == precision else f"start and load (its {other} preparation left out)"
    return (
        f"deferred: {backend} took {seconds:.0f}s to {what} in trial {number}, more than "
        f"{DEFER_SHARE:.0%} of the {remaining_s:.0f}s left"
    )

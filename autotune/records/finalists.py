"""The finalist round as the study keeps it (its `finalists` attribute): every entry's interleaved runs,
their summary, and the decision. The search writes it (tuning/finalists.py); the results read it, and
export decides again from its runs with the current rule (results/selection.decide).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from autotune.common.json_record import OpenRecord, Record
from autotune.records.config import TrialConfig
from autotune.records.metrics import FinalistRun


@dataclass(frozen=True)
class RunSummary(OpenRecord):
    """One entry's clean runs: their median, range and relative noise; each interleaved round's clean value
    (None where that run failed or was flagged), how many runs it had, and whether enough of them were
    clean for it to win (a majority)."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("rounds", "of_runs")

    median: float | None = None
    min: float | None = None
    max: float | None = None
    spread_rel: float | None = None
    noise_rel: float | None = None
    runs: int = 0  # the clean ones
    rounds: list[float | None] | None = None
    of_runs: int | None = None
    eligible: bool = True


@dataclass(frozen=True)
class FinalistEntry(OpenRecord):
    """One entry of the round: a candidate, or the baseline run beside them for the interleaved speedup."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"config": TrialConfig, "runs": FinalistRun, "summary": RunSummary}
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("summary",)

    trial: int
    config: TrialConfig
    search_value: float | None = None
    runs: list[FinalistRun] = field(default_factory=list)
    candidate: bool = True
    baseline: bool = False
    summary: RunSummary | None = None  # set by the decision


@dataclass(frozen=True)
class FinalistRound(OpenRecord):
    """The round: how often each entry ran and how long it took, its entries, the last trial it knew of (a
    trial completed after it makes it stale), the candidates the time left had no room for, and the
    decision (`winner_trial`, None when no candidate had a majority of clean runs, and why)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"candidates": FinalistEntry}
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("server_rates",)

    repeats: int | None = None
    seconds: float | None = None
    candidates: list[FinalistEntry] = field(default_factory=list)
    last_trial: int = -1
    order: str | None = None  # how the runs were ordered, in words
    left_out: list[int] = field(default_factory=list)  # candidates whose rounds would not have fit the time left
    server_rates: list[float] | None = None  # the server scenario: the rates every entry was probed at first
    host: str | None = None  # in a fleet, the orchestrator whose round this is (the last to finish)
    winner_trial: int | None = None
    selection: str | None = None

    def entry(self, trial: int) -> FinalistEntry | None:
        return next((c for c in self.candidates if c.trial == trial), None)

    def median_of(self, trial: int) -> float | None:
        """The entry's median over its clean runs (None: not in the round, or no clean run)."""
        entry = self.entry(trial)
        return entry.summary.median if entry is not None and entry.summary is not None else None

    def baseline_median(self) -> float | None:
        return next((c.summary.median for c in self.candidates if c.baseline and c.summary is not None), None)

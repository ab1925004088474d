"""The speed gate on drift evaluation: a configuration far slower than the best so far stops early.

Drift is measured before any timing, on the whole evaluation set. For a configuration that runs at a
small fraction of the best one's speed (emulated bf16 on a CPU without it, say) that evaluation alone
can take minutes, only for screening to prune it right after. The gate watches the evaluation's own
pace: once `after_s` seconds have passed, an instance that evaluates fewer samples per second than the
gate's floor stops, and the search prunes the trial before its drift is judged or anything is timed.

The floor is set far below the speed pruner's widest bar (see search/study.py), so that a trial the
gate stops is one screening would have pruned anyway; the pace of the first `after_s` seconds includes
whatever one-time cost the first calls still carry, which the wait keeps from deciding alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from autotune.common.records import Record


@dataclass(frozen=True)
class SpeedGate(Record):
    """The floor one instance's drift evaluation must keep, and what it was derived from."""

    min_samples_per_s: float  # per instance: the trial's floor divided by its instances
    after_s: float  # how long the evaluation runs before the pace is judged
    basis: str  # the comparison behind the floor, for the prune reason


@dataclass(frozen=True)
class GateVerdict(Record):
    """What the gate saw when it stopped a drift evaluation."""

    samples: int
    seconds: float
    samples_per_s: float
    gate: SpeedGate

    NESTED: ClassVar[dict[str, type[Record]]] = {"gate": SpeedGate}

    def reason(self) -> str:
        return (
            f"too slow to be worth its drift evaluation: {self.samples_per_s:.3g} samples/s per instance over its "
            f"first {self.seconds:.1f} s ({self.samples} samples), below the gate's "
            f"{self.gate.min_samples_per_s:.3g} ({self.gate.basis}): pruned before anything was timed"
        )


class GateTripped(Exception):
    """Raised from inside the evaluation loop; carries the verdict to the ready barrier."""

    def __init__(self, verdict: GateVerdict) -> None:
        super().__init__(verdict.reason())
        self.verdict = verdict


class GateWatch:
    """Called after each evaluated batch with the samples done so far; raises GateTripped once the
    evaluation has run `after_s` and its pace is below the floor."""

    def __init__(self, gate: SpeedGate, clock: Callable[[], float] = time.monotonic) -> None:
        self.gate = gate
        self.clock = clock
        self.started = clock()

    def __call__(self, samples_done: int) -> None:
        seconds = self.clock() - self.started
        if seconds < self.gate.after_s:
            return
        pace = samples_done / seconds if seconds > 0 else float("inf")
        if pace < self.gate.min_samples_per_s:
            raise GateTripped(GateVerdict(samples_done, seconds, pace, self.gate))

"""The speed gate: a configuration far slower than the best so far stops before anything is timed.

Drift is measured before any timing, on the whole evaluation set. For a configuration that runs at a
small fraction of the best one's speed (emulated bf16 on a CPU without it, say) that evaluation alone
can take minutes, only for screening to prune it right after. The gate watches the evaluation's own
pace: once `after_s` seconds have passed, an instance that evaluates fewer samples per second than the
gate's floor stops, and the search prunes the trial before its drift is judged or anything is timed.

When an earlier trial of the same numerics already measured the drift, there is no evaluation to
watch: the gate watches the warm-up's calls instead (an ONNX Runtime fp32 vit_b_16 at batch 64 on one
thread spent 129 s warming up at 1.35 samples/s, against the best's 55, before screening pruned it).
The warm-up's pace is counted from its start: the model's first call, with its one-time costs, ran
when it was loaded.

The floor is half the speed pruner's widest bar (tuning/pruners.py), so that a trial the gate stops is
one screening would have pruned anyway. The pace is counted from the end of the evaluation's first
batch, which may still carry a one-time cost (a kernel cache, a profiling run), over at least `after_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from autotune.common.json_record import Record


@dataclass(frozen=True)
class SpeedGate(Record):
    """The floor one instance's drift evaluation and warm-up must keep, and what it was derived from."""

    min_samples_per_s: float  # of one instance (throughput: the trial's floor over its instances)
    after_s: float  # how long the evaluation or warm-up runs before the pace is judged
    basis: str  # the comparison behind the floor, for the prune reason


@dataclass(frozen=True)
class GateVerdict(Record):
    """What the gate saw when it stopped a drift evaluation or a warm-up."""

    samples: int
    seconds: float
    samples_per_s: float
    gate: SpeedGate
    stage: str = "drift evaluation"  # or "warm-up"
    instance: int = 0  # the instance it watched (a drift evaluation runs in instance 0 only)

    NESTED: ClassVar[dict[str, type[Record]]] = {"gate": SpeedGate}

    def reason(self) -> str:
        return (
            f"too slow to be worth its {self.stage}: {self.samples_per_s:.3g} samples/s in instance "
            f"{self.instance} over {self.seconds:.1f} s {self.counted_from()} ({self.samples} samples), below the "
            f"gate's {self.gate.min_samples_per_s:.3g} ({self.gate.basis}): pruned before anything was timed"
        )

    def counted_from(self) -> str:
        return "after its first batch" if self.stage == "drift evaluation" else f"of its {self.stage}"


class GateTripped(Exception):
    """Raised from inside the evaluation loop; carries the verdict to the ready barrier."""

    def __init__(self, verdict: GateVerdict) -> None:
        super().__init__(verdict.reason())
        self.verdict = verdict


class GateWatch:
    """Called after each evaluated batch with the samples done so far; raises GateTripped once `after_s`
    have passed since the first call (the first batch's end; a warm-up calls it with 0 before it starts)
    and both the pace since then and the latest batch's own pace are below the floor. The latest batch
    must be slow too: a warm-up's first call may carry a one-time cost (IPEX fuses its int8 graph
    there) that drags the pace since the start below the floor while the calls after it are fast; a
    warm-up is judged from its second call on (`min_calls`), so a first call that alone outlasts `after_s`
    is not the latest call judged either."""

    def __init__(
        self,
        gate: SpeedGate,
        clock: Callable[[], float] = time.monotonic,
        stage: str = "drift evaluation",
        instance: int = 0,
        min_calls: int = 1,
    ) -> None:
        self.gate = gate
        self.clock = clock
        self.stage = stage
        self.instance = instance
        self.min_calls = min_calls
        self.calls = 0  # judged calls since the first
        self.first: tuple[float, int] | None = None  # when the first batch ended, and its samples
        self.last: tuple[float, int] | None = None  # when the latest batch ended, and the samples then

    def __call__(self, samples_done: int) -> None:
        now = self.clock()
        if self.first is None or self.last is None:
            self.first = self.last = (now, samples_done)
            return
        seconds, samples = now - self.first[0], samples_done - self.first[1]
        latest_s, latest_samples = now - self.last[0], samples_done - self.last[1]
        self.last = (now, samples_done)
        self.calls += 1
        if seconds < self.gate.after_s or self.calls < self.min_calls:
            return
        floor = self.gate.min_samples_per_s
        pace = samples / seconds
        if pace < floor and latest_samples < floor * latest_s:
            raise GateTripped(GateVerdict(samples, seconds, pace, self.gate, self.stage, self.instance))

"""How good the measurement itself is, on this machine: a table per question.

1. Does the stated 95% throughput interval hold the true rate? A synthetic worker with a known rate and
   realistic jitter (call times near 10 ms, 5% stalls of 30-50 ms) is measured N times through the
   protocol (warm window, stop rule), on a simulated clock; coverage is the share of intervals holding
   the true rate. The batch-means interval (autotune's) against the median call time's interval
   applied to the throughput (what autotune stated before).
2. What does checking the stop rule cost? A busy-wait call of D µs is timed for a 3 s window (the rule
   never satisfied, so it is checked all along); the time between a call's end and the rule's verdict,
   summed, against the window. autotune's rule against the earlier one (list of tuples to an array,
   a full sort, binomial ranks recomputed at each check).

    .venv/bin/python docs/benchmarks/measurement_quality.py [--runs 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from autotune.measure.stopwatch import (
    STOP_CHECK_EVERY_S,
    MeasureSettings,
    common_window_throughput,
    median_ci,
    median_ci_ranks,
    timed_window,
)


class SimulatedClock:
    """Moves only when a call 'runs', by the next duration of a series."""

    def __init__(self, durations: np.ndarray) -> None:
        self.now, self.durations = 0.0, iter(durations)

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += next(self.durations)


def coverage(runs: int, window_s: float, rng: np.random.Generator) -> tuple[float, float, float, int]:
    true_rate = 1 / (0.95 * 0.010 + 0.05 * 0.040)
    new = old = 0
    widths = []
    calls = 0
    for _ in range(runs):
        n = 20_000
        durations = np.where(rng.random(n) < 0.05, rng.uniform(0.030, 0.050, n), rng.normal(0.010, 0.0005, n))
        clock = SimulatedClock(durations)
        settings = MeasureSettings(window_min_s=window_s, window_max_s=4 * window_s)
        stamps = timed_window(clock.step, settings, clock=clock)
        result = common_window_throughput([stamps], batch_size=1)
        assert result.ci_sps is not None and result.ci_rel is not None  # 20,000 calls: always an interval
        low, high = result.ci_sps
        new += low <= true_rate <= high
        widths.append(result.ci_rel)
        ci = median_ci(stamps[:, 1] - stamps[:, 0])
        share = result.throughput_sps
        old += share * ci["median"] / ci["ci_high"] <= true_rate <= share * ci["median"] / ci["ci_low"]
        calls += len(stamps)
    return new / runs, old / runs, float(np.median(widths)), calls // runs


def old_timed_window(step, settings: MeasureSettings, agree_to_stop) -> None:
    """The earlier stop-rule loop, kept here only to be measured against: a full sort and the median's
    binomial ranks (stopwatch.median_ci_ranks) recomputed at every check."""

    stamps: list[tuple[float, float]] = []
    window_start = time.monotonic()
    next_check = window_start
    while True:
        t0 = time.monotonic()
        step()
        t1 = time.monotonic()
        stamps.append((t0, t1))
        elapsed = t1 - window_start
        if elapsed >= settings.window_max_s:
            return
        if elapsed >= settings.window_min_s and t1 >= next_check:
            next_check = t1 + STOP_CHECK_EVERY_S
            array = np.asarray(stamps, dtype=np.float64)
            ordered = np.sort(array[:, 1] - array[:, 0])
            r = median_ci_ranks(len(ordered))
            median = float(np.median(ordered))
            rel = None if r is None else max(median - ordered[r[0]], ordered[r[1]] - median) / median
            if agree_to_stop(rel is not None and rel <= settings.ci_target_rel):
                return


def stop_rule_cost(call_us: float, window_s: float, old: bool) -> tuple[float, int, int]:
    starts: list[float] = []
    ends: list[float] = []
    costs: list[float] = []

    def step() -> None:
        t = time.monotonic()
        starts.append(t)
        while time.monotonic() - t < call_us * 1e-6:
            pass
        ends.append(time.monotonic())

    def agree(satisfied: bool) -> bool:
        costs.append(time.monotonic() - ends[-1])
        return satisfied

    settings = MeasureSettings(window_min_s=1.0, window_max_s=window_s, ci_target_rel=-1.0)
    if old:
        old_timed_window(step, settings, agree)
    else:
        timed_window(step, settings, agree_to_stop=agree)
    return sum(costs) / (ends[-1] - starts[0]), len(costs), len(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    print(f"machine: {cpu}, {len(os.sched_getaffinity(0))} CPUs, python {platform.python_version()}")
    rng = np.random.default_rng(11)
    print(f"\n1. throughput interval coverage, {args.runs} measurements each (stated: 95%)")
    print(f"{'window':>8} {'calls':>6} {'batch means':>12} {'median CI':>10} {'width (median)':>15}")
    for window in (1.0, 3.0):
        new, old, width, calls = coverage(args.runs, window, rng)
        print(f"{window:>7.0f}s {calls:>6} {new:>12.1%} {old:>10.1%} {width:>14.1%}")
    print("\n2. stop-rule checks, share of a 3 s window (busy-wait calls; rule never satisfied)")
    print(f"{'call':>8} {'calls':>7} {'checks':>7} {'autotune':>9} {'earlier':>8}")
    for call_us in (30, 100, 200):
        new, checks, calls = stop_rule_cost(call_us, 3.0, old=False)
        old, _, _ = stop_rule_cost(call_us, 3.0, old=True)
        print(f"{call_us:>6}us {calls:>7} {checks:>7} {new:>9.3%} {old:>8.3%}")


if __name__ == "__main__":
    main()

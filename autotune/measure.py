"""The stopwatch: warm-up, a measurement window, percentiles, and multi-instance throughput.

Pure functions over callables and timestamp arrays, so the statistics can be tested on synthetic series.
Timestamps come from time.monotonic(), which is CLOCK_MONOTONIC on Linux and so comparable across the
processes of one trial.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class MeasureSettings:
    warmup_min_iters: int = 3
    warmup_min_s: float = 1.0
    window_min_s: float = 5.0
    window_min_iters: int = 5
    window_max_s: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MeasureSettings":
        return cls(**data)


def samples_needed(percentile: float) -> int:
    """Fewest samples for which a percentile is more than the maximum: p50 needs 2, p90 10, p99 100."""
    return math.ceil(round(100.0 / (100.0 - percentile), 9))


def warm_up(step: Callable[[], Any], settings: MeasureSettings, clock: Callable[[], float] = time.monotonic) -> dict[str, float]:
    """Run until both the minimum count and minimum time are reached; first calls are not measured."""
    start, iters = clock(), 0
    while iters < settings.warmup_min_iters or clock() - start < settings.warmup_min_s:
        step()
        iters += 1
    return {"warmup_iters": iters, "warmup_s": clock() - start}


def timed_window(step: Callable[[], Any], settings: MeasureSettings, clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """Time each call; stop once the window is long enough and has enough calls, or at the cap.

    Returns an (n, 2) array of [start, end] timestamps per iteration.
    """
    stamps: list[tuple[float, float]] = []
    window_start = clock()
    while True:
        t0 = clock()
        step()
        t1 = clock()
        stamps.append((t0, t1))
        elapsed = t1 - window_start
        if elapsed >= settings.window_max_s:
            break
        if elapsed >= settings.window_min_s and len(stamps) >= settings.window_min_iters:
            break
    return np.asarray(stamps, dtype=np.float64)


def latency_summary(latencies_s: np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99 in milliseconds; a percentile without enough samples is None, not a guess."""
    latencies_ms = np.asarray(latencies_s, dtype=np.float64) * 1e3
    summary: dict[str, float | None] = {}
    for p in PERCENTILES:
        enough = len(latencies_ms) >= samples_needed(p)
        summary[f"p{p}"] = float(np.percentile(latencies_ms, p)) if enough else None
    summary["mean"] = float(latencies_ms.mean()) if len(latencies_ms) else None
    summary["samples"] = int(len(latencies_ms))
    return summary


def instance_throughput(stamps: np.ndarray, batch_size: int) -> float:
    """Samples per second of one instance over its own window."""
    if len(stamps) == 0:
        return 0.0
    span = stamps[-1, 1] - stamps[0, 0]
    return batch_size * len(stamps) / span if span > 0 else 0.0


def common_window_throughput(per_instance: list[np.ndarray], batch_size: int) -> dict[str, float]:
    """Throughput of N instances counted only while all of them were running.

    The common window runs from the latest first-start to the earliest last-end. Each instance
    contributes the iterations that finished inside it; the sum is divided by the window length.
    """
    if not per_instance or any(len(s) == 0 for s in per_instance):
        return {"throughput_sps": 0.0, "window_s": 0.0, "valid": False}
    start = max(float(s[0, 0]) for s in per_instance)
    end = min(float(s[-1, 1]) for s in per_instance)
    window = end - start
    if window <= 0:
        return {"throughput_sps": 0.0, "window_s": 0.0, "valid": False}
    finished = sum(int(np.count_nonzero((s[:, 1] > start) & (s[:, 1] <= end))) for s in per_instance)
    return {"throughput_sps": batch_size * finished / window, "window_s": window, "valid": finished > 0}

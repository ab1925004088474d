"""Multi-instance counting before and after: the same measured stamps, counted both ways.

A multi-instance configuration of a real model is measured by autotune's protocol (fresh processes,
pinned instances, common window), with screening. From the very stamps each run saved, the table
computes what the earlier counting said and what autotune says now:

- throughput: calls counted whole when they *finished* inside the common window (before) against
  each call counted by the fraction of it inside the window (now);
- p99 latency: over every call of every instance (before) against the calls wholly inside the common
  window, made while every sibling was running too (now);
- screening: each instance's throughput over its own screening window, summed (before), against the
  screening stamps counted over their common window like the full measurement (now).

Same stamps, so the difference is the counting alone, not the machine's noise.

    .venv/bin/python docs/benchmarks/multi_instance_counting.py [--model resnet50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rich.console import Console
from rich.table import Table

from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import discover_runtimes
from autotune.measure.stopwatch import MeasureSettings, common_window_throughput, instance_throughput, wholly_inside
from autotune.model.sources import resolve_model
from autotune.records.config import TrialConfig
from autotune.runner.trials import TrialContext, compute_reference, run_config


@dataclass(frozen=True)
class Counted:
    """One run's numbers under both countings."""

    recorded_sps: float
    before_sps: float
    after_sps: float
    before_p99_ms: float
    after_p99_ms: float
    screen_before_sps: float
    screen_after_sps: float
    call_ms: float


def count_finished_inside(per_instance: list[np.ndarray], samples_per_call: int) -> float:
    """The earlier rule: a call counts whole when it finished inside the common window."""
    start = max(float(s[0, 0]) for s in per_instance)
    end = min(float(s[-1, 1]) for s in per_instance)
    finished = sum(int(np.count_nonzero((s[:, 1] > start) & (s[:, 1] <= end))) for s in per_instance)
    return samples_per_call * finished / (end - start)


def counted(trial_dir: Path, instances: int, samples_per_call: int, recorded_sps: float) -> Counted:
    """Both countings from the stamps a run saved (the last attempt's, which its metrics come from)."""
    retries = sorted(trial_dir.glob("retry-*"))
    attempt = retries[-1] if retries else trial_dir
    stamps = [np.load(attempt / f"stamps-{i}.npy") for i in range(instances)]
    screens = [np.load(trial_dir / f"screen-{i}.npy") for i in range(instances)]
    window = common_window_throughput(stamps, samples_per_call)
    start, end = window.start, window.end
    every_call = np.concatenate([s[:, 1] - s[:, 0] for s in stamps])
    inside = np.concatenate([(s[:, 1] - s[:, 0])[wholly_inside(s, start, end)] for s in stamps])
    return Counted(
        recorded_sps=recorded_sps,
        before_sps=count_finished_inside(stamps, samples_per_call),
        after_sps=window.throughput_sps,
        before_p99_ms=float(np.percentile(every_call, 99)) * 1e3,
        after_p99_ms=float(np.percentile(inside, 99)) * 1e3,
        screen_before_sps=sum(instance_throughput(s, samples_per_call) for s in screens),
        screen_after_sps=common_window_throughput(screens, samples_per_call).throughput_sps,
        call_ms=float(np.median(every_call)) * 1e3,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=float, default=4.0, help="minimum timed window per run, seconds")
    args = parser.parse_args()

    machine = probe_machine()
    cores = machine.physical_cores
    model = resolve_model(args.model, None, None)
    work = Path("studies") / "benchmarks" / f"counting-{args.model}"
    reference = compute_reference(model, work, eval_samples=16, timeout_s=1800)
    measure = MeasureSettings(window_min_s=args.window, window_max_s=4 * args.window, screen_s=1.0)
    ctx = TrialContext(machine, reference, measure, Path("studies") / ".cache", runtimes=discover_runtimes())
    configs = {
        f"openvino int8 b8 {cores}x1": TrialConfig("openvino", "int8", batch_size=8, instances=cores),
        f"onnxruntime int8 b4 {cores}x1": TrialConfig("onnxruntime", "int8", batch_size=4, instances=cores),
        f"eager fp32 b16 {cores}x1": TrialConfig("eager", "fp32", batch_size=16, instances=cores),
    }
    console = Console(width=160)
    console.print(f"{machine.cpu_model}, {cores} cores, pinning: {machine.pinning}", markup=False)
    runs: dict[str, list[Counted]] = {name: [] for name in configs}
    for repeat in range(args.repeats):
        for name, config in configs.items():
            trial_dir = work / "runs" / f"{repeat}-{name.replace(' ', '_')}"
            metrics = run_config(config, ctx, trial_dir, 1800, screen=True)[0]
            retries = sorted(trial_dir.glob("retry-*"))
            result = json.loads(((retries[-1] if retries else trial_dir) / "result-0.json").read_text())
            samples_per_call = int(result["samples_per_call"])
            run = counted(trial_dir, config.instances, samples_per_call, metrics.throughput_sps)
            runs[name].append(run)
            console.print(
                f"repeat {repeat + 1}/{args.repeats} {name}: before {run.before_sps:.2f}, now {run.after_sps:.2f} "
                f"samples/s{metrics.noisy_note()}",
                markup=False,
            )

    table = Table(title=f"{args.model}: counting before and now, the same stamps ({args.repeats} runs, medians)")
    for column in (
        "config",
        "call p50 ms",
        "sps before",
        "sps now",
        "change",
        "p99 ms before",
        "p99 ms now",
        "screening sps before",
        "screening sps now",
    ):
        table.add_column(column, justify="left" if column == "config" else "right")
    for name, results in runs.items():

        def med(field: str, rows: list[Counted] = results) -> float:
            return statistics.median(getattr(r, field) for r in rows)

        table.add_row(
            name,
            f"{med('call_ms'):.1f}",
            f"{med('before_sps'):.2f}",
            f"{med('after_sps'):.2f}",
            f"{statistics.median(r.after_sps / r.before_sps - 1 for r in results):+.2%}",
            f"{med('before_p99_ms'):.1f}",
            f"{med('after_p99_ms'):.1f}",
            f"{med('screen_before_sps'):.2f}",
            f"{med('screen_after_sps'):.2f}",
        )
    console.print(table)
    console.print(f"cpus: {os.cpu_count()}, window >= {args.window:g} s per run, screening 1 s", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

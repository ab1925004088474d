"""The winner timed the way a user's program runs it: through the exported launch script and `autotune.load()`.

`verify --through-load` runs this after each protocol run: the launch script `autotune export --format sh`
writes (generated from the same best.json by the same function) starts `python -m autotune.stopwatch_process load`
once per instance, with the tuned environment and pinning, and each process times a plain loop of
calls to `autotune.load()`'s callable. The gap between the tuned figure and what a program gets is then
a number measured side by side, not a guess.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.common.errors import TrialFailed
from autotune.common.files import read_json, tail, write_text_atomic
from autotune.machine.runtimes import replay_env
from autotune.records.best import BestJson
from autotune.records.metrics import TrialMetrics
from autotune.results.launch_script import launch_script
from autotune.runner.launch import kill_process_tree


@dataclass(frozen=True)
class LoadRun:
    """One run through autotune.load(): each instance's result (autotune/stopwatch_process.py) and where its log is."""

    instances: list[dict[str, Any]]
    log: Path

    @property
    def throughput_sps(self) -> float:
        """Samples handed back to the callers per second, summed over the instances."""
        return sum(r["samples_per_s"] for r in self.instances)

    @property
    def unit(self) -> str:
        return self.instances[0].get("unit", "samples/s")

    @property
    def calls(self) -> int:
        return sum(r["calls"] for r in self.instances)

    @property
    def overlap(self) -> float:
        """The share of the longest window during which every instance was timing its calls."""
        common = min(r["end"] for r in self.instances) - max(r["start"] for r in self.instances)
        return max(0.0, common) / max(r["seconds"] for r in self.instances)

    def describe(self) -> str:
        """How this run's figure was obtained: calls and window per instance, so it can be recomputed."""
        calls = " + ".join(str(r["calls"]) for r in self.instances)
        windows = " + ".join(f"{r['seconds']:.3f}" for r in self.instances)
        return (
            f"{self.throughput_sps:.2f} {self.unit} ({len(self.instances)} instances: {calls} calls of "
            f"{self.instances[0]['samples_per_call']} {self.unit.removesuffix('/s')} in {windows} s, "
            f"windows overlapping {self.overlap:.0%})"
        )


def run_through_load(
    best: BestJson, best_path: Path, work: Path, window_s: float, warmup_s: float, timeout_s: float
) -> LoadRun:
    """Start the launch script with `python -m autotune.stopwatch_process load` as the user's program; raises
    TrialFailed (with the output's tail) when it does not run to the end."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    script = write_text_atomic(work / "launch.sh", launch_script(best, best_path.resolve()), mode=0o755)
    python, _ = replay_env(best.runtime, {})
    argv = [
        *("bash", str(script), python, "-m", "autotune.stopwatch_process", "load"),
        *(f"{window_s:.3f}", f"{warmup_s:.3f}", str(work)),
    ]
    log = work / "output.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            env=dict(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise TrialFailed(f"timed out after {timeout_s:.0f}s", tail(log)) from None
    finally:
        kill_process_tree(proc)  # its instances too, when it was stopped early
    if code != 0:
        raise TrialFailed(f"the launch script exited with {code} (log: {log})", tail(log))
    try:
        instances = len(best.launch.pin_prefixes or []) if best.launch else 0
        results = [read_json(work / f"result-{i}.json") for i in range(instances)]
    except (OSError, ValueError) as exc:
        raise TrialFailed(f"an instance left no result ({exc}; log: {log})", tail(log)) from None
    return LoadRun(results, log)


def window_of(protocol: TrialMetrics, min_warmup_s: float) -> tuple[float, float]:
    """The window and warm-up a run through load() gets: the protocol run's own, so the two are side by side."""
    return protocol.measurement.common_window_s, max(min_warmup_s, protocol.measurement.warmup.s)


def pinning_differences(protocol: TrialMetrics, run: LoadRun) -> list[str]:
    """Instances whose cores differ from the protocol's (the launch script pins as best.json recorded)."""
    return [
        f"instance {i}: cpus {r['cpus']} through the launch script, {share.cpus} in the protocol"
        for i, (r, share) in enumerate(zip(run.instances, protocol.instances))
        if sorted(r["cpus"]) != sorted(share.cpus)
    ]


def summary(runs: list[LoadRun], protocol: list[TrialMetrics]) -> str:
    """The through-load figure against the protocol's from the same verify run, and how both were obtained.
    Runs are taken in pairs (a protocol run and the run through load() right after it, so disturbed by the
    same load): the pairs whose protocol run was clean, or every pair when none was."""
    pairs = [(r, m) for r, m in zip(runs, protocol) if m.valid]
    which = f"medians of the {len(pairs)} interleaved pairs whose protocol run was clean"
    if not pairs:
        pairs = list(zip(runs, protocol))
        which = f"medians of all {len(pairs)} interleaved pairs, every protocol run flagged noisy"
    figures = [r.throughput_sps for r, _ in pairs]
    here = statistics.median(figures)
    reference = statistics.median(m.throughput_sps for _, m in pairs)
    windows = [r.instances[0]["seconds"] for r, _ in pairs]
    first = pairs[0][0].instances[0]
    note = ""
    if first["backend_batches_per_call"] > 1:
        note = (
            f"; each call runs {first['backend_batches_per_call']} requests of the same batch (one per stream) and "
            "hands back one batch, where the protocol counts them all"
        )
    return (
        f"through autotune.load(): {here:.2f} {pairs[0][0].unit} (median of {len(pairs)} runs, {min(figures):.2f}-"
        f"{max(figures):.2f}; {len(pairs[0][0].instances)} instances started by the launch script, each a "
        f"plain loop of calls on a fixed contiguous torch batch of {first.get('batch', first['samples_per_call'])}, "
        "timed for the window "
        f"of the protocol run before it, {min(windows):.2f}-{max(windows):.2f} s; "
        f"{sum(r.calls for r, _ in pairs)} calls in all{note}), {here / reference - 1:+.1%} from the protocol's "
        f"{reference:.2f} measured here in the same run ({which})"
    )

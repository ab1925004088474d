"""What reveals interference during a measurement, and the verdict: clean, or flagged with why.

Signals come from the kernel (per-CPU busy and steal time on the CPUs the instance was pinned to,
runnable processes, load) and from the process itself (CPU time, context switches), read before and
after the timed window; plus the shape of the timing series (spread, early-vs-late drift). A flagged
measurement is repeated by the caller; one that stays flagged never makes a winner.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from autotune.common.errors import UserError
from autotune.common.json_record import Record

if TYPE_CHECKING:
    from autotune.measure.stopwatch import LatencySummary

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BUSY_FIELDS = (0, 1, 2, 5, 6)  # user nice system irq softirq (iowait and idle are not busy)
STEAL_FIELD = 7
# A cloud VM whose hypervisor steals a steady share of its CPUs flags every measurement at the default;
# this environment variable raises the limit there (every command that measures reads it).
MAX_STEAL_ENV = "AUTOTUNE_MAX_STEAL"


@dataclass(frozen=True)
class NoiseLimits(Record):
    """Beyond these a measurement is contaminated. Spread and drift are judged on >= 20 calls only."""

    max_foreign_cpu: float = 0.15  # share of our CPUs' time used by other processes
    max_steal: float = 0.05  # share of our CPUs' time stolen by the hypervisor
    max_iqr_rel: float = 0.5  # IQR of call times over their median (sub-ms calls jitter by 25% when clean)
    # One instance: the median call time of the last third vs the first; several: the time per call of all
    # of them together over the common window's last third vs its first (a mean: a stall counts).
    max_early_late_rel: float = 0.10
    # Calls this short jitter by more than that on a shared machine whatever the config: their drift is
    # judged against their own spread (drift_per_iqr x IQR over median), not the fixed 10%.
    short_call_ms: float = 3.0
    drift_per_iqr: float = 2.0
    max_runnable_others: float = 1.0  # runnable processes besides ours, per allowed CPU, before/after
    min_calls_for_shape: int = 20

    @classmethod
    def from_environment(cls) -> NoiseLimits:
        """The defaults, with the steal limit from AUTOTUNE_MAX_STEAL (a share, 0-1) where it is set."""
        raw = os.environ.get(MAX_STEAL_ENV, "").strip()
        if not raw:
            return cls()
        try:
            share = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            share = -1.0
        if not 0.0 <= share <= 1.0:
            raise UserError(
                f"{MAX_STEAL_ENV}={raw!r} is not a share of the CPUs' time: give one from 0 to 1 (or 0% to 100%)"
            )
        return cls(max_steal=share)


def read_cpu_ticks(cpus: list[int]) -> dict[str, int]:
    """Busy, steal and total clock ticks summed over the given CPUs since boot (/proc/stat)."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = steal = total = 0
    with open("/proc/stat") as stat:
        for line in stat:
            parts = line.split()
            if parts and parts[0] in wanted:
                values = [int(v) for v in parts[1:]]
                busy += sum(values[i] for i in BUSY_FIELDS if i < len(values))
                steal += values[STEAL_FIELD] if len(values) > STEAL_FIELD else 0
                total += sum(values[:8])
    return {"busy": busy, "steal": steal, "total": total}


def runnable_processes() -> int:
    """procs_running from /proc/stat: threads on a run queue right now, the reader included."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return 0


def sample_runnable(samples: int = 5, gap_s: float = 0.01) -> float:
    """Median of a few readings: one reading of the run queue is too jumpy to judge by."""
    readings = []
    for _ in range(samples):
        readings.append(runnable_processes())
        time.sleep(gap_s)
    return float(statistics.median(readings))


def machine_snapshot() -> dict[str, float]:
    """Taken by the orchestrator before launching a trial and after it ends (ours are not running)."""
    load1, load5, _ = os.getloadavg()
    return {"runnable_others": max(0.0, sample_runnable() - 1.0), "load1": load1, "load5": load5}


def children_cpu_s(pid: int | None = None) -> float:
    """CPU seconds used so far by the processes a process started (default: this one), however deep:
    the live ones read from /proc, the ended ones it reaped from its rusage. A library may start
    processes of its own beside the timed calls (importing IPEX starts torch inductor's compile-worker
    pool, several processes importing torch at full speed for seconds); their time is the trial's, not
    another program's."""
    root = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        except OSError:  # ended meanwhile
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    ticks, frontier = 0, [root]
    while frontier:
        parent = frontier.pop()
        for child, of in parents.items():
            if of == parent:
                ticks += times[child]
                frontier.append(child)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN) if root == os.getpid() else None
    return ticks / CLOCK_TICKS + (reaped.ru_utime + reaped.ru_stime if reaped else 0.0)


def process_snapshot(cpus: list[int]) -> dict[str, Any]:
    """Taken by a worker around its timed window."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall": time.monotonic(),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "children_cpu_s": children_cpu_s(),
        "voluntary_cs": usage.ru_nvcsw,
        "involuntary_cs": usage.ru_nivcsw,
        "cpu_ticks": read_cpu_ticks(cpus),
    }


class ChildrenSettle:
    """Whether the processes this one started have gone quiet: their CPU time over the last stretch
    (at least `stretch_s`) under `max_share` of it. The warm-up ends only once they have, so a pool
    still starting up is not timed (within the warm-up's cap; the window's own signals say what remains)."""

    def __init__(self, stretch_s: float = 0.25, max_share: float = 0.05) -> None:
        self.stretch_s, self.max_share = stretch_s, max_share
        self._since, self._cpu_at = time.monotonic(), children_cpu_s()
        self.quiet = False
        self.busy_cpu_s = 0.0  # what they used while the warm-up waited for them

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self._since < self.stretch_s:
            return self.quiet
        cpu = children_cpu_s()
        used = cpu - self._cpu_at
        self.busy_cpu_s += used
        self.quiet = used <= self.max_share * (now - self._since)
        self._since, self._cpu_at = now, cpu
        return self.quiet


@dataclass(frozen=True)
class WindowSignals(Record):
    """Interference during one instance's window: its CPU time against the wall time and its threads, the
    share of its CPUs other processes used or the hypervisor stole, and its context switches per second
    (None where the window was too short to tell)."""

    wall_s: float
    cpu_s: float
    cpu_over_wall_threads: float | None = None
    foreign_cpu: float | None = None
    # the share the processes it started used (measurements before this signal counted them as foreign)
    own_children_cpu: float | None = None

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("own_children_cpu",)  # stored windows before it read back as they were
    steal: float | None = None
    involuntary_cs_per_s: float | None = None
    voluntary_cs_per_s: float | None = None


def window_signals(
    before: dict[str, Any], after: dict[str, Any], threads: int, children_are_the_work: bool = False
) -> WindowSignals:
    """Interference during one instance's window, from two process snapshots. `children_are_the_work`: the
    processes it started ran what was measured (a language model's server, llama-server), so their CPU time
    is the window's own, not a process beside it."""
    wall = after["wall"] - before["wall"]
    children_s = max(0.0, after["children_cpu_s"] - before["children_cpu_s"])
    cpu_s = after["cpu_s"] - before["cpu_s"] + (children_s if children_are_the_work else 0.0)
    ticks = {k: after["cpu_ticks"][k] - before["cpu_ticks"][k] for k in ("busy", "steal", "total")}
    children_ticks = 0.0 if children_are_the_work else children_s * CLOCK_TICKS
    ours_ticks = cpu_s * CLOCK_TICKS
    total = ticks["total"]
    return WindowSignals(
        wall_s=wall,
        cpu_s=cpu_s,
        cpu_over_wall_threads=cpu_s / (wall * threads) if wall > 0 and threads > 0 else None,
        foreign_cpu=max(0.0, ticks["busy"] - ours_ticks - children_ticks) / total if total > 0 else None,
        own_children_cpu=children_ticks / total if total > 0 else None,
        steal=ticks["steal"] / total if total > 0 else None,
        involuntary_cs_per_s=(after["involuntary_cs"] - before["involuntary_cs"]) / wall if wall > 0 else None,
        voluntary_cs_per_s=(after["voluntary_cs"] - before["voluntary_cs"]) / wall if wall > 0 else None,
    )


def _drift_limit(summaries: list[LatencySummary], limits: NoiseLimits) -> float:
    """The early-vs-late limit for these instances' calls: the fixed one, or for short calls (all of them
    under short_call_ms) drift_per_iqr times their widest spread, whichever is larger."""
    if all((s.p50 or 0.0) < limits.short_call_ms and s.iqr_rel is not None for s in summaries):
        return max(limits.max_early_late_rel, limits.drift_per_iqr * max(s.iqr_rel or 0.0 for s in summaries))
    return limits.max_early_late_rel


def noise_flags(
    instances: list[dict[str, Any]],
    machine_before: dict[str, float] | None,
    machine_after: dict[str, float] | None,
    allowed_cpus: int,
    limits: NoiseLimits = NoiseLimits(),
    combined_drift: float | None = None,
) -> list[str]:
    """Reasons a measurement is contaminated (empty list: clean). Each reason names the number.

    `instances` holds, per instance, its window signals and the latency summary of its own calls.
    Several instances are judged for drift together (`combined_drift`, the time per call over the common
    window, stopwatch.combined_early_late) when it is known and each made enough calls: instances take
    turns (on a 2-core EPYC each of two ran ~20% slower in one part of the window, in opposite
    directions, while their time per call together moved 3%), so one instance's drift alone flags a
    measurement whose throughput, the measured number, barely moved.
    """
    flags = []
    summaries = [inst["latency"] for inst in instances]
    # Judged together when each instance made enough calls for its own shape to be judged.
    enough = all(s.samples >= limits.min_calls_for_shape for s in summaries)
    combined = combined_drift if len(instances) > 1 and enough else None
    if combined is not None and abs(combined) > _drift_limit(summaries, limits):
        flags.append(
            f"the instances together: time per call drifted {combined:+.0%} "
            "from the first to the last third of their common window"
        )
    for i, inst in enumerate(instances):
        signals, latency = inst.get("signals") or {}, inst["latency"]
        foreign, steal, children = signals.get("foreign_cpu"), signals.get("steal"), signals.get("own_children_cpu")
        if foreign is not None and foreign > limits.max_foreign_cpu:
            flags.append(f"instance {i}: other processes used {foreign:.0%} of its CPUs")
        if children is not None and children > limits.max_foreign_cpu:
            flags.append(f"instance {i}: processes it started itself used {children:.0%} of its CPUs")
        if steal is not None and steal > limits.max_steal:
            flags.append(
                f"instance {i}: the hypervisor stole {steal:.0%} of its CPUs "
                f"(limit {limits.max_steal:.0%}, {MAX_STEAL_ENV})"
            )
        if latency.samples >= limits.min_calls_for_shape:
            iqr, drift = latency.iqr_rel, latency.early_late_rel
            if iqr is not None and iqr > limits.max_iqr_rel:
                flags.append(f"instance {i}: call times spread, IQR {iqr:.0%} of the median")
            if combined is None and drift is not None and abs(drift) > _drift_limit([latency], limits):
                flags.append(f"instance {i}: call times drifted {drift:+.0%} from the first to the last third")
    for when, snap in (("before", machine_before), ("after", machine_after)):
        if snap and snap["runnable_others"] > limits.max_runnable_others * allowed_cpus:
            flags.append(f"{snap['runnable_others']:.0f} other runnable processes {when} the trial")
    return flags

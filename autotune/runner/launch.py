"""Start a trial's processes, release them together, collect one JSON result each, kill what remains.

Knows nothing about Optuna. Each instance runs in its own process group (its own session), so a
timeout, a crash of a sibling, a pruning decision or Ctrl-C kills everything the trial started.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from autotune.common.errors import TrialFailed
from autotune.common.files import read_json, tail

POLL_S = 0.02
MEMORY_POLL_S = 0.25  # reading the trial's memory is cheap, but not free on a 2-core machine
STACK_DUMP_WAIT_S = 3.0  # how long a timed-out instance gets to write its stacks before it is killed
STACKS_CHARS = 6000  # a timeout's stderr tail: room for a few threads' stacks
PR_SET_PDEATHSIG = 1


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded here, in the parent: the child between fork and exec must not dlopen (another thread of the
# orchestrator, e.g. Optuna's heartbeat, may hold the loader's lock at the fork and the child would hang).
_LIBC = _load_libc()


def _die_with_parent() -> None:
    """In the child before exec: be killed if the orchestrator dies (even by SIGKILL), so no trial
    process outlives it. Linux only; elsewhere the process-group kill on exit still applies."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class InstanceLaunch:
    """One process of a trial: its command, its full environment, and where it writes."""

    argv: list[str]
    env: dict[str, str]
    set_env: dict[str, str]  # the variables the config sets, for the record
    result_path: Path
    stdout_path: Path
    stderr_path: Path

    def shell_command(self) -> str:
        return shell_command(self.set_env, self.argv)


def shell_command(set_env: dict[str, str], argv: list[str], unset: tuple[str, ...] = ()) -> str:
    """A launch as one line a user can paste: variables removed, variables set, then the (pinned) command."""
    removals = [f"-u {name}" for name in unset if name not in set_env]
    assignments = " ".join([*removals, *(f"{k}={shlex.quote(v)}" for k, v in sorted(set_env.items()))])
    return f"env {assignments} {shlex.join(argv)}" if assignments else shlex.join(argv)


def _exit_cause(code: int, stderr_path: Path) -> str:
    for line in reversed(tail(stderr_path, 4000).splitlines()):
        if line.startswith("autotune-worker:"):
            return line.removeprefix("autotune-worker:").strip()
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def kill_process_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group and any descendant that left it."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.Error:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def dump_python_stacks(procs: list[subprocess.Popen], wait_s: float = STACK_DUMP_WAIT_S) -> int:
    """Ask every instance still running to print its threads' Python stacks, and say which to read.

    A timeout otherwise tells where a trial was (its stage), not what it was doing. The worker enables
    faulthandler, whose SIGABRT handler writes every thread's Python stack to stderr without the GIL, so
    a process stuck in native code holding it still answers. Returns the first instance that was still
    running (the one whose stderr holds a dump), or 0."""
    running = [i for i, proc in enumerate(procs) if proc.poll() is None]
    for i in running:
        try:
            os.kill(procs[i].pid, signal.SIGABRT)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + wait_s
    for i in running:
        try:
            procs[i].wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return running[0] if running else 0


def tree_rss_mib(procs: list[subprocess.Popen]) -> float:
    """Resident memory of the processes and all their descendants, in MiB."""
    total = 0
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for member in members:
            try:
                total += member.memory_info().rss
            except psutil.Error:
                pass
    return total / 2**20


def run_instances(
    instances: list[InstanceLaunch],
    timeout_s: float,
    barrier_dir: Path | None = None,
    on_stage: Callable[[str, list[dict[str, Any]]], None] | None = None,
    stages: tuple[str, ...] = ("ready",),
    memory_limit_mib: float | None = None,
) -> list[dict[str, Any]]:
    """Run all instances to completion and return their results, in instance order.

    Barriers, in order of `stages`: when every instance has written its `<stage>-<i>.json`, `on_stage`
    gets the stage and their payloads; it may raise (to prune the trial) and then every process is
    killed. Otherwise the stage is released with `<stage>.go`. Raises TrialFailed on a crash, a
    missing result, the timeout, or when the processes together hold more than `memory_limit_mib`.
    """
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + timeout_s
    pending = list(stages) if barrier_dir is not None else []
    released = not pending
    stage = "starting"
    next_memory_check = 0.0
    try:
        start_instances(instances, procs)
        stage = "preparing"
        while True:
            raise_on_failed_exit(instances, procs)
            if pending and barrier_dir is not None:
                arrived = [barrier_dir / f"{pending[0]}-{i}.json" for i in range(len(instances))]
                if all(p.exists() for p in arrived):
                    if on_stage is not None:
                        on_stage(pending[0], [read_json(p) for p in arrived])
                    (barrier_dir / f"{pending.pop(0)}.go").touch()
                    released, stage = not pending, "measuring"
            if all(proc.poll() == 0 for proc in procs):
                break
            if time.monotonic() > deadline:
                stuck = dump_python_stacks(procs)
                raise TrialFailed(
                    f"timed out after {timeout_s:.0f}s while {stage}", tail(instances[stuck].stderr_path, STACKS_CHARS)
                )
            if memory_limit_mib is not None and time.monotonic() >= next_memory_check:
                next_memory_check = time.monotonic() + MEMORY_POLL_S
                check_memory(instances, procs, memory_limit_mib, stage)
            time.sleep(POLL_S)
        return read_results(instances)
    finally:
        if barrier_dir is not None and not released:
            (barrier_dir / "abort").touch()
        for proc in procs:  # also when the leader exited: its group may hold compile workers
            kill_process_tree(proc)


def start_instances(instances: list[InstanceLaunch], procs: list[subprocess.Popen]) -> None:
    """Start every instance in its own session, appending to `procs` as they start so that the caller
    kills the ones already started when a later one cannot start."""
    for inst in instances:
        with open(inst.stdout_path, "wb") as out, open(inst.stderr_path, "wb") as err:
            try:
                procs.append(
                    subprocess.Popen(
                        inst.argv,
                        env=inst.env,
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        preexec_fn=_die_with_parent,
                    )
                )
            except OSError as exc:
                raise TrialFailed(f"cannot start instance {len(procs)}: {exc}") from exc


def raise_on_failed_exit(instances: list[InstanceLaunch], procs: list[subprocess.Popen]) -> None:
    """One instance that exited with an error fails the trial at once: the others would wait at a barrier."""
    for i, proc in enumerate(procs):
        code = proc.poll()
        if code is not None and code != 0:
            raise TrialFailed(
                f"instance {i} {_exit_cause(code, instances[i].stderr_path)}", tail(instances[i].stderr_path)
            )


def check_memory(
    instances: list[InstanceLaunch], procs: list[subprocess.Popen], memory_limit_mib: float, stage: str
) -> None:
    """The processes together (with their children) over the trial memory limit are killed before the
    machine swaps or the kernel's OOM killer picks a victim."""
    used = tree_rss_mib(procs)
    if used > memory_limit_mib:
        raise TrialFailed(
            f"used {used:.0f} MiB while {stage}, over the trial memory limit of {memory_limit_mib:.0f} MiB "
            "(--memory-limit): killed",
            tail(instances[0].stderr_path),
        )


def read_results(instances: list[InstanceLaunch]) -> list[dict[str, Any]]:
    """Every instance's result file, in instance order; one missing or unreadable fails the trial."""
    results = []
    for i, inst in enumerate(instances):
        try:
            results.append(read_json(inst.result_path))
        except (OSError, ValueError) as exc:
            raise TrialFailed(f"instance {i} exited without a valid result ({exc})", tail(inst.stderr_path)) from exc
    return results

"""Time a tuned model in a plain process: warm up, wait for the sibling instances, count calls for a
fixed time, print one JSON result. Nothing of autotune's own timing: no warm-up rule, no confidence
interval, no common-window arithmetic (what it measures is compared with the protocol's figure).

Two programs, one stopwatch:

- `load`: a user's program. `autotune verify --through-load` starts it through the exported launch
  script, one process per instance, so it runs exactly as a user's program does: the tuned environment
  and pinning, best.json from AUTOTUNE_BEST, its place from AUTOTUNE_INSTANCE / AUTOTUNE_INSTANCES, and
  `autotune.load()` checking all of that. The batch is a contiguous torch batch of the tuned size, the
  inputs the protocol times (same seed). The samples counted are those handed back to the caller: one
  batch per call (for a language model, the timed prompts, and the tokens each call generates). Each
  instance also writes its result to RUN_DIR/result-N.json.
- `job`: the independent stopwatch of `autotune compare --independent`. It shares only model loading
  with the worker (the backend is what is being measured, not the clock), in fresh processes started
  as best.json says.

Instances wait for each other through ready files in RUN_DIR; one that fails leaves a failed file, so
the others stop instead of waiting out the barrier's timeout.

    ./launch.sh python -m autotune.stopwatch_process load SECONDS WARMUP_SECONDS RUN_DIR
    python -m autotune.stopwatch_process job JOB.json SECONDS RUN_DIR

It sits above the API (it calls `autotune.load()` as a program would), so nothing in the package imports it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.records.job import WorkerJob

MIN_WARMUP_CALLS = 3
WARMUP_CAP_S = 10.0  # how long past its minimum a warm-up waits for the processes it started to go quiet
JOB_WARMUP_S = 3.0  # the independent stopwatch's fixed warm-up
BARRIER_TIMEOUT_S = 900.0
USAGE = (
    "usage: (under launch.sh) python -m autotune.stopwatch_process load SECONDS WARMUP_SECONDS RUN_DIR\n"
    "       python -m autotune.stopwatch_process job JOB.json SECONDS RUN_DIR"
)


def wait_for_siblings(run_dir: Path, instance: int, instances: int, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Say this instance is ready, then wait until every instance is (or one of them failed, or time ran out)."""
    (run_dir / f"ready-{instance}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(run_dir.glob("ready-*"))) < instances:
        failed = sorted(p.name for p in run_dir.glob("failed-*"))
        if failed:
            raise RuntimeError(f"a sibling instance failed before the window ({', '.join(failed)})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other instances were not ready within {timeout_s:.0f}s")
        time.sleep(0.001)


def warm_up(
    call: Callable[[], Any], min_calls: int, min_s: float, settled: Callable[[], bool] = lambda: True
) -> tuple[int, float]:
    """Call until both `min_calls` calls and `min_s` seconds are done and `settled` says yes (the processes
    this one started have gone quiet, as the protocol's warm-up waits for them), at most WARMUP_CAP_S past
    the minimum; the calls made and the time taken."""
    calls, t0 = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - t0 < min_s or not settled():
        call()
        calls += 1
        if time.perf_counter() - t0 > min_s + WARMUP_CAP_S:
            break
    return calls, time.perf_counter() - t0


def count_calls(call: Callable[[], Any], seconds: float) -> tuple[int, float, float]:
    """The stopwatch: calls completed in `seconds`, and the window's start and end (time.perf_counter,
    CLOCK_MONOTONIC on Linux, so comparable between the instances)."""
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return calls, start, time.perf_counter()


def time_load(seconds: float, warmup_s: float, run_dir: Path, instance: int, instances: int) -> dict[str, Any]:
    """A user's program: `autotune.load()`, then a plain loop of calls on one fixed batch."""
    import autotune
    from autotune.model.generation import prompts
    from autotune.model.inputs import synthetic
    from autotune.model.seeds import TIMING_SEED
    from autotune.records.best import BestJson

    t0 = time.monotonic()
    infer = autotune.load()  # best.json from AUTOTUNE_BEST; raises when the process was not started as tuned
    load_s = time.monotonic() - t0
    config = infer.config
    job = BestJson.read(os.environ["AUTOTUNE_BEST"]).job
    if job is None:  # autotune.load() refused a best.json without a timed winner already
        raise ValueError("best.json holds no job")
    if job.generation:  # a language model: the timed prompts; each call hands back its new tokens
        workload = job.generation
        batch: tuple[Any, ...] = (prompts(workload, config.batch_size, TIMING_SEED + instance),)
        per_call, unit = config.batch_size * workload.new_tokens, "tokens/s"
        batch_text = f"{config.batch_size} prompts of {workload.prompt_tokens} tokens, {per_call} tokens generated"
    else:
        batch = synthetic(job.model.specs, config.batch_size, TIMING_SEED + instance)
        per_call, unit = config.batch_size, "samples/s"
        batch_text = str(per_call)
    t0 = time.monotonic()
    infer(*batch)
    first_call_s = time.monotonic() - t0
    from autotune.measure.noise import ChildrenSettle

    settle = ChildrenSettle()  # importing IPEX starts torch inductor's compile-worker pool: not timed while it starts
    warmup_calls, warmed_s = warm_up(lambda: infer(*batch), MIN_WARMUP_CALLS, warmup_s, settle)
    wait_for_siblings(run_dir, instance, instances)
    calls, start, end = count_calls(lambda: infer(*batch), seconds)
    return {
        "instance": instance,
        "pid": os.getpid(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "calls": calls,
        "samples_per_call": per_call,  # generated tokens for a language model (`unit`)
        "seconds": end - start,
        "samples_per_s": calls * per_call / (end - start),
        "unit": unit,
        "batch": batch_text,  # what each call is handed and hands back, in words
        "start": start,
        "end": end,
        "load_s": load_s,
        "first_call_s": first_call_s,
        "warmup_calls": warmup_calls,
        "warmup_s": warmed_s,
        "warmup_children_cpu_s": settle.busy_cpu_s,
        "input": "torch, contiguous",
        "backend_takes": getattr(getattr(infer, "runner", None), "takes", "token ids"),
        "backend_batches_per_call": getattr(getattr(infer, "runner", None), "batches_per_call", 1),
    }


def time_job(job: WorkerJob, seconds: float, run_dir: Path) -> dict[str, Any]:
    """The independent stopwatch: the worker's model loading, then the plainest possible timing loop."""
    from autotune.model.inputs import synthetic
    from autotune.model.seeds import TIMING_SEED
    from autotune.worker.process import build_runner
    from autotune.worker.teardown import keep_until_exit

    config, instance, source = job.trial_config(), job.instance, job.model
    example = synthetic(source.specs, config.batch_size, TIMING_SEED + instance)
    runner = keep_until_exit(build_runner(job, config, source, example))
    x = runner.convert_input(example)
    from autotune.measure.noise import ChildrenSettle

    warm_up(lambda: runner(x), 0, JOB_WARMUP_S, ChildrenSettle())
    wait_for_siblings(run_dir, instance, config.instances)
    calls, start, end = count_calls(lambda: runner(x), seconds)
    elapsed = end - start
    samples = calls * config.batch_size * runner.batches_per_call
    return {"instance": instance, "calls": calls, "seconds": elapsed, "samples_per_s": samples / elapsed}


@contextmanager
def _failure_marked(run_dir: Path, instance: int) -> Iterator[None]:
    """Leave RUN_DIR/failed-N when the block raises, so siblings waiting at the barrier stop instead of hanging."""
    try:
        yield
    except BaseException:
        (run_dir / f"failed-{instance}").touch()
        raise


def _run(argv: list[str]) -> dict[str, Any] | None:
    """The result of the mode `argv` names; None when `argv` is not a usage."""
    if len(argv) == 4 and argv[0] == "load" and "AUTOTUNE_INSTANCE" in os.environ:
        from autotune.common.files import write_json_atomic

        seconds, warmup_s, run_dir = float(argv[1]), float(argv[2]), Path(argv[3])
        instance, instances = int(os.environ["AUTOTUNE_INSTANCE"]), int(os.environ["AUTOTUNE_INSTANCES"])
        with _failure_marked(run_dir, instance):
            result = time_load(seconds, warmup_s, run_dir, instance, instances)
        write_json_atomic(run_dir / f"result-{instance}.json", result)
        return result
    if len(argv) == 4 and argv[0] == "job":
        from autotune.common.files import read_json
        from autotune.records.job import WorkerJob

        job = WorkerJob.from_json(read_json(argv[1]))
        seconds, run_dir = float(argv[2]), Path(argv[3])
        with _failure_marked(run_dir, job.instance):
            return time_job(job, seconds, run_dir)
    return None


def main(argv: list[str]) -> int:
    result = _run(argv)
    if result is None:
        print(USAGE, file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from autotune.worker.teardown import exit_now

    exit_now(main(sys.argv[1:]))

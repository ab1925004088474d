"""A user's program, timed: `autotune.load()`, then a plain loop of calls on one fixed batch.

`autotune verify --through-load` starts it through the exported launch script, one process per
instance, so it runs exactly as a user's program does: the tuned environment and pinning, best.json
from AUTOTUNE_BEST, its place from AUTOTUNE_INSTANCE / AUTOTUNE_INSTANCES, and `autotune.load()`
checking all of that. It goes through the public call and nothing else of autotune's timing: no
warm-up rule, no confidence interval, no common-window arithmetic (the protocol's figure is what it
is compared with). The batch is a contiguous torch batch of the tuned size, the inputs the protocol
times (same seed). Instances wait for each other through ready files, then each counts its calls
for a fixed time and writes one JSON result. The samples counted are those handed back to the caller:
one batch per call (for a language model, the timed prompts, and the tokens each call generates).

    ./launch.sh python -m autotune.load_loop SECONDS WARMUP_SECONDS RUN_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import autotune
from autotune.common.files import read_json, write_json_atomic
from autotune.model.generation import GenerationWorkload, prompts
from autotune.model.inputs import synthetic
from autotune.model.seeds import TIMING_SEED
from autotune.model.sources import ModelSource

MIN_WARMUP_CALLS = 3
BARRIER_TIMEOUT_S = 900.0
USAGE = "usage: (under launch.sh) python -m autotune.load_loop SECONDS WARMUP_SECONDS RUN_DIR"


def wait_for_siblings(run_dir: Path, instance: int, instances: int) -> None:
    """Say this instance is ready, then wait until every instance is (or one of them failed)."""
    (run_dir / f"ready-{instance}").touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len(list(run_dir.glob("ready-*"))) < instances:
        failed = sorted(p.name for p in run_dir.glob("failed-*"))
        if failed:
            raise RuntimeError(f"a sibling instance failed before the window ({', '.join(failed)})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other instances were not ready within {BARRIER_TIMEOUT_S:.0f}s")
        time.sleep(0.001)


def run(seconds: float, warmup_s: float, run_dir: Path) -> dict[str, Any]:
    instance = int(os.environ["AUTOTUNE_INSTANCE"])
    instances = int(os.environ["AUTOTUNE_INSTANCES"])
    t0 = time.monotonic()
    infer = autotune.load()  # best.json from AUTOTUNE_BEST; raises when the process was not started as tuned
    load_s = time.monotonic() - t0
    config = infer.config
    job = read_json(os.environ["AUTOTUNE_BEST"])["job"]
    if job.get("generation"):  # a language model: the timed prompts; each call hands back its new tokens
        workload = GenerationWorkload.from_json(job["generation"])
        batch = (prompts(workload, config.batch_size, TIMING_SEED + instance),)
        per_call, unit = config.batch_size * workload.new_tokens, "tokens/s"
        batch_text = f"{config.batch_size} prompts of {workload.prompt_tokens} tokens, {per_call} tokens generated"
    else:
        batch = synthetic(ModelSource.from_dict(job["model"]).specs, config.batch_size, TIMING_SEED + instance)
        per_call, unit = config.batch_size, "samples/s"
        batch_text = str(per_call)
    t0 = time.monotonic()
    infer(*batch)
    first_call_s = time.monotonic() - t0
    warmup_calls, t0 = 0, time.perf_counter()
    while warmup_calls < MIN_WARMUP_CALLS or time.perf_counter() - t0 < warmup_s:
        infer(*batch)
        warmup_calls += 1
    warmed_s = time.perf_counter() - t0
    wait_for_siblings(run_dir, instance, instances)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        infer(*batch)
        calls += 1
    end = time.perf_counter()
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
        "start": start,  # time.perf_counter: CLOCK_MONOTONIC on Linux, comparable between the instances
        "end": end,
        "load_s": load_s,
        "first_call_s": first_call_s,
        "warmup_calls": warmup_calls,
        "warmup_s": warmed_s,
        "input": "torch, contiguous",
        "backend_takes": getattr(getattr(infer, "runner", None), "takes", "token ids"),
        "backend_batches_per_call": getattr(getattr(infer, "runner", None), "batches_per_call", 1),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3 or "AUTOTUNE_INSTANCE" not in os.environ:
        print(USAGE, file=sys.stderr)
        return 2
    seconds, warmup_s, run_dir = float(argv[0]), float(argv[1]), Path(argv[2])
    instance = os.environ["AUTOTUNE_INSTANCE"]
    try:
        result = run(seconds, warmup_s, run_dir)
    except BaseException:
        (run_dir / f"failed-{instance}").touch()  # siblings waiting at the barrier stop instead of hanging
        raise
    write_json_atomic(run_dir / f"result-{instance}.json", result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

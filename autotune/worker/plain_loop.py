"""An independent stopwatch: the plainest possible timing loop, to check autotune's own numbers.

Shares only model loading with the worker (the backend is what is being measured, not the clock):
no warm-up rule, no confidence interval, no common-window arithmetic. Instances wait for each other
through ready files, then each counts calls for a fixed time.

    python -m autotune.worker.plain_loop JOB.json SECONDS READY_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from autotune.model.inputs import synthetic
from autotune.model.seeds import TIMING_SEED
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.worker.process import build_runner
from autotune.worker.teardown import exit_now, keep_until_exit

WARMUP_S = 3.0


def main(argv: list[str]) -> int:
    job_path, seconds, ready_dir = argv[0], float(argv[1]), Path(argv[2])
    job = json.loads(Path(job_path).read_text())
    config = TrialConfig.from_dict(job["config"])
    instance = int(job.get("instance", 0))
    source = ModelSource.from_dict(job["model"])
    example = synthetic(source.specs, config.batch_size, TIMING_SEED + instance)
    runner = keep_until_exit(build_runner(job, config, source, example))
    x = runner.convert_input(example)
    end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < end:
        runner(x)
    (ready_dir / f"ready-{instance}").touch()
    while len(list(ready_dir.glob("ready-*"))) < config.instances:
        time.sleep(0.001)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        runner(x)
        calls += 1
    elapsed = time.perf_counter() - start
    samples = calls * config.batch_size * runner.batches_per_call
    print(json.dumps({"instance": instance, "calls": calls, "seconds": elapsed, "samples_per_s": samples / elapsed}))
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))

"""Measurements autotune did not make itself, to check its numbers against.

- The winner under an independent stopwatch: OpenVINO's own benchmark_app on the same IR with the
  same streams, threads, precision, environment and pinning when the winner is OpenVINO; otherwise a
  plain timing loop (autotune.stopwatch_process job) in fresh processes started exactly as best.json says.
- What a user gets today with one command: `benchmark_app -hint throughput` on the NNCF int8 IR
  (the same quantized IR the search uses, batch 1 as exported models usually are), unpinned, in a
  clean environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.common.errors import TrialFailed
from autotune.common.files import write_json_atomic
from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import Runtime, runtime_env
from autotune.records.best import BestJson
from autotune.records.config import TrialConfig, clean_environment, pin_prefix
from autotune.runner.trials import TrialContext, ensure_artifact

THROUGHPUT_LINE = re.compile(r"Throughput:\s+([0-9.]+)\s+FPS")
MEDIAN_LINE = re.compile(r"Median:\s+([0-9.]+)\s+ms")
ONE_COMMAND_CONFIG = TrialConfig(
    "openvino", "int8", 1, options={"hint": "THROUGHPUT", "streams": "auto", "int8_float": "f32"}
)


def benchmark_app_path() -> str:
    """The benchmark_app installed next to this Python (OpenVINO's wheel ships it)."""
    beside = Path(sys.executable).with_name("benchmark_app")
    found = str(beside) if beside.exists() else shutil.which("benchmark_app")
    if not found:
        raise TrialFailed("benchmark_app is not installed (it comes with the openvino package)")
    return found


@dataclass(frozen=True)
class StopwatchReading:
    """What an independent stopwatch measured: samples/s summed over instances (and each instance's), the
    median call where the tool reports one, which tool, and the commands that ran it."""

    throughput_sps: float
    median_ms: float | None = None
    per_instance_sps: list[float] = field(default_factory=list)
    tool: str = ""
    commands: list[list[str]] = field(default_factory=list)


def parse_benchmark_app(output: str) -> StopwatchReading:
    throughput = THROUGHPUT_LINE.search(output)
    if not throughput:
        raise TrialFailed("benchmark_app printed no throughput", output[-2000:])
    median = MEDIAN_LINE.search(output)
    return StopwatchReading(float(throughput.group(1)), float(median.group(1)) if median else None)


def _run_together(commands: list[list[str]], env: dict[str, str], timeout_s: float, logs: Path) -> list[str]:
    """Start every command at once (one per instance), wait for all, return their stdout."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for argv in commands
    ]
    outputs = []
    try:
        for i, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=timeout_s)
            (logs / f"instance-{i}.log").write_text(out)
            if proc.returncode != 0:
                raise TrialFailed(f"independent measurement, instance {i}, exited with {proc.returncode}", out[-2000:])
            outputs.append(out)
    except subprocess.TimeoutExpired as exc:
        raise TrialFailed(f"independent measurement timed out after {timeout_s:.0f}s") from exc
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def _openvino_flags(config: TrialConfig, details: dict[str, Any]) -> list[str]:
    """benchmark_app flags that reproduce what the trial compiled (read back from OpenVINO itself)."""
    precision = "bf16" if "bf16" in str(details.get("effective_precision", "")) else "f32"
    # benchmark_app takes -nstreams/-nthreads only with -hint none; the streams, threads, precision and
    # requests the hint chose in the trial are all given explicitly instead.
    flags = [
        "-hint",
        "none",
        "-nstreams",
        str(details.get("effective_streams", 1)),
        "-nthreads",
        str(config.threads_per_instance),
        "-infer_precision",
        precision,
    ]
    if details.get("optimal_requests"):
        flags += ["-nireq", str(details["optimal_requests"] if int(details.get("effective_streams", 1)) > 1 else 1)]
    return flags


def independent_winner(
    best: BestJson, work: Path, seconds: float, runtime: Runtime, timeout_s: float = 900.0
) -> StopwatchReading:
    """Throughput of best.json's winner, summed over its instances, under an independent stopwatch."""
    config = best.config
    machine = probe_machine()
    env = runtime_env(runtime, {**clean_environment(dict(os.environ)), **(best.environment or {})})
    job = best.job
    if job is None:  # read_best refused a best.json without a timed winner already
        raise TrialFailed("best.json holds no job to re-measure")
    if job.model.inputs:
        raise TrialFailed("the independent cross-check feeds one input tensor; this model takes several")
    shape = f"[{config.batch_size},{','.join(map(str, job.model.input_shape))}]"
    commands = []
    if config.backend == "openvino":
        flags = _openvino_flags(config, best.backend_details)
        for cpus in config.instance_cpus(machine):
            commands.append(
                [
                    *pin_prefix(cpus, machine),
                    benchmark_app_path(),
                    "-m",
                    str(Path(str(job.artifact_dir)) / "model.xml"),
                    "-shape",
                    shape,
                    *flags,
                    "-t",
                    str(int(seconds)),
                ]
            )
        tool = "benchmark_app (OpenVINO's own) on the same IR, same streams/threads/precision/pinning"
    else:
        ready = work / "ready"
        shutil.rmtree(ready, ignore_errors=True)
        ready.mkdir(parents=True)
        for i, cpus in enumerate(config.instance_cpus(machine)):
            job_path = write_json_atomic(work / f"plain-job-{i}.json", replace(job, instance=i).to_json())
            commands.append(
                [
                    *pin_prefix(cpus, machine),
                    runtime.python,
                    "-m",
                    "autotune.stopwatch_process",
                    "job",
                    str(job_path),
                    str(seconds),
                    str(ready),
                ]
            )
        tool = "plain timing loop (autotune.stopwatch_process), fresh processes, same environment and pinning"
    outputs = _run_together(commands, env, timeout_s, work / "logs")
    if config.backend == "openvino":
        per_instance = [parse_benchmark_app(out).throughput_sps for out in outputs]
    else:
        per_instance = [json.loads(out.strip().splitlines()[-1])["samples_per_s"] for out in outputs]
    return StopwatchReading(sum(per_instance), None, per_instance, tool, commands)


def one_command_openvino(
    ctx: TrialContext, input_shape: list[int], work: Path, seconds: float, timeout_s: float = 1800.0
) -> StopwatchReading:
    """`benchmark_app -hint throughput` on the NNCF int8 IR: the best a user gets today with one command."""
    artifact = ensure_artifact(ONE_COMMAND_CONFIG, ctx, work, timeout_s)
    if artifact is None:
        raise TrialFailed("OpenVINO int8 builds no IR here: nothing for benchmark_app to load")
    shape = f"[1,{','.join(map(str, input_shape))}]"
    argv = [
        benchmark_app_path(),
        "-m",
        str(Path(artifact.dir) / "model.xml"),
        "-hint",
        "throughput",
        "-shape",
        shape,
        "-t",
        str(int(seconds)),
    ]
    out = _run_together([argv], clean_environment(dict(os.environ)), timeout_s, work / "logs")[0]
    return replace(
        parse_benchmark_app(out), tool="benchmark_app -hint throughput, NNCF int8 IR, batch 1", commands=[argv]
    )

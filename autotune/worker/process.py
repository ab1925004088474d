"""The process that runs one instance of one trial: job JSON in, result JSON out.

It knows nothing about the search. It checks from inside that the environment it was started with is
the one asked for (allocator really mapped, thread count), builds and prepares the model, checks that
it executes the precision its configuration claims, measures drift against the FP32 reference, warms
up, waits at the barrier, and times its window.

    python -m autotune.worker JOB.json
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.backends.precision import ExecutedPrecision, check_precision
from autotune.common.files import read_json, write_json_atomic
from autotune.common.json_record import Record, UnknownFormat
from autotune.measure.drift import Drift, compute_drift, constant_across_samples, top1_accuracy
from autotune.measure.llm_serving import LlmServerMetrics
from autotune.measure.noise import ChildrenSettle, process_snapshot, window_signals
from autotune.measure.speed_gate import GateTripped, GateVerdict, GateWatch, SpeedGate
from autotune.measure.stopwatch import MeasureSettings, instance_throughput, latency_summary, timed_window, warm_up
from autotune.model.dataset import DataSource, evaluation_and_calibration
from autotune.model.inputs import as_batch, batch_len, fixed_batches, synthetic, take
from autotune.model.seeds import CALIBRATION_SEED, EVAL_SEED, TIMING_SEED, to_numpy
from autotune.model.sources import ModelSource, build_model, primary_output
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.metrics import InstanceResult, InstanceScreen, OpenMPCheck, PrepareResult, ReadyReport
from autotune.records.reference import CalibrationSet, ReferenceResult
from autotune.worker import reference_check
from autotune.worker.checks import EnvironmentMismatch, check_allocator, check_openmp, check_threads
from autotune.worker.serve import Peers, ServerMetrics, run_rate_search
from autotune.worker.teardown import keep_until_exit

EXIT_CHECK_FAILED = 3
EXIT_PRECISION_FALLBACK = 4
CALIBRATION_BATCH = 8


def run_in_batches(runner, inputs, batch_size: int, after_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Outputs for every input, in fixed-size batches (the last one padded) so shapes never change.
    `after_batch` hears the samples computed after each batch, as throughput counts them (the speed gate;
    it may raise to stop)."""
    outputs = []
    samples_per_call = batch_size * getattr(runner, "batches_per_call", 1)  # multi-stream OpenVINO: one per stream
    for batch in fixed_batches(inputs, batch_size):
        outputs.append(to_numpy(primary_output(runner(runner.convert_input(batch)))))
        if after_batch is not None:
            after_batch(len(outputs) * samples_per_call)
    return np.concatenate(outputs)[: batch_len(inputs)]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


NO_WARMUP: dict[str, Any] = {"warmup_iters": 0, "warmup_s": 0.0, "warmup_steady": False}


def wait_at_barrier(barrier_dir: Path, stage: str, instance: int, payload: dict[str, Any], timeout_s: float) -> None:
    """Say we reached `stage`, then wait for the orchestrator's go (or abort, e.g. when a pruner decides)."""
    write_json_atomic(barrier_dir / f"{stage}-{instance}.json", payload)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (barrier_dir / f"{stage}.go").exists():
            return
        if (barrier_dir / "abort").exists():
            sys.exit(0)
        time.sleep(0.002)
    raise TimeoutError(f"no go signal within {timeout_s:.0f}s at the {stage} barrier")


class StopTogether:
    """Instances of one trial stop their windows together: each marks when its own stop rule holds and
    keeps running (so the others keep the same load) until every instance has marked."""

    def __init__(self, barrier_dir: Path, instance: int, instances: int) -> None:
        self.mine = barrier_dir / f"precise-{instance}"
        self.all = [barrier_dir / f"precise-{i}" for i in range(instances)]

    def __call__(self, satisfied: bool) -> bool:
        if satisfied and not self.mine.exists():
            self.mine.touch()
        return all(p.exists() for p in self.all)


def save_atomic(obj: Any, path: str) -> None:
    import torch

    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def run_reference(job: WorkerJob) -> ReferenceResult:
    """FP32 eager outputs on the evaluation set; also saves a random init so every trial uses it (with
    an all-zero head redrawn when the outputs would otherwise be the same for every input)."""
    import torch

    from autotune.backends import backend_module

    if job.generation:
        from autotune.worker.generate import run_generation_reference

        return run_generation_reference(job, save_atomic)
    from autotune.backends.torch_common import attention_layers, with_reduction_depth

    source = job.model
    t0 = time.monotonic()
    model = keep_until_exit(build_model(source))
    seeds = {"eval": EVAL_SEED, "calibration": CALIBRATION_SEED}
    sets = evaluation_and_calibration(
        job.data or DataSource(),
        job.calibration_data,
        source,
        job.eval_samples,
        job.calibration_samples,
        lambda count, purpose: synthetic(source.specs, count, seeds[purpose]),
    )
    inputs = sets["inputs"]
    config = TrialConfig("eager", "fp32", batch_size=min(8, batch_len(inputs)))

    def fp32_outputs() -> np.ndarray:
        runner = backend_module("eager").prepare(model, take(inputs, slice(0, 1)), config, Path(str(job.workdir)))
        return run_in_batches(runner, inputs, config.batch_size)

    outputs, depth = with_reduction_depth(model, fp32_outputs)
    note = None
    if constant_across_samples(outputs):  # drift against it would be blind: see reference_check
        all_zero = not np.any(outputs)
        note = reference_check.examine(model, inputs, source, all_zero)
        if note.redrawn:
            outputs = fp32_outputs()
            if constant_across_samples(outputs):
                note = reference_check.still_constant(note, not np.any(outputs))
    if job.weights_out:  # after any redraw: every trial loads exactly the model the reference ran
        save_atomic(model.state_dict(), job.weights_out)
    save_atomic(
        {**{k: v for k, v in sets.items() if v is not None}, "outputs": torch.from_numpy(outputs)},
        str(job.reference_path),
    )
    labels = sets["labels"]
    accuracy = top1_accuracy(outputs, labels.numpy()) if labels is not None and outputs.ndim == 2 else None
    return ReferenceResult(
        pid=os.getpid(),
        output_shape=list(outputs.shape),
        seconds=time.monotonic() - t0,
        torch=torch.__version__,
        eval_samples=batch_len(inputs),
        calibration_samples=batch_len(sets["calibration"]),
        labels=labels is not None,
        reference_accuracy=accuracy,
        reference_note=note,
        attention_layers=sum(attention_layers(model).values()),
        reduction_depth=depth,
    )


def run_prepare(job: WorkerJob) -> PrepareResult:
    """Build a backend's artifact (export, conversion, quantization) once, into a fresh folder."""
    from autotune.backends import backend_module

    if job.generation:
        from autotune.worker.generate import run_generation_prepare

        return run_generation_prepare(job)

    config = job.trial_config()
    source = job.model
    module = backend_module(config.backend)
    # The artifact must depend only on its identity: a fixed batch unless the artifact is batch-specialised.
    batch = config.batch_size if "batch_size" in module.artifact_identity(config) else CALIBRATION_BATCH
    t0 = time.monotonic()
    model = keep_until_exit(build_model(source))
    example = synthetic(source.specs, batch, TIMING_SEED)
    import torch

    # The calibration set the reference process drew (the user's data, disjoint from evaluation), else synthetic.
    saved = torch.load(job.reference_path, weights_only=True).get("calibration") if job.reference_path else None
    calibration_inputs = (
        as_batch(saved) if saved is not None else synthetic(source.specs, job.calibration_samples, CALIBRATION_SEED)
    )
    calibration = fixed_batches(calibration_inputs, batch)
    out_dir = Path(str(job.artifact_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    details = module.build_artifact(model, example, calibration, config, out_dir)
    return PrepareResult(
        pid=os.getpid(),
        prepare_s=time.monotonic() - t0,
        details=details,
        calibration=CalibrationSet(data=job.calibration_description, samples=batch_len(calibration_inputs)),
    )


def build_runner(job: WorkerJob, config: TrialConfig, source: ModelSource, example: Any):
    """Artifact backends load what the prepare step built; the others wrap the torch module."""
    from autotune.backends import backend_module

    module = backend_module(config.backend)
    if module.SPEC.builds_artifact(config.precision):
        return module.load(example, config, Path(str(job.artifact_dir)))
    # The model itself is not kept: a backend may convert a copy (IPEX), and the runner holds what it uses.
    return module.prepare(build_model(source), example, config, Path(str(job.workdir)))


@dataclass(frozen=True)
class LoadedModel:
    """The backend's callable on this instance's fixed input, and what loading it cost."""

    runner: Any
    native_input: Any
    load_s: float
    first_call_s: float
    openmp: OpenMPCheck

    def step(self) -> Any:
        """One timed call: the fixed batch in, the outputs out."""
        return self.runner(self.native_input)


def load_model(job: WorkerJob, config: TrialConfig, instance: int) -> LoadedModel:
    """Build (or load the prepared artifact of) the model, check OpenMP once torch is loaded, and make
    the first call, timed apart: it includes compilation for compiled backends."""
    source = job.model
    t0 = time.monotonic()
    if job.generation:
        from autotune.worker.generate import build_generation_runner, timing_prompts

        example = timing_prompts(job, config, instance)
        runner: Any = build_generation_runner(job, config)
    else:
        example = synthetic(source.specs, config.batch_size, TIMING_SEED + instance)
        runner = build_runner(job, config, source, example)
    openmp = check_openmp(config)
    native = runner.convert_input(example)
    load_s = time.monotonic() - t0
    t0 = time.monotonic()
    runner(native)
    return keep_until_exit(LoadedModel(runner, native, load_s, time.monotonic() - t0, openmp))


def measure_drift(reference_path: str, runner: Any, batch_size: int, gate: SpeedGate | None = None) -> Drift:
    """The candidate's outputs on the evaluation set against the FP32 reference, before any timing.
    With a speed gate, raises GateTripped when the evaluation's pace falls below its floor."""
    import torch

    reference = torch.load(reference_path, weights_only=True)
    watch = GateWatch(gate) if gate is not None else None
    outputs = run_in_batches(runner, as_batch(reference["inputs"]), batch_size, watch)
    labels = reference.get("labels")
    return compute_drift(outputs, reference["outputs"].numpy(), None if labels is None else labels.numpy())


def warm_up_gate(gate: SpeedGate | None, samples_per_call: int, instance: int) -> Callable[[int], None] | None:
    """The warm-up's hook that holds it to the gate's pace, counted from the warm-up's start. Every
    instance keeps it: the ready barrier waits for all, and an unwatched one would warm up to its end."""
    if gate is None:
        return None
    watch = GateWatch(gate, stage="warm-up", instance=instance, min_calls=2)  # the first may still fuse, compile
    watch(0)
    return lambda calls: watch(calls * samples_per_call)


def screen(model: LoadedModel, settings: MeasureSettings, samples_per_call: int, stamps_path: str) -> InstanceScreen:
    """The short screening window speed pruning looks at (its stamps saved beside the full window's)."""
    stamps = timed_window(model.step, settings.screening())
    screen_path = stamps_path.replace("stamps-", "screen-")
    np.save(screen_path, stamps)
    return InstanceScreen(
        throughput_sps=instance_throughput(stamps, samples_per_call),
        latency_ms=latency_summary(stamps[:, 1] - stamps[:, 0], settings.ci_confidence),
        stamps_path=screen_path,
        samples_per_call=samples_per_call,
    )


class PrecisionFallback(RuntimeError):
    """The model does not execute the precision its configuration claims: nothing is measured."""


def probe_precision(job: WorkerJob, config: TrialConfig, model: LoadedModel) -> ExecutedPrecision:
    """What the loaded model really executes against its claimed precision, before anything is timed
    (one call at most); saved for the orchestrator, which fails the trial on a fallback."""
    precision = check_precision(model.runner, model.native_input, config.precision)
    if job.precision_path:
        write_json_atomic(job.precision_path, precision.to_json())
    if precision.fallback:
        raise PrecisionFallback(precision.cause)
    return precision


def run_trial(job: WorkerJob) -> InstanceResult:
    """Check the environment, load, check the executed precision, measure drift, warm up, wait at the
    barrier, screen, time the window."""
    t_start = time.monotonic()
    config, settings, instance = job.trial_config(), job.measure_settings(), job.instance
    if job.stamps_path is None:
        raise ValueError("a trial job needs its 'stamps_path' field")
    stamps_path = job.stamps_path
    allocator = check_allocator(config.allocator)
    threads = check_threads(config.threads_per_instance)

    import torch

    model = load_model(job, config, instance)
    precision = probe_precision(job, config, model) if instance == 0 else None
    # What throughput counts: samples, or for a language model the tokens one call generates.
    new_tokens = job.generation.new_tokens if job.generation else 0
    samples_per_call = config.batch_size * (new_tokens if job.generation else model.runner.batches_per_call)
    drift, too_slow = drift_before_timing(job, config, model)
    # Drift already beyond the bound: the orchestrator prunes at the ready barrier, so the warm-up (three
    # calls at least: 106 s of a 256 s woq_int4 decoder trial pruned on drift) is not spent.
    beyond = drift is not None and job.drift_bound is not None and job.drift_bound.exceeded(drift)
    warmup = NO_WARMUP
    if too_slow is None and not beyond:
        warmup, too_slow = gated_warm_up(model, settings, job.speed_gate, samples_per_call, instance)
    barrier = Path(job.barrier_dir) if job.barrier_dir else None
    report_ready(job, barrier, model, drift, too_slow, warmup["warmup_s"])
    if beyond:  # the pruner judges by the same criterion: a kept trial would time an instance never warmed up
        raise RuntimeError("drift beyond the bound, but the trial was not stopped")
    screening = None
    if barrier and job.screen and settings.screen_s > 0:
        screening = screen(model, settings, samples_per_call, stamps_path)
        wait_at_barrier(barrier, "screened", instance, screening.to_json(), job.barrier_timeout_s)
    cpus = sorted(os.sched_getaffinity(0))
    before = process_snapshot(cpus)
    stamps, server, served = timed_calls(job, config, settings, model, barrier, samples_per_call, t_start)
    # a language model's server may run in a process of its own (llama-server): its CPU is the measured work
    signals = window_signals(before, process_snapshot(cpus), config.threads_per_instance, served is not None)
    np.save(stamps_path, stamps)
    tokens = None
    if job.generation:
        from autotune.worker.generate import save_token_stamps, tokens_path

        tokens = tokens_path(stamps_path)
        save_token_stamps(model.runner, len(stamps), new_tokens, tokens)
    return InstanceResult(
        pid=os.getpid(),
        instance=instance,
        cpus=cpus,
        allocator=allocator,
        threads=threads,
        openmp=model.openmp,
        torch=torch.__version__,
        python=sys.executable,
        load_s=model.load_s,
        first_call_s=model.first_call_s,
        warmup_iters=warmup["warmup_iters"],
        warmup_s=warmup["warmup_s"],
        warmup_steady=warmup["warmup_steady"],
        warmup_children_cpu_s=warmup.get("warmup_children_cpu_s"),
        drift=drift,
        executed_precision=precision,
        iterations=len(stamps),
        window_s=float(stamps[-1, 1] - stamps[0, 0]),
        samples_per_call=samples_per_call,
        throughput_sps=instance_throughput(stamps, samples_per_call),
        latency_ms=latency_summary(stamps[:, 1] - stamps[:, 0], settings.ci_confidence),
        noise=signals,
        screening=screening,
        stamps_path=stamps_path,
        peak_rss_mib=peak_rss_mib(),
        startup_to_ready_s=time.monotonic() - t_start,
        backend_details=model.runner.details,
        tokens_path=tokens,
        server=server,
        llm_server=served,
    )


def drift_before_timing(
    job: WorkerJob, config: TrialConfig, model: LoadedModel
) -> tuple[Drift | None, GateVerdict | None]:
    """Instance 0's drift against the FP32 reference, before anything is timed; it keeps the speed gate's
    pace (a classifier's evaluation), and a verdict of too slow goes straight to the barrier, where the
    orchestrator prunes."""
    if job.instance != 0 or not job.reference_path or not job.measure_drift:
        return None, None
    if job.generation:
        from autotune.worker.generate import measure_generation_drift

        return measure_generation_drift(job.reference_path, model.runner, config.batch_size), None
    try:
        return measure_drift(job.reference_path, model.runner, config.batch_size, job.speed_gate), None
    except GateTripped as exc:
        return None, exc.verdict


def gated_warm_up(
    model: LoadedModel, settings: MeasureSettings, gate: SpeedGate | None, samples_per_call: int, instance: int
) -> tuple[dict[str, Any], GateVerdict | None]:
    """The warm-up, held to the speed gate's pace: what it did, and the verdict when it fell below."""
    settle = ChildrenSettle()  # not timed while processes it started (a library's pool) still start up
    try:
        done = warm_up(model.step, settings, after_call=warm_up_gate(gate, samples_per_call, instance), settled=settle)
    except GateTripped as exc:
        return {**NO_WARMUP, "warmup_s": exc.verdict.seconds}, exc.verdict
    return {**done, "warmup_children_cpu_s": settle.busy_cpu_s}, None


def report_ready(
    job: WorkerJob,
    barrier: Path | None,
    model: LoadedModel,
    drift: Drift | None,
    too_slow: GateVerdict | None,
    warmup_s: float,
) -> None:
    """Tell the orchestrator at the ready barrier what reaching it cost (so a trial pruned there still says
    where its time went), its drift and whether it was too slow; a too slow one is aborted there."""
    if barrier:
        ready = ReadyReport(os.getpid(), drift, too_slow, model.load_s, model.first_call_s, warmup_s)
        wait_at_barrier(barrier, "ready", job.instance, ready.to_json(), job.barrier_timeout_s)
    if too_slow is not None:  # the orchestrator aborts at the barrier: exits there
        raise RuntimeError(f"{too_slow.reason()}, but the trial was not stopped")


def timed_calls(
    job: WorkerJob,
    config: TrialConfig,
    settings: MeasureSettings,
    model: LoadedModel,
    barrier: Path | None,
    samples_per_call: int,
    t_start: float,
) -> tuple[np.ndarray, ServerMetrics | None, LlmServerMetrics | None]:
    """The timed window's call stamps: closed loop, stopped together with the other instances; or in the
    server scenario, the rate search's (whose result comes with them)."""
    timeout_s = job.barrier_timeout_s or 600.0
    if job.llm_server:  # a language model's engine serving requests; a short offline window beside it
        from autotune.worker.llm_serve import serve_trial

        stamps = timed_window(model.step, settings.screening())
        vocab = job.workload().vocab_size
        deadline = t_start + timeout_s * 0.95  # the trial's own timeout, less a margin to report
        served = serve_trial(job.llm_server, config, model.runner.generator, vocab, job.instances, deadline)
        return stamps, None, served
    if not job.server:
        agree = StopTogether(barrier, job.instance, job.instances) if barrier else (lambda satisfied: satisfied)
        return timed_window(model.step, settings, agree_to_stop=agree), None, None
    # A short closed-loop window bounds the rate search from above.
    stamps = timed_window(model.step, settings.screening())
    peers = Peers(barrier, job.instance, job.instances, timeout_s)
    server = run_rate_search(
        model.step,
        job.server,
        config.max_wait_ms or 0.0,
        instance_throughput(stamps, samples_per_call),
        float(np.median(stamps[:, 1] - stamps[:, 0])) * 1e3,
        config.batch_size,
        samples_per_call,
        peers,
        settings.window_min_s,
        settings.window_max_s,
        t_start + timeout_s * 0.95,  # the trial's own timeout, less a margin to report
        settings.ci_confidence,
    )
    return stamps, server, None


TASKS = {"reference": run_reference, "prepare": run_prepare, "trial": run_trial}


def replay_job(best_path: str, instance: int, scratch: str) -> WorkerJob:
    """A job that re-measures one instance of an exported winner, without barrier or drift."""
    from autotune.records.best import BestJson

    best = BestJson.read(best_path)
    if best.job is None:
        raise ValueError("it holds no timed winner (no job to replay)")
    return replace(
        best.job,
        reference_path=None,
        instance=instance,
        instances=best.config.instances,
        result_path=os.path.join(scratch, "result.json"),
        stamps_path=os.path.join(scratch, "stamps.npy"),
    )


USAGE = "usage: python -m autotune.worker JOB.json | --best best.json --instance N"


def main(argv: list[str] | None = None) -> int:
    faulthandler.enable()  # a native crash leaves its Python stack in stderr, which the trial records
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 4 and argv[0] == "--best" and argv[2] == "--instance" and argv[3].isdigit():
        with tempfile.TemporaryDirectory(prefix="autotune-replay-") as scratch:
            try:
                job = replay_job(argv[1], int(argv[3]), scratch)
            except (OSError, ValueError, KeyError) as exc:
                print(f"autotune-worker: error: cannot replay {argv[1]}: {exc}", file=sys.stderr)
                return 2
            return run_job(job, print_result=True)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        job = WorkerJob.from_json(read_json(argv[0]))
    except UnknownFormat as exc:  # written by another autotune than this worker's
        print(f"autotune-worker: error: cannot run {argv[0]}: the job's {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # unreadable, not JSON, or not a job (RecordError)
        print(f"autotune-worker: error: cannot read the job {argv[0]}: {exc}", file=sys.stderr)
        return 2
    return run_job(job, print_result=False)


def run_job(job: WorkerJob, print_result: bool) -> int:
    try:
        result = TASKS[job.task](job)
    except EnvironmentMismatch as exc:
        print(f"autotune-worker: environment check failed: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except PrecisionFallback as exc:
        print(f"autotune-worker: {exc}", file=sys.stderr)
        return EXIT_PRECISION_FALLBACK
    except Exception as exc:  # the orchestrator records the cause and our stderr tail
        traceback.print_exc()
        # one line: the orchestrator reads the last `autotune-worker:` line as the trial's cause, and a message
        # that starts with a newline (transformers' missing-package errors) would leave it blank
        print(f"autotune-worker: error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    payload = result.to_json() if isinstance(result, Record) else result
    write_json_atomic(str(job.result_path), payload)
    if print_result:
        print(json.dumps(payload, indent=2))
    return 0

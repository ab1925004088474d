"""Run one configuration: write each instance's job, launch them pinned, aggregate their results.

This is the bridge between a TrialConfig and the processes that measure it; it knows nothing about
Optuna (the study passes an `on_stage` hook: drift and speed pruning at the barriers).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.backends import backend_specs
from autotune.backends.precision import ExecutedPrecision
from autotune.common.errors import TrialFailed
from autotune.common.files import json_digest, read_json, write_json_atomic
from autotune.machine.probe import MachineProbe
from autotune.machine.runtimes import Runtime, discover_runtimes, runtime_env
from autotune.measure.drift import Drift, DriftCriterion
from autotune.measure.llm_serving import ServingPlan
from autotune.measure.noise import NoiseLimits, machine_snapshot, noise_flags
from autotune.measure.speed_gate import SpeedGate
from autotune.measure.stopwatch import (
    CommonWindow,
    MeasureSettings,
    combined_early_late,
    common_window_throughput,
    latency_summary,
    straggler_ratio,
    window_calls,
)
from autotune.measure.tokens import token_times
from autotune.model.dataset import DataSource
from autotune.model.generation import REFERENCE_FORMAT, GenerationWorkload, encoded_once
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig, clean_environment, pin_prefix
from autotune.records.job import ServerSettings, WorkerJob
from autotune.records.metrics import (
    ArtifactUse,
    Attempt,
    GenerationMetrics,
    InstanceResult,
    InstanceScreen,
    InstanceShare,
    MachineLoad,
    Measurement,
    PrepareResult,
    Screening,
    TrialMetrics,
    Warmup,
)
from autotune.records.reference import CalibrationSet, EvaluationSet, ReferenceNote, ReferenceResult
from autotune.runner.artifact_cache import (
    META_FILE,
    artifact_dir,
    artifact_key,
    build_lock,
    evict_least_recently_used,
    mark_used,
    read_meta,
)
from autotune.runner.launch import InstanceLaunch, run_instances

WORKER_MODULE = "autotune.worker"


@dataclass(frozen=True)
class Reference:
    """The FP32 eager outputs every trial is compared with, and the weights every trial loads."""

    outputs_path: Path
    model: ModelSource  # with weights_path and weights_sha256 set: random inits are saved once and shared
    # What int8 artifacts are calibrated on (part of their cache key) and what drift is measured on.
    calibration: CalibrationSet = field(default_factory=lambda: CalibrationSet(samples=64))
    evaluation: EvaluationSet | None = None
    generation: GenerationWorkload | None = None  # language models: the workload every trial runs
    note: ReferenceNote | None = None  # the FP32 outputs were constant across inputs: what was done about it
    digest: str = ""  # what it was computed from (model, data, sizes, format): drift is reused only against the same
    # the model's attention layers; None: not counted (a language model, or a reference from before they were)
    attention_layers: int | None = None
    # multiply-adds per output of its convolutions and linear layers; None: not measured (as above)
    reduction_depth: float | None = None


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a study shares: the machine, the reference, how to measure, where caches live."""

    machine: MachineProbe
    reference: Reference
    measure: MeasureSettings
    cache_dir: Path  # shared by the studies under one studies folder
    calibration_samples: int = 64
    noise_limits: NoiseLimits = field(default_factory=NoiseLimits.from_environment)
    noisy_retries: int = 1  # a contaminated measurement is repeated this many times before it is flagged
    runtimes: dict[str, Runtime] | None = None  # None: discovered when first needed (main and .venv-ipex)
    memory_limit_mib: float | None = None  # all processes of a trial together (artifact builds too)
    cache_size_mib: float | None = None  # the artifact cache's cap: least recently used evicted past it
    server: ServerSettings | None = None  # the server scenario's bound and arrivals (None: closed loop)
    llm_server: ServingPlan | None = None  # a language model's server scenario: requests, bounds, seed

    def runtime(self, name: str) -> Runtime:
        """The runtime a config names; one the context does not know is a failed trial, not a crash."""
        if self.runtimes is None:
            object.__setattr__(self, "runtimes", discover_runtimes())
        known: dict[str, Runtime] = self.runtimes or {}
        try:
            return known[name]
        except KeyError:
            raise TrialFailed(
                f"runtime {name!r} is not known here (known: {', '.join(known)}); pass it again with --runtime PATH"
            ) from None


def worker_argv(job_path: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", WORKER_MODULE, str(job_path)]


def replay_argv(best_path: Path, instance: int, python: str = sys.executable) -> list[str]:
    """The worker command that re-runs an exported winner's instance from best.json alone."""
    return [python, "-m", WORKER_MODULE, "--best", str(best_path), "--instance", str(instance)]


def backend_env(config: TrialConfig, cache_dir: Path, task: str) -> dict[str, str]:
    """Environment a backend needs beyond threads and allocator, as its SPEC declares: the compile cache
    its trials share, and what it needs beside a preloaded allocator."""
    spec = backend_specs(task)[config.backend]
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor")} if spec.inductor_cache else {}
    if config.allocator != "glibc":
        env.update(spec.preloaded_allocator_env)
    return env


def plan_instances(
    config: TrialConfig,
    machine: MachineProbe,
    trial_dir: Path,
    job: WorkerJob,
    cache_dir: Path,
    runtime: Runtime,
) -> list[InstanceLaunch]:
    """Write one job file per instance and describe how to start it (pinned, with its env, in its runtime)."""
    try:
        task = "generate" if job.generation else "classify"
        set_env = {**config.to_env(machine, runtime.openmp), **backend_env(config, cache_dir, task)}
    except ValueError as exc:
        raise TrialFailed(str(exc)) from None
    base_env = runtime_env(runtime, {**clean_environment(dict(os.environ)), **set_env})
    launches = []
    for i, cpus in enumerate(config.instance_cpus(machine)):
        job_path = trial_dir / f"job-{i}.json"
        instance_job = replace(
            job,
            instance=i,
            instances=config.instances,
            result_path=str(trial_dir / f"result-{i}.json"),
            stamps_path=str(trial_dir / f"stamps-{i}.npy"),
            precision_path=str(trial_dir / f"precision-{i}.json"),
        )
        write_json_atomic(job_path, instance_job.to_json())
        launches.append(
            InstanceLaunch(
                argv=[*pin_prefix(cpus, machine), *worker_argv(job_path, runtime.python)],
                env=base_env,
                set_env=set_env,
                result_path=trial_dir / f"result-{i}.json",
                stdout_path=trial_dir / f"stdout-{i}.log",
                stderr_path=trial_dir / f"stderr-{i}.log",
            )
        )
    return launches


def aggregate(results: list[InstanceResult], settings: MeasureSettings) -> TrialMetrics:
    """One measurement's numbers from its instances: throughput over the window all of them shared,
    each with how it was obtained (samples, duration, confidence interval of the median)."""
    stamps = [np.load(r.stamps_path) for r in results]
    samples_per_call = results[0].samples_per_call
    window = common_window_throughput(stamps, samples_per_call, settings.ci_confidence)
    if not window.valid:
        raise TrialFailed("the instances' measurement windows did not overlap: no common throughput")
    latencies, counted_calls = window_calls(stamps, window.start, window.end)
    ci_rel = window.ci_rel
    return TrialMetrics(
        throughput_sps=window.throughput_sps,
        throughput_ci_sps=window.ci_sps,
        latency_ms=latency_summary(latencies, settings.ci_confidence),
        peak_rss_mib=max(r.peak_rss_mib for r in results),
        peak_rss_mib_total=sum(r.peak_rss_mib for r in results),
        load_s=max(r.load_s for r in results),
        first_call_s=max(r.first_call_s for r in results),
        pids=[r.pid for r in results],
        drift=results[0].drift,
        torch_version=results[0].torch,
        backend_details=results[0].backend_details,
        executed_precision=results[0].executed_precision,
        instances=[
            InstanceShare(
                pid=r.pid,
                cpus=r.cpus,
                allocator=r.allocator,
                threads=r.threads,
                openmp=r.openmp,
                throughput_sps=r.throughput_sps,
                iterations=r.iterations,
                window_s=r.window_s,
                warmup_iters=r.warmup_iters,
                warmup_s=r.warmup_s,
                common_window_sps=share,
                latency_ms=r.latency_ms,
                noise=r.noise,
            )
            for r, share in zip(results, window.per_instance_sps)
        ],
        measurement=Measurement(
            common_window_s=window.window_s,
            calls=len(latencies),
            samples=round(counted_calls * samples_per_call),
            throughput_ci_rel=ci_rel,
            ci_confidence=settings.ci_confidence,
            ci_target_rel=settings.ci_target_rel,
            ci_target_met=ci_rel is not None and ci_rel <= settings.ci_target_rel,
            throughput_ci_method=window.ci_method,
            straggler_ratio=straggler_ratio(window.per_instance_sps),
            combined_early_late_rel=(
                combined_early_late(stamps, window.start, window.end) if len(stamps) > 1 else None
            ),
            samples_per_call=samples_per_call,
            warmup=Warmup(
                iters=min(r.warmup_iters for r in results),
                s=min(r.warmup_s for r in results),
                children_cpu_s=sum(r.warmup_children_cpu_s or 0.0 for r in results),
            ),
            stamps=[r.stamps_path for r in results],
        ),
        screening=screening_of(results, settings.ci_confidence),
        generation=generation_of(results, stamps, window, settings),
        server=results[0].server,
        llm_server=results[0].llm_server,
    )


def generation_of(
    results: list[InstanceResult], stamps: list[np.ndarray], window: CommonWindow, settings: MeasureSettings
) -> GenerationMetrics | None:
    """A language model's TTFT, TPOT and tokens/s over the common window (None for other models)."""
    if not results[0].tokens_path:
        return None
    tokens = [np.load(r.tokens_path) for r in results if r.tokens_path]
    times = token_times(stamps, tokens, window.start, window.end)
    new_tokens = tokens[0].shape[1]
    sequences = results[0].samples_per_call // new_tokens
    details = results[0].backend_details or {}
    prompt_tokens = int(details.get("prompt_tokens", 0))
    tokens_per_s = window.throughput_sps
    mean_ttft = float(np.mean(times.ttft_s)) if len(times.ttft_s) else 0.0
    return GenerationMetrics(
        ttft_ms=latency_summary(times.ttft_s, settings.ci_confidence),
        tpot_ms=latency_summary(times.tpot_s, settings.ci_confidence),
        tokens_per_s=tokens_per_s,
        # Prompt tokens each instance prefills per second of prefill, summed over instances.
        prefill_tokens_per_s=len(results) * sequences * prompt_tokens / mean_ttft if mean_ttft > 0 else 0.0,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        sequences=sequences,
        generation_ms_mean=float(np.mean(times.generation_s)) * 1e3 if len(times.generation_s) else 0.0,
        weight_bytes=details.get("weight_bytes"),
        quantize_s=details.get("quantize_s"),
    )


def judge_noise(
    metrics: TrialMetrics,
    machine_before: dict[str, float],
    machine_after: dict[str, float],
    allowed_cpus: int,
    limits: NoiseLimits,
) -> TrialMetrics:
    """The metrics with the interference signals recorded and the reasons the measurement is noisy
    (`measurement.noise_flags`, empty when clean)."""
    instances = [
        {"signals": inst.noise.to_json() if inst.noise else {}, "latency": inst.latency_ms}
        for inst in metrics.instances
    ]
    combined = metrics.measurement.combined_early_late_rel
    flags = noise_flags(instances, machine_before, machine_after, allowed_cpus, limits, combined_drift=combined)
    measurement = replace(
        metrics.measurement, machine=MachineLoad(before=machine_before, after=machine_after), noise_flags=flags
    )
    return replace(metrics, measurement=measurement)


def job_template(config: TrialConfig, ctx: TrialContext, artifact: ArtifactUse | None) -> WorkerJob:
    """What every instance's job holds in common (best.json keeps its JSON to replay the winner)."""
    return WorkerJob(
        task="trial",
        model=ctx.reference.model,
        config=config,
        measure=ctx.measure,
        reference_path=str(ctx.reference.outputs_path),
        workdir=str(ctx.cache_dir),
        artifact_dir=artifact.dir if artifact else None,
        calibration_samples=ctx.calibration_samples,
        calibration=ctx.reference.calibration,
        generation=ctx.reference.generation,
        server=ctx.server,
        llm_server=ctx.llm_server,
    )


def ensure_artifact(config: TrialConfig, ctx: TrialContext, work_dir: Path, timeout_s: float) -> ArtifactUse | None:
    """The backend's artifact, from the cache or built in its own process; says which happened, and
    which least recently used artifacts were evicted to keep the cache under its cap."""
    artifact = _cached_or_built_artifact(config, ctx, work_dir, timeout_s)
    if artifact is not None:
        directory = Path(artifact.dir)
        mark_used(directory)
        if ctx.cache_size_mib is not None:
            evicted = evict_least_recently_used(ctx.cache_dir, ctx.cache_size_mib, keep=directory)
            artifact = replace(artifact, evicted=evicted)
    return artifact


def _cached_or_built_artifact(
    config: TrialConfig, ctx: TrialContext, work_dir: Path, timeout_s: float
) -> ArtifactUse | None:
    generation = ctx.reference.generation
    if not backend_specs("generate" if generation else "classify")[config.backend].builds_artifact(config.precision):
        return None
    runtime = ctx.runtime(config.runtime)
    key = artifact_key(
        ctx.reference.model,
        config,
        ctx.reference.calibration,
        runtime.packages,
        generation,
    )
    directory = artifact_dir(ctx.cache_dir, key)
    with build_lock(directory):
        meta = read_meta(directory)
        if meta is not None:
            return ArtifactUse(
                dir=str(directory), cached=True, prepare_s=0.0, built_in_s=meta["prepare_s"], details=meta["details"]
            )
        building = directory.with_name(directory.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)  # an unreadable or incomplete one
        work_dir.mkdir(parents=True, exist_ok=True)
        job_path = work_dir / "prepare-job.json"
        job = WorkerJob(
            task="prepare",
            model=ctx.reference.model,
            config=config,
            artifact_dir=str(building),
            calibration_samples=ctx.calibration_samples,
            reference_path=str(ctx.reference.outputs_path),
            calibration_description=ctx.reference.calibration.data,
            result_path=str(work_dir / "prepare-result.json"),
            generation=generation,
        )
        write_json_atomic(job_path, job.to_json())
        launch = InstanceLaunch(
            argv=worker_argv(job_path, runtime.python),
            env=runtime_env(runtime, clean_environment(dict(os.environ))),
            set_env={},
            result_path=work_dir / "prepare-result.json",
            stdout_path=work_dir / "prepare-stdout.log",
            stderr_path=work_dir / "prepare-stderr.log",
        )
        try:
            result = PrepareResult.from_json(
                run_instances([launch], timeout_s, memory_limit_mib=ctx.memory_limit_mib)[0]
            )
        except TrialFailed as exc:
            shutil.rmtree(building, ignore_errors=True)
            raise TrialFailed(f"preparing the {config.backend} artifact failed: {exc.cause}", exc.stderr_tail) from exc
        except BaseException:  # Ctrl-C: leave no half-built folder behind
            shutil.rmtree(building, ignore_errors=True)
            raise
        write_json_atomic(
            building / META_FILE,
            {
                "key": key,
                "prepare_s": result.prepare_s,
                "details": result.details,
                "calibration": result.calibration.to_json() if result.calibration else None,
            },
        )
        os.rename(building, directory)
        return ArtifactUse(dir=str(directory), cached=False, prepare_s=result.prepare_s, details=result.details)


OnStage = Callable[[str, list[dict[str, Any]]], None]


def run_config(
    config: TrialConfig,
    ctx: TrialContext,
    trial_dir: Path,
    timeout_s: float,
    on_stage: OnStage | None = None,
    screen: bool = False,
    known_drift: Drift | None = None,
    server_rates: list[float] | None = None,
    server_round: int = 0,
    speed_gate: SpeedGate | None = None,
    drift_bound: DriftCriterion | None = None,
) -> tuple[TrialMetrics, list[InstanceLaunch], WorkerJob]:
    """Measure one configuration in fresh processes; raises TrialFailed when it cannot.
    `on_stage(stage, payloads)` hears "prepared" (the artifact is built; no payloads), then each barrier
    of the first attempt ("ready" with drift, "screened"); raising in it stops the trial.
    `server_rates`: in the server scenario, the rates its rate search offers first (a finalist's: the
    winner's rate and +-10%); `server_round` draws other arrival streams (a finalist round's, a verify run's).
    `speed_gate`: the pace the first attempt's drift evaluation and warm-up must keep (measure/speed_gate.py);
    a trial that falls below it reaches the ready barrier with `too_slow`.
    `drift_bound`: the criterion the ready barrier prunes by; the instance whose drift is beyond it goes
    there without warming up.

    A measurement the noise checks flag is repeated (fresh processes again, no screening) up to
    `ctx.noisy_retries` times; if every attempt is flagged the result says so (`valid` false).
    Returns the metrics, the launches (for the record) and the job template that replays it.
    """
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    trial_dir.mkdir(parents=True)
    started = time.monotonic()
    artifact = ensure_artifact(config, ctx, trial_dir, timeout_s)
    if on_stage is not None:
        on_stage("prepared", [])  # the artifact exists: what came before was its preparation
    template = job_template(config, ctx, artifact)
    attempts: list[TrialMetrics] = []
    launches: list[InstanceLaunch] = []
    for attempt in range(ctx.noisy_retries + 1):
        remaining = timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            if not attempts:
                raise TrialFailed(f"timed out after {timeout_s:.0f}s while preparing")
            break  # keep the attempts made; the last one stays flagged
        first = attempt == 0
        job = attempt_job(template, first, screen, known_drift, speed_gate, drift_bound, server_rates, server_round)
        attempt_dir = trial_dir if first else trial_dir / f"retry-{attempt}"
        metrics, launches = measure_attempt(config, ctx, attempt_dir, job, remaining, on_stage if first else None)
        attempts.append(metrics)
        if not metrics.noise_flags:
            break
    last = attempts[-1]
    metrics = replace(
        last,
        drift=known_drift or attempts[0].drift,  # measured once: by the first attempt, or reused
        screening=attempts[0].screening,  # what speed pruning looked at: retries are not screened
        valid=not last.noise_flags,
        measurement=replace(last.measurement, attempts=[Attempt(m.throughput_sps, m.noise_flags) for m in attempts]),
        runtime=ctx.runtime(config.runtime).record(),
        prepare_s=artifact.prepare_s if artifact else 0.0,
        artifact=artifact,
    )
    return metrics, launches, template


def attempt_job(
    template: WorkerJob,
    first: bool,
    screen: bool,
    known_drift: Drift | None,
    speed_gate: SpeedGate | None,
    drift_bound: DriftCriterion | None,
    server_rates: list[float] | None,
    server_round: int,
) -> WorkerJob:
    """One attempt's job: only the first screens, measures drift (unless known) and keeps the speed
    gate; a server round draws its own arrival stream from the template's seed."""
    measure_drift = known_drift is None and first
    server, served = template.server, template.llm_server
    if server is not None and (server_rates or server_round):
        server = replace(server, first_rates=server_rates or [], seed=server.seed + 104_729 * server_round)
    if served is not None and server_round:  # a finalist's repeat: its own requests and arrivals
        served = replace(served, seed=served.seed + 104_729 * server_round)
    return replace(
        template,
        screen=screen and first,
        measure_drift=measure_drift,
        speed_gate=speed_gate if first else None,
        drift_bound=drift_bound if measure_drift else None,
        server=server,
        llm_server=served,
    )


def measure_attempt(
    config: TrialConfig,
    ctx: TrialContext,
    attempt_dir: Path,
    job: WorkerJob,
    timeout_s: float,
    on_stage: OnStage | None,
) -> tuple[TrialMetrics, list[InstanceLaunch]]:
    """One measurement in fresh processes: launch the instances, pass the barriers, aggregate their
    results and judge the noise around them."""
    barrier = attempt_dir / "barrier"
    barrier.mkdir(parents=True)
    job = replace(job, barrier_dir=str(barrier), barrier_timeout_s=timeout_s)
    launches = plan_instances(config, ctx.machine, attempt_dir, job, ctx.cache_dir, ctx.runtime(config.runtime))
    before = machine_snapshot()
    try:
        payloads = run_instances(
            launches,
            timeout_s,
            barrier_dir=barrier,
            on_stage=on_stage,
            stages=("ready", "screened") if job.screen else ("ready",),
            memory_limit_mib=ctx.memory_limit_mib,
        )
    except TrialFailed as exc:
        fallback = precision_failure(attempt_dir, exc)
        if fallback is None:
            raise
        raise fallback from exc
    metrics = aggregate([InstanceResult.from_json(p) for p in payloads], ctx.measure)
    metrics = replace(metrics, measurement=replace(metrics.measurement, pinned=ctx.machine.pinning != "none"))
    allowed = len(ctx.machine.allowed_cpus)
    return judge_noise(metrics, before, machine_snapshot(), allowed, ctx.noise_limits), launches


def precision_failure(attempt_dir: Path, exc: TrialFailed) -> TrialFailed | None:
    """When instance 0 stopped because the model does not execute the precision its config claims:
    the failure with that cause (`precision fallback: ...`) and the record of what ran."""
    try:
        precision = ExecutedPrecision.from_json(read_json(attempt_dir / "precision-0.json"))
    except (OSError, ValueError):
        return None
    if not precision.fallback:
        return None
    return TrialFailed(precision.cause, exc.stderr_tail, {"executed_precision": precision.to_json()})


def screening_of(results: list[InstanceResult], confidence: float = 0.95) -> Screening | None:
    """The trial's screening, when every instance screened."""
    screens = [r.screening for r in results]
    return combine_screens([s for s in screens if s is not None], confidence) if all(screens) else None


def screening_value(payloads: list[dict[str, Any]], confidence: float = 0.95) -> Screening:
    """The screening measurement of a trial from its instances' barrier payloads."""
    return combine_screens([InstanceScreen.from_json(p) for p in payloads], confidence)


def combine_screens(screens: list[InstanceScreen], confidence: float = 0.95) -> Screening:
    """Instances screened together, counted over their common window as the full measurement is, so
    the speed pruner compares like with like (not each instance over its own window, summed)."""
    if any(s.stamps_path is None for s in screens):  # a worker that saved no stamps: its own numbers
        cis = [s.latency_ms.p50_ci_rel for s in screens]
        return Screening(
            throughput_sps=sum(s.throughput_sps for s in screens),
            p50_ms=max(s.latency_ms.p50 or 0.0 for s in screens),
            ci_rel=None if any(c is None for c in cis) else max(c for c in cis if c is not None),
            calls=sum(s.latency_ms.samples for s in screens),
        )
    stamps = [np.load(str(s.stamps_path)) for s in screens]
    window = common_window_throughput(stamps, screens[0].samples_per_call, confidence, whole_calls=False)
    if not window.valid:
        raise TrialFailed("the instances' screening windows did not overlap")
    latencies, _ = window_calls(stamps, window.start, window.end)
    return Screening(
        throughput_sps=window.throughput_sps,
        p50_ms=latency_summary(latencies, confidence).p50 or 0.0,
        ci_rel=window.ci_rel,
        calls=len(latencies),
    )


def compute_reference(
    model: ModelSource,
    study_dir: Path,
    eval_samples: int,
    timeout_s: float,
    data: DataSource = DataSource(),
    calibration_data: DataSource | None = None,
    calibration_samples: int = 64,
    generation: GenerationWorkload | None = None,
) -> Reference:
    """FP32 eager outputs on the evaluation set, computed once per study in a fresh process, which also
    draws the calibration set (disjoint from evaluation) and saves it beside them.

    Reused only when it was computed for the same model, weights, data and set sizes. When its outputs
    are constant across inputs, `note` says so (and whether the random init's head was redrawn).
    """
    ref_dir = study_dir / "reference"
    outputs_path = (ref_dir / "reference.pt").resolve()
    weights_path = (ref_dir / "weights.pt").resolve()
    wanted = {
        "model": model.to_json(),
        "eval_samples": eval_samples,
        "calibration_samples": calibration_samples,
        "data": data.to_json(),
        "calibration_data": calibration_data.to_json() if calibration_data else None,
        **({"generation": generation.to_json(), "reference_format": REFERENCE_FORMAT} if generation else {}),
    }
    asked = generation  # the text as given, before its ids are cached: what best.json says drift was read from
    if generation is not None:  # encoded here, in the main runtime, for every trial's runtime
        generation = encoded_once(generation, ref_dir)
    try:
        meta = read_json(ref_dir / "meta.json")
        # A reference from before constant outputs were looked for has no note: computed again.
        fresh = meta["wanted"] == wanted and "reference_note" in meta["result"] and outputs_path.exists()
        ReferenceResult.from_json(meta["result"])  # a result of a layout this autotune does not read: again
    except (OSError, ValueError, KeyError, TypeError):
        fresh = False
    if not fresh:
        job = WorkerJob(
            task="reference",
            model=model,
            eval_samples=eval_samples,
            workdir=str(study_dir),
            calibration_samples=calibration_samples,
            data=data,
            calibration_data=calibration_data,
            reference_path=str(outputs_path),
            result_path=str((ref_dir / "result.json").resolve()),
            weights_out=None if model.has_own_weights else str(weights_path),
            generation=generation,
        )
        result = run_reference_process(job, ref_dir, timeout_s)
        write_json_atomic(ref_dir / "meta.json", {"wanted": wanted, "result": result.to_json()})
    result = ReferenceResult.from_json(read_json(ref_dir / "meta.json")["result"])
    calibration = calibration_record(data, calibration_data, calibration_samples, result)
    evaluation = evaluation_record(data, result, asked)
    shared = model if model.has_own_weights else model.with_weights(str(weights_path))
    digest = json_digest(wanted)  # what the reference was computed from: the same on every host of a fleet
    return Reference(
        outputs_path,
        shared,
        calibration,
        evaluation,
        generation,
        result.reference_note,
        digest,
        result.attention_layers,
        result.reduction_depth,
    )


def run_reference_process(job: WorkerJob, ref_dir: Path, timeout_s: float) -> ReferenceResult:
    """The reference computed in a fresh process of the main runtime, as trials are measured: its result."""
    ref_dir.mkdir(parents=True, exist_ok=True)
    job_path = ref_dir / "job.json"
    write_json_atomic(job_path, job.to_json())
    launch = InstanceLaunch(
        argv=worker_argv(job_path),
        env=clean_environment(dict(os.environ)),
        set_env={},
        result_path=ref_dir / "result.json",
        stdout_path=ref_dir / "stdout.log",
        stderr_path=ref_dir / "stderr.log",
    )
    return ReferenceResult.from_json(run_instances([launch], timeout_s)[0])


def calibration_record(
    data: DataSource, calibration_data: DataSource | None, samples: int, result: ReferenceResult
) -> CalibrationSet:
    """Which calibration set the artifacts were built from: it belongs to their cache key and best.json."""
    source = calibration_data or data
    if source.kind == "synthetic":
        return CalibrationSet(samples=samples)
    return CalibrationSet(
        data=source.describe(),
        digest=source.digest,
        samples=result.calibration_samples,
        after_eval=None if calibration_data is not None else result.eval_samples,  # where the split starts
    )


def evaluation_record(
    data: DataSource, result: ReferenceResult, generation: GenerationWorkload | None
) -> EvaluationSet:
    """What drift was measured on, as the report shows it: a language model's prompts come from its
    workload's text (read by its tokenizer) or are seeded random token ids."""
    described, synthetic = data.describe(), data.kind == "synthetic"
    if generation is not None:
        reader = f", read by the tokenizer of {generation.tokenizer}" if generation.tokenizer else ""
        described = f"{generation.data}{reader}" if generation.data else "seeded random token ids"
        synthetic = generation.data is None
    return EvaluationSet(
        data=described,
        samples=result.eval_samples,
        labels=result.labels,
        reference_accuracy=result.reference_accuracy,
        synthetic=synthetic,
        reference_perplexity=result.reference_perplexity if generation else None,
    )

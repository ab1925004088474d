"""Side-by-side measurements in one run: the exported winner against the baseline, or every backend.

Configurations run in fresh processes through the same machinery as trials, alternating (A, B, C, A,
B, C, ...) so slow drifts of a shared machine hit all alike; tables report medians and ratios.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.remeasure.crosscheck import StopwatchReading

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from autotune.common.errors import TrialFailed, UserError
from autotune.machine.probe import probe_machine
from autotune.machine.runtimes import candidates, discover_runtimes
from autotune.measure.drift import Drift
from autotune.measure.stopwatch import MeasureSettings
from autotune.model.sources import ModelSource
from autotune.records.config import TrialConfig
from autotune.records.metrics import TrialMetrics
from autotune.remeasure.context import context_from_best
from autotune.results.best_json import read_best
from autotune.results.selection import interleaved_schedule
from autotune.runner.trials import TrialContext, compute_reference, run_config

TIMEOUT_S = 1800.0


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class BenchRun:
    """One run of one row of a side-by-side table: autotune's protocol in fresh processes, or an
    independent stopwatch (benchmark_app, a plain loop) that reports throughput alone."""

    throughput_sps: float  # generated tokens/s for a language model (`unit`)
    p50_ms: float | None = None  # per call; per output token (TPOT) for a language model
    p99_ms: float | None = None
    drift: Drift | None = None
    valid: bool = True
    noise_flags: list[str] = field(default_factory=list)
    unit: str = "samples/s"
    ttft_p50_ms: float | None = None  # language models: time to first token

    @classmethod
    def of_metrics(cls, metrics: TrialMetrics) -> BenchRun:
        served = metrics.llm_server
        if served is not None:  # a language model's server: the sustained rate, TPOT p50/p99 and TTFT p50 there
            probe = served.at_sustained
            return cls(
                served.sustained_rps,
                probe.load.tpot_ms.p50 if probe else None,
                probe.load.tpot_ms.p99 if probe else None,
                metrics.drift,
                metrics.valid,
                metrics.noise_flags,
                "requests/s",
                probe.load.ttft_ms.p50 if probe else None,
            )
        if metrics.server is not None:  # the server scenario: the sustained rate, and the latency there
            at = metrics.server.at_sustained
            return cls(
                metrics.server.sustained_rps,
                at.latency_ms.p50 if at else None,
                at.latency_ms.p99 if at else None,
                metrics.drift,
                metrics.valid,
                metrics.noise_flags,
                "requests/s",
            )
        generation = metrics.generation
        latency = generation.tpot_ms if generation else metrics.latency_ms
        return cls(
            metrics.throughput_sps,
            latency.p50,
            latency.p99,
            metrics.drift,
            metrics.valid,
            metrics.noise_flags,
            metrics.unit,
            generation.ttft_ms.p50 if generation else None,
        )

    @classmethod
    def of_stopwatch(cls, reading: StopwatchReading) -> BenchRun:
        return cls(reading.throughput_sps, p50_ms=reading.median_ms)


Measure = Callable[[Path], BenchRun]


def measure_side_by_side(
    measures: dict[str, Measure], repeats: int, work: Path, console: Console
) -> dict[str, list[BenchRun]]:
    """Run every measurement `repeats` times, interleaved; one that fails is reported, not fatal."""
    runs: dict[str, list[BenchRun]] = {name: [] for name in measures}
    for repeat, name in interleaved_schedule(list(measures), repeats):  # each round starts one later
        try:
            run = measures[name](work / f"{repeat}-{name.replace(' ', '_')}")
        except TrialFailed as exc:
            console.print(f"repeat {repeat + 1}/{repeats} {name:<28} FAILED: {exc.cause}", markup=False)
            continue
        runs[name].append(run)
        noisy = "" if run.valid else "  (noisy: " + "; ".join(run.noise_flags) + ")"
        console.print(
            f"repeat {repeat + 1}/{repeats} {name:<28} {run.throughput_sps:9.2f} {run.unit}{noisy}", markup=False
        )
    return runs


def config_measure(config: TrialConfig, ctx: TrialContext) -> Measure:
    """A config measured by autotune's own protocol, in fresh processes."""
    return lambda work: BenchRun.of_metrics(run_config(config, ctx, work, TIMEOUT_S)[0])


def median_throughput(runs: list[BenchRun]) -> float | None:
    """The median over the clean runs (as finalists and verify count them); None when none was clean."""
    clean = [r.throughput_sps for r in runs if r.valid]
    return statistics.median(clean) if clean else None


def print_results(
    console: Console, title: str, settings: dict[str, str], runs: dict[str, list[BenchRun]], ratios_to: list[str]
) -> None:
    """The table, then each row's full settings (kept out of the table so it stays readable)."""
    console.print(results_table(title, runs, ratios_to))
    for name, text in settings.items():
        console.print(f"  {name}: {text}", markup=False)


def results_table(title: str, runs: dict[str, list[BenchRun]], ratios_to: list[str]) -> Table:
    """Medians over the clean runs with their range, how many runs were clean, latency, drift, and the
    ratio of each row's median to some rows'. Runs flagged noisy are counted, not averaged in."""
    medians = {name: median_throughput(ms) for name, ms in runs.items()}
    generation = any(r.unit == "tokens/s" for ms in runs.values() for r in ms)
    unit = next((r.unit for ms in runs.values() for r in ms), "samples/s")
    latency = ("TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms") if generation else ("p50 ms", "p99 ms")
    if unit == "requests/s":
        latency = ("p50 ms at that rate", "p99 ms at that rate")
    table = Table(title=title)
    for column in (
        "config",
        "median requests/s sustained" if unit == "requests/s" else f"median {unit}",
        "min",
        "max",
        "clean runs",
        *latency,
        "drift (rel. L2)",
        "top-1 agree",
        *("vs " + name for name in ratios_to),
    ):
        table.add_column(column, no_wrap=column == "config")  # row names stay whole (and parseable)
    for name, ms in runs.items():
        if not ms:
            table.add_row(name, "failed", *[""] * (5 + len(latency) + len(ratios_to)))
            continue
        clean = [r for r in ms if r.valid]
        sps = [r.throughput_sps for r in clean]
        drift = ms[0].drift
        mine = medians[name]
        ratios = [f"{mine / theirs:.2f}x" if mine and (theirs := medians.get(other)) else "-" for other in ratios_to]
        keys = ("ttft_p50_ms", "p50_ms", "p99_ms") if generation else ("p50_ms", "p99_ms")
        table.add_row(
            name,
            _fmt(medians[name]),
            _fmt(min(sps)) if sps else "-",
            _fmt(max(sps)) if sps else "-",
            f"{len(clean)}/{len(ms)}",
            *(_median_of(clean, key) for key in keys),
            _fmt(drift.relative_l2 if drift else None, 4),
            _fmt(drift.top1_agreement if drift else None, 3),
            *ratios,
        )
    return table


def _median_of(runs: list[BenchRun], key: str) -> str:
    values = [value for r in runs if (value := getattr(r, key)) is not None]
    return _fmt(statistics.median(values), 1) if values else "-"


# The rows of `compare_with_baseline`'s table, as keys of what it returns.
BASELINE_ROW, WINNER_ROW = "baseline", "winner"
INDEPENDENT_ROW, ONE_COMMAND_ROW = "winner, independent", "benchmark_app, one command"


def compare_with_baseline(
    best_path: Path, repeats: int, console: Console, independent_s: float = 0.0, vs_benchmark_app_s: float = 0.0
) -> dict[str, list[BenchRun]]:
    """Re-measure an exported winner against its study's eager fp32 baseline, interleaved; optionally
    also under an independent stopwatch and against `benchmark_app -hint throughput` on NNCF int8."""
    from autotune.remeasure.crosscheck import independent_winner, one_command_openvino

    best = read_best(best_path)
    if best.baseline is None or best.baseline.config is None:
        raise UserError(f"{best_path} has no baseline trial to compare with")
    ctx = context_from_best(best)
    source = ctx.reference.model
    baseline, winner = best.baseline.config, best.config
    total = winner.total_batch
    if ctx.reference.generation is not None and baseline.total_batch != total:
        # the same work: the study's baseline (eager fp32, one instance) at the winner's total sequences
        baseline = replace(baseline, batch_size=total, instances=1)
    measures: dict[str, Measure] = {
        BASELINE_ROW: config_measure(baseline, ctx),
        WINNER_ROW: config_measure(winner, ctx),
    }
    settings = {BASELINE_ROW: baseline.summary(), WINNER_ROW: winner.summary()}
    if ctx.reference.generation is not None:
        settings[WINNER_ROW] += f" ({total} sequences as {winner.instances} x {winner.batch_size})"
        settings[BASELINE_ROW] += f" ({total} sequences, the winner's total)"
    ratios_to = [BASELINE_ROW]
    if independent_s > 0:
        measures[INDEPENDENT_ROW] = lambda work: BenchRun.of_stopwatch(
            independent_winner(best, work, independent_s, ctx.runtime(winner.runtime))
        )
        tool = "benchmark_app, same IR and settings" if winner.backend == "openvino" else "plain timing loop"
        settings[INDEPENDENT_ROW] = f"{tool}, {independent_s:.0f} s"
    if vs_benchmark_app_s > 0:
        measures[ONE_COMMAND_ROW] = lambda work: BenchRun.of_stopwatch(
            one_command_openvino(ctx, list(source.input_shape), work, vs_benchmark_app_s)
        )
        settings[ONE_COMMAND_ROW] = f"benchmark_app -hint throughput, NNCF int8 IR, batch 1, {vs_benchmark_app_s:.0f} s"
        ratios_to.append(ONE_COMMAND_ROW)
    runs = measure_side_by_side(measures, repeats, best_path.parent / "compare", console)
    shape = "x".join(map(str, source.input_shape))
    print_results(console, f"{source.name} {shape}: {repeats} interleaved runs each", settings, runs, ratios_to)
    return runs


def backend_configs(batch_size: int, cores: int, ipex_runtime: str | None = None) -> dict[str, TrialConfig]:
    """One config per backend x precision, all on one instance using every core, for a fair comparison;
    IPEX ones when a runtime imports it."""

    def config(backend: str, precision: str, runtime: str = "main", **options: Any) -> TrialConfig:
        return TrialConfig(backend, precision, batch_size, "glibc", 1, cores, options, runtime)

    ipex = (
        {}
        if ipex_runtime is None
        else {
            "ipex fp32": config("ipex", "fp32", ipex_runtime, graph="torchscript", memory_format="channels_last"),
            "ipex bf16": config("ipex", "bf16", ipex_runtime, graph="torchscript", memory_format="channels_last"),
            "ipex int8": config("ipex", "int8", ipex_runtime, memory_format="channels_last"),
        }
    )

    plain = config("eager", "fp32", memory_format="contiguous")
    return {
        "eager fp32": plain,
        "eager fp32 iomp": replace(plain, openmp="intel", kmp_affinity="granularity=fine,compact,1,0", kmp_blocktime=1),
        "eager fp32 thp": replace(plain, thp=True),
        "eager bf16": config("eager", "bf16", memory_format="channels_last"),
        "inductor fp32": config("inductor", "fp32", memory_format="channels_last", freezing=True),
        "inductor bf16": config("inductor", "bf16", memory_format="channels_last", freezing=True),
        "onnxruntime fp32": config(
            "onnxruntime", "fp32", execution_mode="sequential", graph_optimization="all", inter_op_threads=1
        ),
        "onnxruntime int8": config(
            "onnxruntime", "int8", execution_mode="sequential", graph_optimization="all", inter_op_threads=1
        ),
        "openvino fp32": config("openvino", "fp32", hint="THROUGHPUT", streams="auto"),
        "openvino bf16": config("openvino", "bf16", hint="THROUGHPUT", streams="auto"),
        "openvino int8": config("openvino", "int8", hint="THROUGHPUT", streams="auto", int8_float="f32"),
        "openvino int8+bf16": config("openvino", "int8", hint="THROUGHPUT", streams="auto", int8_float="bf16"),
        "torchao int8": config("torchao", "int8", scheme="static", memory_format="channels_last"),
        **ipex,
    }


def benchmark_backends(
    model: ModelSource,
    batch_size: int,
    repeats: int,
    measure: MeasureSettings,
    studies_root: Path,
    console: Console,
    only: list[str] | None = None,
) -> dict[str, list[BenchRun]]:
    """Every backend x precision on one model, side by side, against eager fp32."""
    machine = probe_machine()
    weights = (model.weights_sha256 or "random")[:12]
    work = (
        studies_root
        / "benchmarks"
        / f"{model.name.rpartition(':')[2]}-{'x'.join(map(str, model.input_shape))}-b{batch_size}-{weights}"
    )
    try:
        reference = compute_reference(model, work, eval_samples=32, timeout_s=TIMEOUT_S)
    except TrialFailed as exc:
        raise UserError(
            f"the model does not run in FP32 eager mode ({exc.cause}); see {work / 'reference' / 'stderr.log'}"
        ) from None
    if reference.note is not None:  # constant FP32 outputs: the drift column says so, or says nothing
        kind = "note" if reference.note.drift_measurable else "warning: the drift column is blind"
        console.print(f"{kind}: {reference.note.message}", markup=False)
    runtimes = discover_runtimes()
    ctx = TrialContext(machine, reference, measure, studies_root / ".cache", runtimes=runtimes)
    configs = backend_configs(batch_size, machine.physical_cores, next(iter(candidates("ipex", runtimes)), None))
    if only:
        unknown = [name for name in only if name not in configs]
        if unknown:
            raise UserError(f"unknown benchmark config {unknown[0]!r}; choose from {', '.join(configs)}")
        configs = {name: configs[name] for name in ["eager fp32", *only] if name in configs}
    measures = {name: config_measure(config, ctx) for name, config in configs.items()}
    runs = measure_side_by_side(measures, repeats, work / "runs", console)
    shape = "x".join(map(str, model.input_shape))
    print_results(
        console,
        f"{model.name} {shape}, batch {batch_size}, 1 instance x {machine.physical_cores} threads, "
        f"{repeats} interleaved run(s) each",
        {n: c.summary() for n, c in configs.items()},
        runs,
        ["eager fp32"],
    )
    return runs

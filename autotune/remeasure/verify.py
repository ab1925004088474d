"""`autotune verify best.json`: re-measure an exported winner here and say plainly whether it still holds.

Two questions, answered separately: is this the machine and software it was tuned on (the fingerprint),
and is it as fast as recorded (re-measured by the same protocol, judged against the noise)? With
`--through-load`, a third: what does a program get, timing calls through `autotune.load()` in
processes started by the launch script, against the protocol's figure from the same run?
"""

from __future__ import annotations

import statistics
from pathlib import Path

from rich.console import Console

from autotune.common.errors import TrialFailed, UserError
from autotune.machine.fingerprint import fingerprint, fingerprint_differences
from autotune.measure.serving import RELATIVE_TOLERANCE
from autotune.records.best import BestJson
from autotune.records.metrics import TrialMetrics
from autotune.remeasure.context import context_from_best
from autotune.remeasure.through_load import LoadRun, pinning_differences, run_through_load, summary, window_of
from autotune.results.best_json import read_best
from autotune.runner.trials import run_config

MIN_REGRESSION = 0.10  # below this, a difference is not called a regression on a shared machine
TIMEOUT_S = 1800.0
EXIT_REGRESSED = 1
EXIT_NO_VERDICT = 3  # every run was disturbed: nothing to judge


def recorded_throughput(best: BestJson) -> float:
    """What best.json promises: the finalists' interleaved median when there was a round, else the trial's
    (the server scenario: the sustained request rate)."""
    served = best.llm_server or best.server
    measured = served.sustained_rps if served else best.throughput_sps
    recorded = best.objective.revalidated_median or measured
    if recorded is None:
        raise UserError("best.json records no throughput for its winner: nothing to compare with")
    return recorded


def value_of(metrics: TrialMetrics) -> float:
    """What verify compares: throughput, or for the server scenario the sustained request rate."""
    rate = metrics.sustained_rps
    return rate if rate is not None else metrics.throughput_sps


def noise_of(metrics: TrialMetrics) -> float:
    """A run's relative uncertainty: its throughput interval, or the rate search's tolerance."""
    if metrics.sustained_rps is not None:
        return RELATIVE_TOLERANCE
    return metrics.measurement.throughput_ci_rel or 0.0


def judge(recorded: float, runs: list[TrialMetrics], recorded_ci: float | None) -> tuple[str, float | None, float]:
    """'matches', 'REGRESSED', 'faster' or 'no verdict', the median here over the clean runs (noisy runs
    are left out, as in the finalist round and bench), and the relative margin used."""
    clean = [m for m in runs if m.valid]
    if not clean:
        return "no verdict", None, MIN_REGRESSION
    here = statistics.median(value_of(m) for m in clean)
    cis = [noise_of(m) for m in clean]
    margin = max(MIN_REGRESSION, 2 * ((recorded_ci or 0.0) + max(cis)))
    if here < recorded * (1 - margin):
        return "REGRESSED", here, margin
    if here > recorded * (1 + margin):
        return "faster", here, margin
    return "matches", here, margin


def verify(best_path: Path, repeats: int, console: Console, through_load: bool = False) -> int:
    """Re-measure the winner `repeats` times; with `through_load`, each protocol run is followed by a run
    through autotune.load() with the same window. Returns the exit code (see the EXIT_ constants)."""
    best = read_best(best_path)
    if best.objective.name not in (None, "throughput", "server"):
        raise UserError(
            f"{best_path} was tuned for {best.objective.name}; verify compares throughput or a sustained rate"
        )
    if through_load and (best.server or best.llm_server):
        raise UserError("--through-load times closed-loop calls; a server-scenario winner is verified without it")
    if through_load and not (best.launch and best.launch.pin_prefixes):
        raise UserError(f"{best_path} names no launch (pin_prefixes): export it again with 'autotune export'")
    ctx = context_from_best(best)
    tuned_on = best.fingerprint.to_json() if best.fingerprint else None
    differences = fingerprint_differences(tuned_on, fingerprint(ctx.machine, ctx.runtimes))
    if differences:
        console.print("this is not the machine or software it was tuned on:", markup=False)
        for line in differences:
            console.print(f"  {line}", markup=False)
    else:
        console.print("same hardware and software as when it was tuned", markup=False)
    config = best.config
    runs: list[TrialMetrics] = []
    loads: list[LoadRun] = []
    for i in range(repeats):
        try:
            # the server scenario: each run on arrival streams of its own, not the search's
            runs.append(run_config(config, ctx, best_path.parent / "verify" / str(i), TIMEOUT_S, server_round=i + 1)[0])
        except TrialFailed as exc:
            raise UserError(f"the tuned config does not run here: {exc.cause}") from None
        unit = "requests/s sustained" if runs[-1].sustained_rps is not None else runs[-1].unit
        console.print(f"run {i + 1}/{repeats}: {value_of(runs[-1]):.2f} {unit}{runs[-1].noisy_note()}", markup=False)
        if through_load:
            loads.append(_through_load(best, best_path, ctx.measure.warmup_min_s, runs[-1], i))
            console.print(f"run {i + 1}/{repeats} through autotune.load(): {loads[-1].describe()}", markup=False)
            for line in pinning_differences(runs[-1], loads[-1]):
                console.print(f"  pinned differently: {line}", markup=False)
    recorded = recorded_throughput(best)
    recorded_ci = RELATIVE_TOLERANCE if best.server or best.llm_server else best.throughput_ci_rel
    verdict, here, margin = judge(recorded, runs, recorded_ci)
    clean = sum(1 for m in runs if m.valid)
    if here is None:
        console.print(f"no verdict: all {repeats} runs were flagged noisy; rerun on a quieter machine", markup=False)
        if loads:
            console.print(summary(loads, runs), markup=False)
        return EXIT_NO_VERDICT
    change = here / recorded - 1
    unit = "requests/s sustained" if runs[0].sustained_rps is not None else runs[0].unit
    console.print(
        f"{verdict}: {here:.2f} {unit} here (median of the {clean} clean runs of {repeats}) vs {recorded:.2f} "
        f"recorded ({change:+.1%}; differences within ±{margin:.0%} are noise)"
        + (" — the hardware or software differs (above)" if differences and verdict != "matches" else ""),
        markup=False,
    )
    if loads:
        console.print(summary(loads, runs), markup=False)
    return EXIT_REGRESSED if verdict == "REGRESSED" else 0


def _through_load(best: BestJson, best_path: Path, min_warmup_s: float, protocol: TrialMetrics, i: int) -> LoadRun:
    window_s, warmup_s = window_of(protocol, min_warmup_s)
    try:
        return run_through_load(
            best, best_path, best_path.parent / "verify" / f"load-{i}", window_s, warmup_s, TIMEOUT_S
        )
    except TrialFailed as exc:
        detail = exc.stderr_tail.strip().splitlines()[-1] if exc.stderr_tail.strip() else ""
        raise UserError(
            f"through autotune.load() the tuned config does not run here: {exc.cause}"
            + (f" ({detail})" if detail else "")
        ) from None

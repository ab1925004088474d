"""Progress of a search: one plain line per finished trial (no control characters, so logs and CI stay
readable), and on a terminal a live panel under them: budget used and left, trials by state, the
running trial's config, the best so far with its speedup over the baseline."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import optuna
from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from autotune.common.durations import format_duration
from autotune.records.attributes import TrialAttrs
from autotune.results.selection import clean_trials, metrics_of, primary_unit


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _metric_text(trial: optuna.trial.FrozenTrial) -> str:
    if trial.state == optuna.trial.TrialState.COMPLETE:
        metrics = metrics_of(trial)
        p50, drift = metrics.latency_ms.p50, metrics.drift
        if drift is None:
            return ""
        # A rate always, with its interval or, where the calls were too few for one, saying so (a language
        # model's call with 8 sequences takes about 20 s: 2 or 3 in a trial, and no median).
        ci = metrics.measurement.throughput_ci_rel
        how_sure = f" ±{ci:.1%}" if ci is not None else " (too few calls for an interval)"
        rate = f"{metrics.throughput_sps:8.1f} {metrics.unit}{how_sure}"
        generation, server, served = metrics.generation, metrics.server, metrics.llm_server
        if served is not None:  # a language model's server: the sustained rate, its quantiles, the saturated rate
            load = served.at_sustained.load if served.at_sustained else None
            q = served.bounds.quantile
            ttft = getattr(load.ttft_ms, f"p{q}") if load else None
            tpot = getattr(load.tpot_ms, f"p{q}") if load else None
            text = (
                f"{served.sustained_rps:8.2f} requests/s at TTFT p{q} {_ms(ttft)} TPOT p{q} {_ms(tpot)} "
                f"({served.bounds.describe()}, {len(served.probes)} probes, {served.concurrency} at once; "
                f"saturated {served.saturated_rps:.2f} requests/s; offline {metrics.throughput_sps:.1f} "
                f"{metrics.unit}){f'  KLD {drift.kl_divergence:.2e}' if drift.kl_divergence is not None else ''}"
            )
        elif server is not None:  # the sustained rate first, the closed-loop bound it was searched under after
            at = server.at_sustained
            text = (
                f"{server.sustained_rps:8.1f} requests/s at p99 {_ms(at.latency_ms.p99 if at else None)} "
                f"(<= {server.slo_ms:g} ms, {len(server.probes)} probes; closed loop {metrics.throughput_sps:.1f} "
                f"{metrics.unit})  drift {drift.relative_l2:.2e}"
            )
        elif generation is not None:
            ttft, tpot = generation.ttft_ms.p50, generation.tpot_ms.p50
            ppl, kld = drift.perplexity_increase, drift.kl_divergence
            text = (
                f"{rate}  TTFT p50 {_ms(ttft)}  TPOT p50 {_ms(tpot)}"
                f"{f'  KLD {kld:.2e}' if kld is not None else ''}  same top {drift.top1_agreement:.1%}"
                f"{f'  ppl {ppl:+.1%}' if ppl is not None and ppl == ppl else ''}  L2 {drift.relative_l2:.2e}"
            )
        else:
            text = (
                f"{rate}  p50 {_ms(p50)}  drift {drift.relative_l2:.2e}"
                f"{f'  acc {drift.accuracy:.3f}' if drift.accuracy is not None else ''}"
            )
        if not metrics.measurement.pinned:
            text += "  UNPINNED"
        flags = metrics.noise_flags
        return f"{text}  NOISY, not a winner: {'; '.join(flags)}" if not metrics.valid and flags else text
    if trial.state == optuna.trial.TrialState.PRUNED:
        return TrialAttrs.of(trial).prune_reason or "pruned"
    if trial.state == optuna.trial.TrialState.FAIL:
        return TrialAttrs.of(trial).fail_cause or "failed"
    return ""


def best_so_far(
    study: optuna.study.Study, baseline_sps: Callable[[], float | None]
) -> tuple[optuna.trial.FrozenTrial | None, float | None, float | None]:
    """The best clean trial, its samples/s, and its speedup over the baseline (None where unknown)."""
    clean = clean_trials(study)
    if not clean:
        return None, None, None
    metrics = metrics_of(clean[0])
    sps = metrics.sustained_rps if metrics.sustained_rps is not None else metrics.throughput_sps
    baseline = baseline_sps() if sps else None
    return clean[0], sps, sps / baseline if sps and baseline else None


class ProgressPrinter:
    """Optuna callback: prints each trial as it ends, with the best so far and the budget used."""

    def __init__(
        self, console: Console, started: float, budget_s: float, baseline_sps: Callable[[], float | None]
    ) -> None:
        self.console = console
        self.started = started
        self.budget_s = budget_s
        self.baseline_sps = baseline_sps

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        used = time.monotonic() - self.started
        summary = TrialAttrs.of(trial).config_summary or ""
        line = f"trial {trial.number:>3} {trial.state.name:<8} {summary:<52} {_metric_text(trial)}"
        best = ""
        best_trial, sps, speedup = best_so_far(study, self.baseline_sps)
        if best_trial is not None and sps:
            unit = {"tokens/s": "tok/s", "requests/s": "req/s"}.get(primary_unit(study), "sps")
            best = f" | best #{best_trial.number} {sps:.1f} {unit}" + (f" = {speedup:.2f}x baseline" if speedup else "")
        self.console.print(
            f"{line}{best} | {format_duration(used)}/{format_duration(self.budget_s)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


class LiveStatus:
    """The live panel (rendered by rich.live.Live on a terminal only). Also an Optuna callback: the study
    is read when a trial ends, never on a refresh, so the panel adds no load while a trial is timed."""

    def __init__(
        self, study: optuna.study.Study, started: float, budget_s: float, baseline_sps: Callable[[], float | None]
    ) -> None:
        self.started = started
        self.budget_s = budget_s
        self.baseline_sps = baseline_sps
        self.running: str | None = None  # "trial 12: <config>", set by the objective
        self.counts: Counter = Counter()
        self.best = "best so far: -"
        self(study, None)

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial | None) -> None:
        self.counts = Counter(t.state.name for t in study.get_trials(deepcopy=False))
        self.running = None
        best, sps, speedup = best_so_far(study, self.baseline_sps)
        if best is not None:
            times = f" = {speedup:.2f}x the baseline" if speedup else ""
            summary = TrialAttrs.of(best).config_summary or ""
            self.best = f"best so far: trial {best.number} {summary}: {sps or 0:.1f} {primary_unit(study)}{times}"

    def lines(self) -> list[str]:
        used = time.monotonic() - self.started
        return [
            f"budget {format_duration(used)} used, {format_duration(max(0.0, self.budget_s - used))} left",
            f"trials: {self.counts['COMPLETE']} complete, {self.counts['PRUNED']} pruned, {self.counts['FAIL']} failed",
            f"running: {self.running or '-'}",
            self.best,
        ]

    def __rich__(self) -> Panel:
        return Panel(Group(*(Text(line) for line in self.lines())), title="autotune search", expand=False)

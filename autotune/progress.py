"""One line per finished trial, plain text (no control characters) so logs and CI stay readable."""

from __future__ import annotations

import time
from typing import Callable

import optuna
from rich.console import Console

from autotune.durations import format_duration
from autotune.pruners import clean_trials


def _metric_text(trial: optuna.trial.FrozenTrial) -> str:
    attrs = trial.user_attrs
    if trial.state == optuna.trial.TrialState.COMPLETE:
        lat = attrs.get("latency_ms", {})
        p50 = lat.get("p50")
        drift = (attrs.get("drift") or {}).get("relative_l2")
        if p50 is None or drift is None:
            return ""
        ci = (attrs.get("measurement") or {}).get("throughput_ci_rel")
        accuracy = (attrs.get("drift") or {}).get("accuracy")
        text = (f"{attrs.get('throughput_sps', 0):8.1f} samples/s{f' ±{ci:.1%}' if ci is not None else ''}  p50 {p50:.1f} ms  drift {drift:.2e}"
                f"{f'  acc {accuracy:.3f}' if accuracy is not None else ''}")
        flags = (attrs.get("measurement") or {}).get("noise_flags")
        return f"{text}  NOISY, not a winner: {'; '.join(flags)}" if attrs.get("valid") is False and flags else text
    if trial.state == optuna.trial.TrialState.PRUNED:
        return attrs.get("prune_reason", "pruned")
    if trial.state == optuna.trial.TrialState.FAIL:
        return attrs.get("fail_cause", "failed")
    return ""


class ProgressPrinter:
    """Optuna callback: prints each trial as it ends, with the best so far and the budget used."""

    def __init__(self, console: Console, started: float, budget_s: float, baseline_sps: Callable[[], float | None]) -> None:
        self.console = console
        self.started = started
        self.budget_s = budget_s
        self.baseline_sps = baseline_sps

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        used = time.monotonic() - self.started
        summary = trial.user_attrs.get("config_summary", "")
        line = f"trial {trial.number:>3} {trial.state.name:<8} {summary:<52} {_metric_text(trial)}"
        best = ""
        clean = clean_trials(study)
        if clean:
            best_trial = clean[0]
            baseline = self.baseline_sps()
            sps = best_trial.user_attrs.get("throughput_sps")
            if sps and baseline:
                best = f" | best #{best_trial.number} {sps:.1f} sps = {sps / baseline:.2f}x baseline"
            elif sps:
                best = f" | best #{best_trial.number} {sps:.1f} sps"
        self.console.print(f"{line}{best} | {format_duration(used)}/{format_duration(self.budget_s)}", markup=False, highlight=False, soft_wrap=True)

"""Speed pruning: a trial clearly slower than the best clean one is stopped before its timed window.

Two checks, both asked of the speed pruner (tuning/pruners.py): the speed gate watches the drift
evaluation and warm-up at the ready barrier, and the screening, a short timed run, is compared at the
screened barrier. A stopped trial reports its pace as its first-rung value, so the sampler learns from it.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune.measure.speed_gate import GateVerdict, SpeedGate
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.config import TrialConfig
from autotune.records.metrics import Screening
from autotune.results.selection import workload_of
from autotune.tuning.pruners import SpeedPruner

# The objectives whose screening and gate are compared as throughput; the others as latency.
THROUGHPUT_OBJECTIVES = ("throughput", "server")


def speed_gate_for(trial: optuna.trial.Trial, config: TrialConfig, task: str) -> SpeedGate | None:
    """The pace this trial's drift evaluation and warm-up must keep (none for the baseline, which is never
    pruned, a generation study, whose drift is judged on generated text, or without speed pruning)."""
    speed = getattr(trial.study.pruner, "wrapped", None)
    if (
        not isinstance(speed, SpeedPruner)
        or task == "generate"
        or TrialAttrs.of(trial).baseline
        or len(trial.study.directions) > 1
    ):
        return None
    gate = speed.drift_gate(trial.study, config.batch_size, config.instances)
    if gate is not None:
        trial.set_user_attr(Attr.SPEED_GATE, gate.to_json())
    return gate


def first_too_slow(payloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """At the ready barrier: the lowest-numbered instance's gate verdict, if any instance was stopped (every
    instance's warm-up is watched, and the barrier waits for all of them)."""
    return next((p["too_slow"] for p in payloads if p.get("too_slow")), None)


def stop_too_slow(
    trial: optuna.trial.Trial, config: TrialConfig, objective: str, payload: dict[str, Any] | None
) -> None:
    """At the ready barrier: instance 0's drift evaluation or an instance's warm-up fell below the speed gate's pace
    (the lowest-numbered instance's verdict, where several did). Its pace is
    reported as the trial's first-rung value (as screening's would be), so the sampler learns from it."""
    if payload is None:
        return
    verdict = GateVerdict.from_json(payload)
    trial.set_user_attr(Attr.TOO_SLOW, verdict.to_json())
    if objective in THROUGHPUT_OBJECTIVES:
        trial.report(verdict.samples_per_s * config.instances, step=0)
    elif verdict.samples_per_s > 0:  # latency: ms per call
        trial.report(config.batch_size * 1e3 / verdict.samples_per_s, step=0)
    trial.set_user_attr(Attr.PRUNE_REASON, verdict.reason())
    raise optuna.TrialPruned(verdict.reason())


def judge_screening(trial: optuna.trial.Trial, screening: Screening, objective: str, task: str) -> None:
    """At the screened barrier: the speed pruner compares the screening with the best clean trial."""
    trial.set_user_attr(Attr.SCREENING, screening.to_json())
    # The server scenario's screening is closed loop: its throughput bounds the sustainable rate from above.
    value = screening.throughput_sps if objective in THROUGHPUT_OBJECTIVES else screening.p50_ms
    trial.report(value, step=0)
    if not trial.should_prune():
        return
    reason = _screening_prune_reason(trial, value, screening.ci_rel, objective, task)
    trial.set_user_attr(Attr.PRUNE_REASON, reason)
    raise optuna.TrialPruned(reason)


def _screening_prune_reason(
    trial: optuna.trial.Trial, value: float, ci_rel: float | None, objective: str, task: str
) -> str:
    """Why a screening was pruned, naming the best clean trial it lost to (of the same total sequences, for
    generation) and the margin with its noise."""
    study = trial.study
    speed = getattr(study.pruner, "wrapped", None)
    total = workload_of(study, trial)
    verdict = speed.verdict(study, value, ci_rel, total=total) if isinstance(speed, SpeedPruner) else None
    counted = "tokens/s" if task == "generate" else "samples/s"  # generated tokens, for a language model
    unit = {"throughput": counted, "server": f"{counted} (closed loop; best: requests/s sustained)"}.get(
        objective, "ms"
    )
    if not verdict:
        return f"screening {value:.3g} {unit}: pruned"
    same = f" at {total} sequences in all" if total is not None else ""
    return (
        f"screening {value:.3g} {unit} is clearly worse than the best clean trial{same} "
        f"#{verdict['best_trial']} ({verdict['best_value']:.3g} {unit}, margin "
        f"{verdict['margin']:.0%} with its noise)"
    )

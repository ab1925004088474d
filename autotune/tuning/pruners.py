"""Pruning policies, behind Optuna's pruner interface."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.pruners import BasePruner

from autotune.measure.drift import DriftCriterion
from autotune.measure.speed_gate import SpeedGate
from autotune.records.attributes import TrialAttrs
from autotune.results.selection import (
    clean_trials,
    drift_of,
    maximizes,
    primary_value,
    relative_noise,
    workload_of,
)


class DriftPruner(BasePruner):
    """Prune a trial whose outputs drift from the FP32 reference beyond the user's criterion.

    The worker reports drift (user attribute `drift`) before any timing starts, and a trial whose
    numerics were already measured gets that record before it launches, so a pruned trial costs its
    preparation at most. Another pruner (e.g. one on speed) can be wrapped and is asked next.
    """

    def __init__(self, criterion: DriftCriterion, wrapped: BasePruner | None = None) -> None:
        self.criterion = criterion
        self.wrapped = wrapped

    def drift_exceeded(self, trial: optuna.trial.FrozenTrial) -> bool:
        return self.criterion.exceeded(drift_of(trial))

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if self.drift_exceeded(trial):
            return True
        return self.wrapped.prune(study, trial) if self.wrapped is not None else False


# The speed gate on drift evaluation and warm-up (measure/speed_gate.py): its floor's share of the widest screening bar,
# and how long an evaluation runs before its pace is judged (its first calls may still carry one-time costs).
GATE_SHARE = 0.5
GATE_AFTER_S = 10.0


def best_clean(study: optuna.study.Study, total: int | None = None) -> optuna.trial.FrozenTrial | None:
    """The bar's trial: the best COMPLETE trial no noise check flagged, if any (`total`: among a generation
    study's trials of that many sequences in all, the same work)."""
    clean = clean_trials(study, total)
    return clean[0] if clean else None


class SpeedPruner(BasePruner):
    """Prune a trial whose screening measurement (intermediate value at step 0) is clearly worse than
    the best clean trial so far: worse by more than `min_margin`, and worse by more than the two
    measurements' noise allows, each widened by `noise_factor` times its relative confidence half-width
    as a factor (the screening's upper end, value x (1 + k x its half-width), below the best's lower end,
    best / (1 + k x its half-width)). As factors, a noisy bar only widens the gap that prunes: added into
    one relative margin, a bar whose interval was ±19% and a screening too short for one (±33%) asked
    for a shortfall of more than 100%, so a configuration 60 times slower than the best completed.

    The screening value is what the study reports before the full window: samples/s when maximizing,
    median ms per call when minimizing. The eager baseline is never pruned (speedups need it).
    """

    def __init__(self, min_margin: float = 0.15, noise_factor: float = 2.0, screening_step: int = 0) -> None:
        self.min_margin = min_margin
        self.noise_factor = noise_factor
        self.screening_step = screening_step
        # Too few screening calls for a confidence interval (slow configs): a 3x gap before the best's noise.
        self.unknown_noise = 1.0

    def gap(self, screening_ci_rel: float | None, best_ci_rel: float) -> float:
        """The factor by which a screening must fall short of the best to be pruned (at least 1 / (1 -
        min_margin)): the two measurements' widened intervals, multiplied."""
        screening = screening_ci_rel if screening_ci_rel is not None else self.unknown_noise
        noise = (1 + self.noise_factor * screening) * (1 + self.noise_factor * best_ci_rel)
        return max(1 / (1 - self.min_margin), noise)

    def verdict(
        self,
        study: optuna.study.Study,
        value: float | None,
        screening_ci_rel: float | None,
        baseline: bool = False,
        total: int | None = None,
    ) -> dict[str, Any] | None:
        """The comparison behind the decision (None when there is nothing to compare yet); `margin` is the
        relative shortfall that prunes (1 - 1/gap). `total`: a generation trial's sequences in all, compared
        with the best of the same total only (more sequences make more tokens/s: another workload)."""
        best = None if value is None or baseline else best_clean(study, total)
        if value is None or best is None:
            return None
        best_value = primary_value(best)
        gap = self.gap(screening_ci_rel, relative_noise(best))
        worse = value * gap < best_value if maximizes(study) else value > best_value * gap
        return {
            "value": value,
            "best_trial": best.number,
            "best_value": best_value,
            "margin": 1 - 1 / gap,
            "prune": worse,
        }

    def drift_gate(self, study: optuna.study.Study, batch_size: int, instances: int) -> SpeedGate | None:
        """The pace a trial's drift evaluation and warm-up must keep: half the widest bar screening could set
        (the bar of a screening too short for an interval), per instance. Slower than that, screening would
        prune it with room to spare, so they stop after GATE_AFTER_S instead of running to their end."""
        best = best_clean(study)
        if best is None:
            return None
        best_value = primary_value(best)
        widest = self.gap(None, relative_noise(best))
        if maximizes(study):  # samples/s of the whole trial (the server scenario: its closed-loop screening)
            bar = best_value / widest
            floor = bar * GATE_SHARE / instances
            basis = f"half of {bar:.3g} samples/s, the widest screening bar against #{best.number}'s {best_value:.3g}"
        else:  # ms per call of one instance
            bar = best_value * widest
            floor = batch_size * 1e3 / (bar / GATE_SHARE)
            basis = f"calls over twice {bar:.3g} ms, the widest screening bar against #{best.number}'s {best_value:.3g}"
        if floor <= 0:
            return None
        return SpeedGate(min_samples_per_s=floor, after_s=GATE_AFTER_S, basis=basis)

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        attrs = TrialAttrs.of(trial)
        verdict = self.verdict(
            study,
            trial.intermediate_values.get(self.screening_step),
            attrs.screening.ci_rel if attrs.screening else None,
            attrs.baseline,
            workload_of(study, trial),
        )
        return bool(verdict and verdict["prune"])

"""Pruning policies, behind Optuna's pruner interface."""

from __future__ import annotations

import math

import optuna
from optuna.pruners import BasePruner


class DriftPruner(BasePruner):
    """Prune a trial whose outputs drift from the FP32 reference more than the threshold.

    The worker reports drift (user attribute `drift`) before any timing starts, so a pruned trial
    costs its preparation only. Another pruner (e.g. one on speed) can be wrapped and is asked next.
    """

    def __init__(self, max_drift: float, metric: str = "relative_l2", wrapped: BasePruner | None = None) -> None:
        self.max_drift = max_drift
        self.metric = metric
        self.wrapped = wrapped

    def drift_exceeded(self, trial: optuna.trial.FrozenTrial) -> bool:
        drift = trial.user_attrs.get("drift")
        if not drift:
            return False
        value = drift.get(self.metric)
        return value is None or not math.isfinite(value) or value > self.max_drift

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if self.drift_exceeded(trial):
            return True
        return self.wrapped.prune(study, trial) if self.wrapped is not None else False

"""A trial's drift from the FP32 reference, judged before anything is timed.

Drift depends on numerics, not on threads or instances, so a trial whose numerics an earlier trial already
measured reuses that drift and, beyond the bound, is pruned before it is launched; a new measurement is
judged at the ready barrier, before the timed window. Either way a config that drifts too far costs no
timing.
"""

from __future__ import annotations

import optuna

from autotune.measure.drift import Drift, DriftCriterion
from autotune.records.attributes import Attr, TrialAttrs


def drift_sequences(task: str, batch_size: int) -> int | None:
    """The sequences a language model's drift holds for (it is measured at the timed ones); None for a
    classifier, whose drift holds at any batch."""
    return batch_size if task == "generate" else None


def drift_prunes(trial: optuna.trial.Trial, drift: Drift, criterion: DriftCriterion) -> bool:
    """Optuna's pruner decides (DriftPruner); a multi-objective study cannot ask it, so the same
    criterion is applied directly there."""
    if len(trial.study.directions) > 1:
        return criterion.exceeded(drift)
    return trial.should_prune()


def reuse_known_drift(
    trial: optuna.trial.Trial, criterion: DriftCriterion, reference_digest: str, sequences: int | None
) -> Drift | None:
    """The drift an earlier trial of the same numerics measured, recorded on this trial; beyond the bound,
    the trial is pruned before anything is launched."""
    known = same_numerics_drift(trial.study, TrialAttrs.of(trial).numerics_key, reference_digest, sequences)
    if known is not None:
        trial.set_user_attr(Attr.DRIFT, known.to_json())
        if drift_prunes(trial, known, criterion):
            verdict = criterion.verdict(known)
            reason = f"{verdict}, as measured by trial {known.reused_from} (same numerics): not launched"
            trial.set_user_attr(Attr.PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)
    return known


def judge_measured_drift(trial: optuna.trial.Trial, drift: Drift | None, criterion: DriftCriterion) -> None:
    """At the ready barrier: the drift instance 0 measured (None when reused: judged before launch)."""
    if drift is None:
        return
    trial.set_user_attr(Attr.DRIFT, drift.to_json())
    if drift_prunes(trial, drift, criterion):
        reason = criterion.verdict(drift)
        trial.set_user_attr(Attr.PRUNE_REASON, reason)
        raise optuna.TrialPruned(reason)


def same_numerics_drift(
    study: optuna.study.Study, numerics_key: str | None, reference_digest: str, sequences: int | None = None
) -> Drift | None:
    """Drift depends on numerics (backend, precision, options), not on threads, allocator or instances:
    the drift an earlier trial measured for the same numerics against the same reference (a resumed study
    whose reference was computed again, e.g. in a newer format, measures again), marked as reused, or None.
    `sequences`: a language model's drift, measured at its timed sequences, is reused at the same only
    (inductor da8w8 on a Xeon with AMX: garbage decode steps at 1 sequence, 0.045 at 8)."""
    for earlier in study.get_trials(deepcopy=False):
        attrs = TrialAttrs.of(earlier)
        if attrs.numerics_key != numerics_key or attrs.drift_reference != reference_digest:
            continue
        if sequences is not None and (attrs.config.batch_size if attrs.config else None) != sequences:
            continue
        if attrs.drift is not None and attrs.drift.reused_from is None:
            return attrs.drift.reused_by_another(earlier.number)
    return None

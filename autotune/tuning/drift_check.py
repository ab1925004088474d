"""A trial's drift from the FP32 reference, judged before anything is timed.

Drift depends on numerics, not on threads or instances, so a trial whose numerics an earlier trial already
measured reuses that drift and, beyond the bound, is pruned before it is launched; a new measurement is
judged at the ready barrier, before the timed window. Either way a config that drifts too far costs no
timing.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune.measure.drift import Drift, DriftCriterion
from autotune.records.attributes import Attr
from autotune.results.selection import drift_of


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
    known = same_numerics_drift(trial.study, trial.user_attrs[Attr.NUMERICS_KEY], reference_digest, sequences)
    if known is not None:
        trial.set_user_attr(Attr.DRIFT, known.to_json())
        if drift_prunes(trial, known, criterion):
            verdict = criterion.verdict(known)
            reason = f"{verdict}, as measured by trial {known.reused_from} (same numerics): not launched"
            trial.set_user_attr(Attr.PRUNE_REASON, reason)
            raise optuna.TrialPruned(reason)
    return known


def judge_measured_drift(trial: optuna.trial.Trial, payload: dict[str, Any] | None, criterion: DriftCriterion) -> None:
    """At the ready barrier: the drift instance 0 measured (None when reused: judged before launch)."""
    if payload is None:
        return
    drift = Drift.from_json(payload)
    trial.set_user_attr(Attr.DRIFT, drift.to_json())
    if drift_prunes(trial, drift, criterion):
        reason = criterion.verdict(drift)
        trial.set_user_attr(Attr.PRUNE_REASON, reason)
        raise optuna.TrialPruned(reason)


def same_numerics_drift(
    study: optuna.study.Study, numerics_key: str, reference_digest: str, sequences: int | None = None
) -> Drift | None:
    """Drift depends on numerics (backend, precision, options), not on threads, allocator or instances:
    the drift an earlier trial measured for the same numerics against the same reference (a resumed study
    whose reference was computed again, e.g. in a newer format, measures again), marked as reused, or None.
    `sequences`: a language model's drift, measured at its timed sequences, is reused at the same only
    (inductor da8w8 on a Xeon with AMX: garbage decode steps at 1 sequence, 0.045 at 8)."""
    for earlier in study.get_trials(deepcopy=False):
        if earlier.user_attrs.get(Attr.NUMERICS_KEY) != numerics_key:
            continue
        if sequences is not None and (earlier.user_attrs.get(Attr.CONFIG) or {}).get("batch_size") != sequences:
            continue
        if earlier.user_attrs.get(Attr.DRIFT_REFERENCE) != reference_digest:
            continue
        drift = drift_of(earlier)
        if drift is not None and drift.reused_from is None:
            return drift.reused_by_another(earlier.number)
    return None

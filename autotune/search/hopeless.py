"""Families the sampler should not launch again: a backend x precision whose every launched trial lost
by far.

TPE learns from a pruned trial's first-rung value, but it still proposes each family now and then, with
new layouts. For a family that lost by a wide margin, no layout closes the gap, and a new layout may
cost more than the first try: a 60-minute vit_b_16 search on an AVX2-only EPYC, after inductor bf16,
eager bf16 and IPEX bf16 were stopped by the speed gate at 6-8% of the best trial's throughput
(emulated bf16), and torchao int8 was pruned on drift at five times the bound, sampled torchao int8,
IPEX bf16 and inductor bf16 again: 665 s of its 3600, 475 s of it one inductor bf16 compile that never
finished. A sampled
trial of such a family is pruned unlaunched, with the evidence (as a known precision fallback is);
enqueued trials (the coverage round, layout rounds, priors) always run.
"""

from __future__ import annotations

import math

import optuna

from autotune.measure.drift import Drift, DriftCriterion
from autotune.measure.speed_gate import GateVerdict
from autotune.results.selection import clean_trials, primary_value

# Lost by far: stopped by the speed gate at under this share of the best clean trial's throughput (or,
# minimising latency, at calls over 1 / this share times its median), or pruned on drift beyond this
# many times the bound. The gate's own floor (half its widest screening bar) only says "slower".
FAR_SLOWER = 0.25
FAR_BEYOND_DRIFT_BOUND = 2.0

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def lost_by_far(
    trial: optuna.trial.FrozenTrial, criterion: DriftCriterion, objective: str, best: float | None
) -> str | None:
    """How a launched trial lost by far, or None if it did not (completed, failed, or lost narrowly).
    `best`: the best clean trial's value (samples/s, or ms for the latency objective), if any."""
    if trial.state != optuna.trial.TrialState.PRUNED:
        return None
    too_slow = trial.user_attrs.get("too_slow")
    if too_slow:
        if best is None or best <= 0 or objective not in ("throughput", "latency"):
            return None
        verdict = GateVerdict.from_json(too_slow)
        config = trial.user_attrs.get("config") or {}
        if objective == "throughput":
            pace = verdict.samples_per_s * config.get("instances", 1)
            far = pace < FAR_SLOWER * best
            seen = f"{pace:.3g} samples/s in its drift evaluation against the best's {best:.3g}"
        else:
            call_ms = (
                config.get("batch_size", 1) * 1e3 / verdict.samples_per_s if verdict.samples_per_s > 0 else math.inf
            )
            far = call_ms * FAR_SLOWER > best
            seen = f"{call_ms:.3g} ms a call in its drift evaluation against the best's {best:.3g}"
        return f"#{trial.number} ran {seen}" if far else None
    stored = trial.user_attrs.get("drift")
    if not stored or not str(trial.user_attrs.get("prune_reason", "")).startswith("drift"):
        return None
    drop = criterion.drop(Drift.from_json(stored))
    if drop is not None and drop > FAR_BEYOND_DRIFT_BOUND * criterion.max_drop:
        return f"#{trial.number} drifted {drop:.3g} {criterion.metric} against the bound {criterion.max_drop:.3g}"
    return None


def hopeless_family(
    study: optuna.study.Study, backend: str, precision: str, criterion: DriftCriterion, objective: str, before: int
) -> str | None:
    """Why the family should not be launched again, or None: every one of its launched trials numbered
    below `before` (at least one) lost by far. A trial pruned unlaunched says nothing new and is left out."""
    launched = [
        t
        for t in study.get_trials(deepcopy=False, states=FINISHED)
        if t.number < before
        and "budget" in t.user_attrs  # launched: the orchestrator split its time
        and (t.user_attrs.get("config") or {}).get("backend") == backend
        and (t.user_attrs.get("config") or {}).get("precision") == precision
    ]
    if not launched:
        return None
    clean = clean_trials(study)
    best = primary_value(clean[0]) if clean else None
    losses = [lost_by_far(t, criterion, objective, best) for t in launched]
    if None in losses:
        return None
    return (
        f"not launched: every {backend} {precision} trial so far lost by far ({'; '.join(str(x) for x in losses)}); "
        "no layout closes such a gap"
    )

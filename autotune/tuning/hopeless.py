"""Families the sampler should not launch again: a backend x precision whose every launched trial lost
by far.

TPE learns from a pruned trial's first-rung value, but it still proposes each family now and then, with
new layouts. For a family that lost by a wide margin, no layout closes the gap, and a new layout may
cost more than the first try: a 60-minute vit_b_16 search on an AVX2-only EPYC, after inductor bf16,
eager bf16 and IPEX bf16 were stopped by the speed gate at 6-8% of the best trial's throughput
(emulated bf16), sampled IPEX bf16 and inductor bf16 again: 543 s of its 3600, 475 s of it one
inductor bf16 compile that never finished. Such a proposal is pruned unlaunched, with the evidence (as
a known precision fallback is); what the search enqueues itself (the coverage round, layout rounds,
priors: trials that carry their `order`) always runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from autotune.backends.generation import precision_variant
from autotune.common.json_record import JsonObject
from autotune.measure.drift import DriftCriterion
from autotune.measure.speed_gate import GateVerdict
from autotune.records.attributes import TrialAttrs
from autotune.records.config import TrialConfig
from autotune.results.selection import clean_trials, primary_value

# Lost by far: stopped by the speed gate at under this share of the best clean trial's work per core
# (samples/s over the cores each used: a one-thread trial is not judged against a trial on every core),
# or pruned on drift beyond this many times the bound by the same numerics (the proposal's fallback key:
# the numerics without the options that only schedule the work; a static int8 scheme's drift says nothing
# of a dynamic one's) against the same reference. The gate's own floor (half its widest screening bar)
# only says "slower".
FAR_SLOWER = 0.25
FAR_BEYOND_DRIFT_BOUND = 2.0

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


@dataclass(frozen=True)
class Proposal:
    """What the sampler proposed, as far as the rule reads it: its family and its numerics."""

    backend: str
    precision: str  # as its kernels see it (backends/generation.precision_variant): `woq_int4/bf16`
    fallback_key: str  # the numerics without the scheduling options (search.study's _fallback_key)
    drift_reference: str  # the reference digest its drift would be measured against
    # A language model's drift is measured at its timed sequences (the graphs the timed calls run), so a
    # drift at other sequences says nothing of it: inductor da8w8 on a Xeon with AMX computed garbage decode
    # steps at 1 sequence and drifted 0.045 at 8. None: a classifier, whose drift holds at any batch.
    sequences: int | None = None


def precision_variant_of(config: TrialConfig | JsonObject) -> str:
    """A recorded trial config's precision as its kernels see it (backends/generation.precision_variant)."""
    recorded = TrialConfig.from_json(config)
    return precision_variant(recorded.precision, recorded.options)


def config_of(trial: optuna.trial.FrozenTrial) -> TrialConfig | None:
    """A trial's recorded configuration (None: pruned before it had one)."""
    return TrialAttrs.of(trial).config


def samples_per_core_s(config: TrialConfig, objective: str, value: float) -> float | None:
    """A clean trial's work per core: samples/s (its value, or its batch over its median ms per call for the
    latency objective) over the cores its instances used; None for the other objectives."""
    if objective == "throughput":
        return value / config.total_cores
    if objective == "latency" and value > 0:
        return config.batch_size * 1e3 / value / config.threads_per_instance
    return None


def gate_verdict(trial: optuna.trial.FrozenTrial) -> GateVerdict | None:
    """Why the speed gate stopped the trial (its pace, stage and instance), or None if it did not."""
    return TrialAttrs.of(trial).too_slow


def gate_pace_per_core(trial: optuna.trial.FrozenTrial, verdict: GateVerdict) -> float:
    """The stopped instance's pace over its own threads, samples/s per core."""
    config = config_of(trial)
    return verdict.samples_per_s / (config.threads_per_instance if config else 1)


def drift_far_beyond(trial: optuna.trial.FrozenTrial, criterion: DriftCriterion) -> float | None:
    """A trial pruned on drift beyond FAR_BEYOND_DRIFT_BOUND times the bound: its drop, else None."""
    attrs = TrialAttrs.of(trial)
    if attrs.drift is None or not attrs.pruned_on_drift:
        return None
    drop = criterion.drop(attrs.drift)
    return drop if drop is not None and drop > FAR_BEYOND_DRIFT_BOUND * criterion.max_drop else None


def lost_by_far(
    trial: optuna.trial.FrozenTrial,
    proposal: Proposal,
    criterion: DriftCriterion,
    best_per_core: float | None,
) -> str | None:
    """How a launched trial of the proposal's family lost by far, or None if it did not (completed,
    failed, lost narrowly, or drifted with other numerics). `best_per_core`: the best clean trial's
    samples/s per core (None: no clean trial, or an objective the gate's pace does not compare with). A
    trial that failed by running out its whole trial timeout lost by far too (it recorded no measurement)
    (a language model's inductor int4 weights with fp32 activations on a Xeon with AMX: 600 s preparing, then TPE's next
    inductor int4 proposal 377 s more until the budget ran out); one cut short by the budget did not, nor
    the baseline, whose untuned settings are not the family's (a model that hangs there may not elsewhere)."""
    attrs = TrialAttrs.of(trial)
    cause = attrs.fail_cause or ""
    timed_out = trial.state == optuna.trial.TrialState.FAIL and cause.startswith("timed out after")
    if timed_out and not attrs.baseline:
        return f"#{trial.number} {cause}"
    if trial.state != optuna.trial.TrialState.PRUNED:
        return None
    verdict = gate_verdict(trial)
    if verdict is not None:
        per_core = gate_pace_per_core(trial, verdict)
        if not best_per_core or per_core >= FAR_SLOWER * best_per_core:
            return None
        return (
            f"#{trial.number} ran {per_core:.3g} samples/s per core in its {verdict.stage} against the best's "
            f"{best_per_core:.3g}"
        )
    same_numerics = attrs.fallback_key == proposal.fallback_key
    if not same_numerics or attrs.drift_reference != proposal.drift_reference:
        return None
    config = attrs.config
    if proposal.sequences is not None and (config.batch_size if config else None) != proposal.sequences:
        return None
    drop = drift_far_beyond(trial, criterion)
    if drop is None:
        return None
    return f"#{trial.number} drifted {drop:.3g} {criterion.metric} against the bound {criterion.max_drop:.3g}"


def hopeless_family(
    study: optuna.study.Study,
    proposal: Proposal,
    criterion: DriftCriterion,
    objective: str,
    before: int,
    host: str | None = None,
) -> str | None:
    """Why the proposal should not be launched, or None: every launched trial of its family numbered below
    `before` (at least one) lost by far. A trial pruned unlaunched says nothing new and is left out; with
    `host` (a fleet of mixed hardware), so are other hosts' trials."""
    launched = [
        t
        for t in study.get_trials(deepcopy=False, states=FINISHED)
        if t.number < before
        and (attrs := TrialAttrs.of(t)).budget is not None  # launched: the orchestrator split its time
        and (config := attrs.config) is not None
        and config.backend == proposal.backend
        and precision_variant(config.precision, config.options) == proposal.precision
        and (host is None or attrs.host == host)
    ]
    if not launched:
        return None
    clean = clean_trials(study)
    best_per_core = (
        samples_per_core_s(best_config, objective, primary_value(clean[0]))
        if clean and (best_config := config_of(clean[0])) is not None
        else None
    )
    losses = [lost_by_far(t, proposal, criterion, best_per_core) for t in launched]
    if None in losses:
        return None
    return (
        f"not launched: every {proposal.backend} {proposal.precision} trial so far lost by far "
        f"({'; '.join(str(x) for x in losses)}); no layout closes such a gap"
    )

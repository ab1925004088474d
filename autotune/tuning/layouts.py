"""The layout round: once a family other than the baseline leads, the leader is measured with every
other split of the cores into pinned instances, alternating with the coverage still to come.

(Text generation's measurements quoted below as "N sequences as I x T" were made when a study's sequences
counted per instance: N on each of I instances. Since 2026-11-29 they count the total, which a split keeps.)

How many instances share the cores is the dimension with the largest effect after backend and
precision, and the coverage round measures every family with one instance on all cores only. Small
models win with several one-thread instances (efficientnet_b0 on a 2-core EPYC: ONNX Runtime fp32,
111.5 samples/s as one instance of two threads, 131.2 as two of one; a 20-minute search's sampler
did not get there, a 60-minute one found it after 23 minutes). So as soon as a coverage family other
than the baseline leads, the best clean configuration (the best noisy one when no measurement was
clean) is held again with each other instance count, each with the most threads that fit beside its
siblings, everything else as it is: a cheap trial (its artifact is cached, and the speed pruner stops
a clearly slower layout after screening). Once per study, then again for each backend x precision
whose coverage trial takes the lead later (not for text generation, whose coverage trials after the
round run at the round's best layout instead: round_layout), for the objectives that sum
work over instances (throughput, and the server scenario's sustained rate); a call's latency only
grows when its cores are split.

Both the coverage round and the round's splits wait on the study and are released one trial at a
time, whenever nothing is waiting, alternating: a split, then the next coverage family that may lead,
then the next split (text generation's splits back to back: its most-sequences trial follows the
splits of the leader it measured). On two cores the round is two splits and the winning one comes first, as before;
on many cores it is long (a 16-core Xeon with AMX: seven splits of eager bf16, from 2 x 8 to 16 x 1,
ran for 2.5 minutes ahead of the two int8 families next in the coverage queue, and a 16-minute
search measured no int8 in its first quarter). The coverage trials of families expected to lose
(tuning/payoff.py) run after the round. For text generation, once the splits are measured, the best
of the leader and its splits is measured again with more concurrent sequences, the most the space lists
within 8x its own (most_sequences_variant), ahead of the coverage still held, when it runs fewer: with
the default space only where the round's leader runs one sequence (the baseline leading, or a study
begun before), since throughput runs its coverage at the most already (coverage_batch); never under a
token latency bound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import optuna

from autotune.backends.generation import QUANTIZED, artifact_identity
from autotune.common.json_record import Record
from autotune.records.attributes import Attr, TrialAttrs
from autotune.results.selection import is_valid, primary_value
from autotune.tuning.pruners import best_clean
from autotune.tuning.space import InfeasibleConfig, SearchSpace, family, guided_attrs, most_threads

OBJECTIVES = ("throughput", "server")  # both maximized


def layout_variants(
    params: dict[str, Any],
    instances: list[int],
    threads: list[int] | None,
    cores: int,
    batch_sizes: list[int] | None = None,
    batch_key: str = "batch_size",
    split_total: bool = False,
) -> list[dict[str, Any]]:
    """`params` with each other instance count of the space, each instance with the most threads that fit
    beside its siblings (space.most_threads); a count with no thread count that fits is left out. The
    fewest instances first. With the space's `batch_sizes`, each count also comes first with the batch
    that keeps the samples in flight on the machine what the leader had (8 on one instance: 4 on each of
    two), when the space lists that batch: a split's instances each work on a share of the cache and
    memory bandwidth, and the smaller batch won on efficientnet_b0 and mobilenet_v3_large (ONNX Runtime
    fp32 bs 4 as 2 x 1 against the leader's bs 8 as 1 x 2, on a 2-core EPYC). `split_total` (text
    generation, whose `batch_key` holds the total sequences): a count that does not divide the total is left
    out, and each other one runs the same total, split."""
    variants = []
    leader_count, leader_batch = params.get("instances"), params.get(batch_key)
    for count in sorted(instances):
        fitting = most_threads(count, threads, cores)
        if count == leader_count or fitting is None:
            continue
        if split_total and isinstance(leader_batch, int) and leader_batch % count:
            continue
        variant = {**params, "instances": count, "threads_per_instance": fitting}
        if batch_sizes and isinstance(leader_count, int) and isinstance(leader_batch, int):
            in_flight = leader_batch * leader_count
            if in_flight % count == 0 and in_flight // count in batch_sizes and in_flight // count != leader_batch:
                variants.append({**variant, batch_key: in_flight // count})
        variants.append(variant)
    return variants


def most_sequences_variant(
    params: dict[str, Any], batch_sizes: list[int] | None, batch_key: str
) -> dict[str, Any] | None:
    """Text generation: the best layout of the round again with the most concurrent sequences the space
    lists (at most 8x its own: the prefill's logits and the KV cache grow with them), or None when it
    already runs that many. Whether they pay is the machine's: each decode step reads every weight once
    for all the sequences, while each prompt's prefill adds to the call (a 100M decoder, 512-token
    prompts, inductor da8w8 as two one-thread instances: 8 sequences made 170 tokens/s against 98 for
    one on an EPYC with VNNI, and 231 against 361 on a Xeon with AMX)."""
    batch = params.get(batch_key)
    if not batch_sizes or not isinstance(batch, int):
        return None
    count = params.get("instances")
    split = count if isinstance(count, int) and count > 0 else 1  # a total the instances split evenly
    most = max((size for size in batch_sizes if size <= 8 * batch and size % split == 0), default=batch)
    return {**params, batch_key: most} if most > batch else None


def coverage_batch(space: SearchSpace, objective: str, more_sequences: bool) -> int:
    """The batch the coverage round measures every family with: the baseline's, except text generation's
    throughput without a token latency bound (`more_sequences`), where it is the most concurrent sequences
    the space lists (most_sequences_variant of the baseline's). A decode step reads every weight once for
    all the sequences, so a family's rank at one sequence is not its rank where throughput is decided, and
    a family may not even compute the same there. On a 2-core Xeon with AMX (a 100M decoder, 512-token
    prompts): inductor bf16 decoded 58.7 tokens/s at one sequence against eager bf16's 40.5, and was pruned
    at screening against eager bf16's 194.1 at 8 sequences, never measured there; inductor's int8
    activations decoded garbage at one sequence (relative L2 in the thousands, pruned on drift after 2
    minutes each) and drifted 0.042-0.045 at 8. At 8 sequences against one, the layout round's winner
    made 194.1 tokens/s against 52.9 there, 170 against 98 on an EPYC with VNNI and 53.2 against 27.9 on an
    AVX2-only EPYC (docs/manual/benchmarks-log.md). The sampler still searches every sequence count."""
    batch = space.baseline_batch_size
    if not (more_sequences and space.task == "generate" and objective == "throughput"):
        return batch
    most = most_sequences_variant({space.batch_param: batch}, space.batch_sizes, space.batch_param)
    return batch if most is None else int(most[space.batch_param])


def round_layout(study: optuna.study.Study, batch_param: str) -> dict[str, int] | None:
    """Text generation: the instances and threads of the best clean trial among the first round's leader
    and its splits at the leader's batch (not the most-sequences trial, whose gain is the sequences'):
    the leader's own when no split was measured clean (a slower one is pruned at screening); None
    without a round or a clean measurement. The coverage trials released after the round run
    there (LayoutRound._release): a family's rank at the leader's layout is not its rank at the winning
    one (on a 2-core Xeon with AMX, 8 sequences: inductor da8w8 led at 185.9 tokens/s as 1 x 2 and made
    220.4 as 2 x 1; eager bf16's coverage trial, 187.0 as 1 x 2, came after the round, and its 2 x 1,
    239.5 in a 60-minute search, was never measured in that 20-minute one; docs/manual/benchmarks-log.md)."""
    first = study.user_attrs.get(Attr.LAYOUT_ROUND)
    leader_trial = next((t for t in study.get_trials(deepcopy=False) if t.number == first), None)
    if leader_trial is None:
        return None
    at_its_batch = [
        t
        for t in round_trials(study, leader_trial.number)
        if is_valid(t)
        and family(t.params) == family(leader_trial.params)
        and t.params.get(batch_param) == leader_trial.params.get(batch_param)
    ]
    if not at_its_batch:
        return None
    best = max(at_its_batch, key=primary_value)
    return {"instances": best.params["instances"], "threads_per_instance": best.params["threads_per_instance"]}


def round_trials(study: optuna.study.Study, leader_number: int) -> list[optuna.trial.FrozenTrial]:
    """The completed trials of a layout round: its leader and the layout trials measured so far."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.number == leader_number or TrialAttrs.of(t).layout
    ]


def best_layout(study: optuna.study.Study, leader_number: int) -> optuna.trial.FrozenTrial | None:
    """The best of the round's leader and its measured layout trials (clean ones first), or None."""
    layouts = round_trials(study, leader_number)
    return max([t for t in layouts if is_valid(t)] or layouts, key=primary_value, default=None)


def leader(study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
    """The best clean trial; when no measurement was clean (a loaded machine may flag them all), the best
    noisy one, still the best guess of where to look (it never wins on that measurement)."""
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        return None
    return best_clean(study) or study.best_trial


class LayoutRound:
    """Optuna callback (and called once before a run resumes). Where a layout round runs, the coverage
    round waits on the study (Attr.COVERAGE_QUEUE), and so do the round's splits once a family other
    than the baseline leads (Attr.LAYOUT_QUEUE); whenever nothing is waiting, the next trial is released,
    a split and a coverage family that may lead in turn (text generation's splits back to back, see
    self.in_turn) (efficientnet_b0 on a 2-core EPYC: its winning
    split had waited 3 minutes behind three fp32 families that could not win; a 16-core Xeon's seven
    splits held back int8 for 2.5 minutes). Once per study, and again for each family that leads later
    (_new_leading_family; a classifier's), whose splits go ahead of those still held; when nothing but the families
    expected to lose is left and the baseline still leads, the round runs for the baseline once the
    enqueued rounds are through (none waiting, none running in another worker of a fleet). The families
    expected to lose run once no split is held."""

    def __init__(self, space: SearchSpace, objective: str, more_sequences: bool = True) -> None:
        self.space = space
        self.active = self.applies(space, objective)
        # Text generation without a token latency bound (more sequences lengthen TTFT several times).
        self.more_sequences = self.active and more_sequences and space.task == "generate"
        self.later_rounds = self.active and space.task != "generate"  # a round for each family that leads
        # Text generation: the coverage after the round at the round's best layout (round_layout)
        self.coverage_at_round_layout = self.active and space.task == "generate"
        # Splits in turn with the coverage; text generation's back to back, so that the most-sequences trial
        # measures the leader whose splits ran, and the coverage after them runs at the round's best layout.
        self.in_turn = space.task != "generate"

    @staticmethod
    def applies(space: SearchSpace, objective: str) -> bool:
        """Whether a study of this space and objective has a layout round (and so holds its coverage)."""
        return objective in OBJECTIVES and len(space.instances) > 1

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial | None = None) -> None:
        queue = held_coverage(study)
        splits = list(study.user_attrs.get(Attr.LAYOUT_QUEUE) or [])
        round_due = self.active and Attr.LAYOUT_ROUND not in study.user_attrs
        sequences_due = self.more_sequences and Attr.SEQUENCES_ROUND not in study.user_attrs
        newcomer = None if round_due else self._new_leading_family(study)
        if not (round_due or sequences_due or queue or splits or newcomer):
            return
        if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return
        if round_due:
            when = self._round_when(study, queue)
            if when == "later":  # enqueued rounds still run elsewhere and may lead: the late families wait
                return
            best = leader(study)
            if when == "now" and best is not None:
                splits = self._hold_variants(study, best)
                study.set_user_attr(Attr.LAYOUT_ROUND, best.number)  # last: one that dies first holds them again
        elif newcomer is not None:
            splits = self._hold_variants(study, newcomer)
            study.set_user_attr(
                Attr.LAYOUT_ROUNDS_LATER, [*study.user_attrs.get(Attr.LAYOUT_ROUNDS_LATER, []), newcomer.number]
            )
        if sequences_due and Attr.LAYOUT_ROUND in study.user_attrs and not splits:
            if self._layouts_running(study):  # the split measured elsewhere may be the best layout
                return
            if self._enqueue_most_sequences(study):
                return
        self._release(study, queue, splits)

    def _round_when(self, study: optuna.study.Study, queue: list[HeldPlan]) -> str:
        """ "now" when a trial other than the baseline leads, or when only the families expected to lose
        are left and the enqueued rounds are through; "later" when only those are left but an enqueued
        round still runs in another worker (it may lead); "not yet" while coverage that may lead is held,
        or nothing completed."""
        best = leader(study)
        if best is None or any(plan.first for plan in queue):  # every engine's most promising family first
            return "not yet"
        if not TrialAttrs.of(best).baseline:
            return "now"
        if not all(plan.late for plan in queue):
            return "not yet"
        return "later" if self._enqueued_rounds_running(study) else "now"

    def _new_leading_family(self, study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
        """A coverage (or prior) trial that leads the study once the first round ran, of a backend x
        precision whose layouts no round has measured yet, or None. Each family's best split is its own
        (ONNX Runtime int8 gained 5% as two one-thread instances on a random-init vit_b_16, OpenVINO
        int8 40%), and the family that leads after the first round would otherwise wait for the sampler:
        on an EPYC with VNNI OpenVINO int8 took the lead at 5.5 minutes, and TPE found its split at 21.
        Not for text generation, where each split is a compile of minutes on two cores: its coverage after
        the round runs at the round's best layout instead (round_layout)."""
        if not self.later_rounds or Attr.LAYOUT_ROUND not in study.user_attrs:
            return None
        best = best_clean(study)
        if best is None or not ((attrs := TrialAttrs.of(best)).coverage or attrs.prior):
            return None
        leaders = study.user_attrs[Attr.LAYOUT_ROUND], *study.user_attrs.get(Attr.LAYOUT_ROUNDS_LATER, [])
        families = {family(t.params) for t in study.get_trials(deepcopy=False) if t.number in leaders}
        return None if family(best.params) in families else best

    def _hold_variants(self, study: optuna.study.Study, best: optuna.trial.FrozenTrial) -> list[dict[str, Any]]:
        """The leader's splits ahead of those still held (a later leader's are the likelier winners), on
        the study; what is now held."""
        space = self.space
        summary = TrialAttrs.of(best).config_summary or ""
        # A split keeps a generation leader's total sequences, each instance running its share: the user's
        # workload is the total (so eager bf16 on a 2-core Xeon with AMX as 2 x 1 at 8 sequences in all runs 4
        # on each, 164.1 tokens/s against 239.5 for 8 on each, which was another workload, 16 in all).
        generate = space.task == "generate"
        same_in_flight = space.batch_sizes if not generate else None
        variants = layout_variants(
            dict(best.params),
            space.instances,
            space.threads,
            space.cores,
            same_in_flight,
            space.batch_param,
            split_total=generate,
        )
        held = list(study.user_attrs.get(Attr.LAYOUT_QUEUE) or [])  # as stored now (a fleet shares it)
        plans = []
        for params in variants:
            layout = f"{params['instances']} instance(s) x {params['threads_per_instance']} thread(s)"
            if params.get(space.batch_param) != best.params.get(space.batch_param):
                layout += f", {space.batch_param} {params[space.batch_param]} (the same samples in flight)"
            why = f"layout round: the leader #{best.number} ({summary}) as {layout}"
            plans.append({"params": params, "order": why})
        held = [*plans, *(plan for plan in held if plan["params"] not in variants)]
        study.set_user_attr(Attr.LAYOUT_QUEUE, held)
        return held

    def _enqueue_most_sequences(self, study: optuna.study.Study) -> bool:
        """Once the splits are measured: the best of the leader and its splits with the most sequences
        (most_sequences_variant), ahead of the coverage still held; whether one was enqueued."""
        best = best_layout(study, study.user_attrs[Attr.LAYOUT_ROUND])
        space = self.space
        params = (
            None if best is None else most_sequences_variant(dict(best.params), space.batch_sizes, space.batch_param)
        )
        if best is not None and params is not None:
            layout = f"{params['instances']} instance(s) x {params['threads_per_instance']} thread(s)"
            why = (
                f"layout round: the best layout #{best.number} ({TrialAttrs.of(best).config_summary or ''}) "
                f"as {layout} with {params[space.batch_param]} {space.batch_param} (the most the space lists)"
            )
            attrs = {Attr.LAYOUT: True, Attr.ORDER: why, **guided_attrs(params)}
            study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
        study.set_user_attr(
            Attr.SEQUENCES_ROUND, -1 if params is None or best is None else best.number
        )  # last, as above
        return params is not None

    @staticmethod
    def _layouts_running(study: optuna.study.Study) -> bool:
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        return any(TrialAttrs.of(t).layout for t in running)

    def _release(self, study: optuna.study.Study, queue: list[HeldPlan], splits: list[dict[str, Any]]) -> None:
        """Enqueue the next held trial, then drop it from its queue (a run that dies between the two
        enqueues it again; skip_if_exists keeps a plan from running twice): a split when the last one
        released was coverage or when only the families expected to lose are left (they wait for the
        round), else the next coverage trial. The families expected to lose say where they ran against
        the round, a split whether coverage that may lead was still held."""
        waiting = (optuna.trial.TrialState.WAITING,)
        while (queue or splits) and not study.get_trials(deepcopy=False, states=waiting):  # one already run: next
            may_lead = sum(not plan.late for plan in queue)
            in_turn = self.in_turn and may_lead > 0
            if splits and (not in_turn or study.user_attrs.get(Attr.RELEASED_LAST) != "layout"):
                plan = splits[0]
                order = plan["order"] + (
                    f" (in turn with the {may_lead} coverage trial(s) that may lead, still held)" if in_turn else ""
                )
                attrs = {Attr.LAYOUT: True, Attr.ORDER: order, **guided_attrs(plan["params"])}
                study.enqueue_trial(plan["params"], user_attrs=attrs, skip_if_exists=True)
                # dropped from the queue as stored now: another worker may have held a later leader's splits
                # (read, then written: a hold landing between the two can still be lost; a split dropped
                # twice and held again is harmless, skip_if_exists never runs a trial twice)
                stored = study.user_attrs.get(Attr.LAYOUT_QUEUE) or []
                splits = [held for held in stored if held["params"] != plan["params"]]
                study.set_user_attr(Attr.LAYOUT_QUEUE, splits)
                study.set_user_attr(Attr.RELEASED_LAST, "layout")
                continue
            if self.coverage_at_round_layout and Attr.LAYOUT_ROUND in study.user_attrs and self._layouts_running(study):
                return  # a split still measured elsewhere (a fleet) may decide the layout: its callback releases
            held, queue = queue[0], queue[1:]
            drifted = None if held.deferred else self._drifted_weights(study, held.params)
            if drifted is not None:  # once
                why = f" (after the other coverage: trial {drifted.number} pruned the same quantized weights on drift)"
                deferred = replace(held, deferred=True, first=False, order=held.order + why)  # no longer first
                if held.late:  # a family expected to lose: after all of them
                    queue = [*queue, deferred]
                else:  # after the other coverage that may lead, before the families expected to lose
                    ahead = [plan for plan in queue if not plan.late]
                    queue = [*ahead, deferred, *(plan for plan in queue if plan.late)]
                study.set_user_attr(Attr.COVERAGE_QUEUE, [plan.to_json() for plan in queue])
                continue
            params, order = held.params, held.order
            layout = round_layout(study, self.space.batch_param) if self.coverage_at_round_layout else None
            total = params.get(self.space.batch_param)
            if layout and isinstance(total, int) and total % layout["instances"]:
                layout = None  # the round's layout does not split this plan's total evenly: its own
            if layout and any(params.get(key) != value for key, value in layout.items()):
                params = {**params, **layout}
                order += (
                    f" (at the layout round's best layout: {layout['instances']} instance(s) x "
                    f"{layout['threads_per_instance']} thread(s))"
                )
            if held.late:
                if Attr.LAYOUT_ROUND in study.user_attrs:
                    order += " (after the layout round)"
                elif self.active:  # nothing completed to lead it: the round is tried again once these ran
                    order += " (no completed trial to lead a layout round)"
                else:
                    order += " (after the enqueued rounds; no layout round in this process)"
            attrs = {Attr.COVERAGE: True, Attr.ORDER: order, **guided_attrs(params)}
            study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
            study.set_user_attr(Attr.COVERAGE_QUEUE, [plan.to_json() for plan in queue])
            study.set_user_attr(Attr.RELEASED_LAST, "coverage")

    def _drifted_weights(self, study: optuna.study.Study, params: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
        """An earlier eager trial pruned on drift that loaded the weights this plan would load, or None. Text
        generation only: every backend there loads one quantized artifact per precision and its options,
        so eager's drift is the weights' (a 100M decoder's woq_int4 drifted 0.409 against a bound of 0.05 in
        eager, after 4.3 minutes, and inductor's trial of the same weights was next in the round). A compiled
        trial's drift may be its compiler's own: inductor da8w8 decoded garbage at one sequence on a Xeon
        with AMX while eager's trial of the same weights passed."""
        if self.space.task != "generate":
            return None
        try:
            wanted = artifact_identity(self.space.suggest(optuna.trial.FixedTrial(params)))
        except (InfeasibleConfig, ValueError, KeyError):
            return None
        if wanted["precision"] not in QUANTIZED:  # fp32 and bf16 are each backend's own conversion
            return None
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,)):
            attrs = TrialAttrs.of(trial)
            recorded = attrs.config
            if recorded is None or not (attrs.prune_reason or "").startswith("drift:"):
                continue
            try:
                if recorded.backend == "eager" and artifact_identity(recorded) == wanted:
                    return trial
            except (TypeError, KeyError):  # a record of another version: not comparable
                continue
        return None

    @staticmethod
    def _enqueued_rounds_running(study: optuna.study.Study) -> bool:
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        # what the round waits for, in this process or another: the baseline, priors and coverage
        return any((a := TrialAttrs.of(t)).baseline or a.prior or a.coverage for t in running)


@dataclass(frozen=True)
class HeldPlan(Record):
    """One coverage trial held on the study (Attr.COVERAGE_QUEUE) until its turn: its parameters, why it
    runs, whether its family is expected to lose (`late`: it waits for the layout round) and whether it
    was put back once behind the other coverage (`deferred`, stored only when set)."""

    OMIT_DEFAULTS: ClassVar[bool] = True
    ALWAYS_WRITTEN: ClassVar[tuple[str, ...]] = ("params", "order", "late")

    params: dict[str, Any]  # Optuna's parameters, as the space names them
    order: str
    late: bool = False
    deferred: bool = False
    first: bool = False  # text generation's engine round (tuning/payoff.engine_round): before the layout round


def held_coverage(study: optuna.study.Study) -> list[HeldPlan]:
    """The coverage trials still waiting on the study, next first; a study begun before the queue existed
    keeps its coverage enqueued and only the late plans here."""
    if Attr.COVERAGE_QUEUE in study.user_attrs:
        return [HeldPlan.from_json(plan) for plan in study.user_attrs[Attr.COVERAGE_QUEUE] or []]
    return [replace(HeldPlan.from_json(plan), late=True) for plan in study.user_attrs.get(Attr.LATE_COVERAGE) or []]

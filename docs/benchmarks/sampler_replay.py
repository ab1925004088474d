"""Search strategies replayed against a study already measured: sampler choices in seconds, not hours.

Every COMPLETE (and every pruned or failed) trial of a recorded study is a row of a table: its
parameters, its value (samples/s or tokens/s), its noise (the throughput interval's relative half-width)
and what it cost (its wall time, `budget.total_s`, or start to completion). A strategy is replayed as a
real Optuna study over the same parameters, with the recorded study's distributions, each trial asking
only what the search asks for its backend x precision (as the recorded trials show it:
ask_like_the_search); each configuration it asks for is answered from the table (the recorded row with
the most equal parameters, ties to the first recorded), its value drawn with the recorded noise (normal,
the interval as 1.96 sigma), and the replay's clock advanced by the row's cost. A configuration measured
several times is one row, worth the median of its values (merge_repeats). The table's best value is the
target. Each replay reports its curve, what its answer would be worth if it stopped there: the search's
finalist round re-measures the FINALISTS configurations with the best measurements so far and exports the
fastest, so the curve is the best row value among the FINALISTS configurations with the best draws so far
(not monotone: a lucky draw can push a better configuration out of the round). The time to 95% is when
that first reached 95% of the target. The curve is never a draw itself: a strategy that measures the same
configuration sixteen times (TPE near its optimum) would be credited with its luckiest draw, above what
the configuration is worth.

Strategies: `default` (autotune's: the baseline, the coverage round ordered by expected payoff on the
recorded machine released a trial at a time, the layout round of the replay's own leader as soon as a
trial other than the baseline leads, its splits in turn with the coverage still held (text
generation's back to back), the families
expected to lose last, then TPE multivariate), `layout-round-first` (the default with every split of
the round ahead of the coverage still held, as before),
`int8-by-preparation-cost` (the default with a classifier's int8 ordered by preparation cost alone, as
before OpenVINO's int8 went first), `int8-by-cpu-alone` (the default without the model's reduction depth:
a shallow model's int8 second on a CPU without int8 dot products, as before; the depth is the study's
`reduction_depth`, or --reduction-depth for a study recorded before the reference measured it),
`quantized-first` (the default ordered as on a CPU with AVX-VNNI: a language model's int8 activations
compiled by inductor first, as on every CPU before they were expected to lose without int8 dot products;
eager's int8 and int4 weights are expected to lose on every CPU now, so they stay last),
`layout-round-after-coverage` (the round once the whole coverage round ran, as before),
`default-without-layout-round`, `coverage-in-space-order` (the payoff order and layout round left out),
`default-relaunching-lost-families` (the default launching what the sampler proposes of a family whose every
launched trial lost by far, as before tuning/hopeless.py), `default-capping-repeats` (the default not
launching a sampled configuration launched REPEATS_CAP times already: TPE near its optimum measures the same
one over and over), `tpe` (TPE from the start, no coverage round) and `random` (RandomSampler). Every strategy
but `default-relaunching-lost-families`, `tpe` and `random` skips such proposals, at UNLAUNCHED_S each. The
coverage trials replayed are the recorded study's own (their options as its search ran them: a study recorded
before OpenVINO's int8 coverage ran its float layers in bf16 on a CPU with AMX-BF16 replays it with f32). A
layout variant the recorded study never measured counts as pruned at its leader's cost (no value is guessed
for it).

    .venv/bin/python docs/benchmarks/sampler_replay.py --study resnet50 [--studies-dir studies] [--runs 50]
        [--budget-min 20] [--reduction-depth 49]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rich.console import Console
from rich.table import Table

from autotune.measure.drift import DriftCriterion
from autotune.records.options import DEFAULT_FINALISTS as FINALISTS  # the configurations the finalist round re-measures
from autotune.records.spec import StoredSpec, default_storage
from autotune.tuning.hopeless import FAR_SLOWER, drift_far_beyond, gate_pace_per_core, gate_verdict
from autotune.tuning.layouts import OBJECTIVES as LAYOUT_OBJECTIVES
from autotune.tuning.layouts import best_layout, layout_variants, most_sequences_variant
from autotune.tuning.payoff import int8_first_backend, order_by_payoff
from autotune.tuning.space import family


@dataclass(frozen=True)
class Row:
    params: dict[str, Any]
    value: float | None  # None: pruned or failed (it cost time, it gave nothing)
    noise_rel: float
    cost_s: float
    coverage: bool
    baseline: bool
    gate_per_core: float | None = None  # stopped by the speed gate: its pace, samples/s per core
    drift_lost: bool = False  # pruned on drift beyond FAR_BEYOND_DRIFT_BOUND times the bound
    fallback_key: str = ""  # its numerics without the scheduling options
    cores: int = 1


def read_table(study: optuna.study.Study) -> list[Row]:
    spec = study.user_attrs.get("spec") or {}
    criterion = DriftCriterion(
        spec.get("drift_metric", "relative_l2"), spec.get("max_drift", 0.05), spec.get("drift_relative", False)
    )
    rows = []
    for trial in study.get_trials(deepcopy=False):
        if not trial.params or trial.datetime_start is None or trial.datetime_complete is None:
            continue
        budget = trial.user_attrs.get("budget") or {}
        cost = budget.get("total_s") or (trial.datetime_complete - trial.datetime_start).total_seconds()
        complete = trial.state == optuna.trial.TrialState.COMPLETE and trial.user_attrs.get("valid", True)
        measurement = trial.user_attrs.get("measurement") or {}
        rows.append(
            Row(
                dict(trial.params),
                trial.values[0] if complete and trial.values else None,
                float(measurement.get("throughput_ci_rel") or 0.02),
                float(cost),
                bool(trial.user_attrs.get("coverage")),
                bool(trial.user_attrs.get("baseline")),
                *far_losses(trial, criterion),
                str(trial.user_attrs.get("fallback_key", "")),
                (config := trial.user_attrs.get("config") or {}).get("instances", 1)
                * config.get("threads_per_instance", 1),
            )
        )
    return rows


def far_losses(trial: optuna.trial.FrozenTrial, criterion: DriftCriterion) -> tuple[float | None, bool]:
    """What tuning/hopeless.py reads of a launched trial: its speed gate pace per core, if the gate
    stopped it, and whether it was pruned on drift beyond FAR_BEYOND_DRIFT_BOUND times the bound."""
    if trial.state != optuna.trial.TrialState.PRUNED:
        return None, False
    verdict = gate_verdict(trial)
    pace = gate_pace_per_core(trial, verdict) if verdict else None
    return pace, drift_far_beyond(trial, criterion) is not None


def merge_repeats(rows: list[Row]) -> list[Row]:
    """One row per configuration: a configuration the study measured several times is worth the median of
    its clean values (and costs the median of its costs), so the target is what the best configuration
    is worth, not the luckiest of its draws; replays add the noise back. First appearance keeps its place."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(row.params.items())), []).append(row)
    merged = []
    for group in groups.values():
        clean = [r for r in group if r.value is not None]
        merged.append(
            Row(
                group[0].params,
                statistics.median(r.value for r in clean if r.value is not None) if clean else None,
                statistics.median(r.noise_rel for r in clean) if clean else group[0].noise_rel,
                statistics.median(r.cost_s for r in group),
                any(r.coverage for r in group),
                any(r.baseline for r in group),
                group[0].gate_per_core,
                all(r.drift_lost for r in group),
                group[0].fallback_key,
                group[0].cores,
            )
        )
    return merged


def nearest_rank(values: list[float], share: float) -> float:
    """The value at `share` of the sorted values by the nearest-rank rule (the largest for a share of 1)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def answer(rows: list[Row], params: dict[str, Any]) -> Row:
    """The recorded row closest to what was asked: the most parameters equal."""
    return max(rows, key=lambda row: sum(row.params.get(k) == v for k, v in params.items()))


def family_keys(rows: list[Row]) -> dict[tuple[Any, Any], list[str]]:
    """The parameters the recorded search asked for each backend x precision: its define-by-run tree
    (SearchSpace.suggest) as the recorded trials show it."""
    keys: dict[tuple[Any, Any], list[str]] = {}
    for row in rows:
        seen = keys.setdefault(family(row.params), [])
        seen.extend(k for k in row.params if k not in seen)
    return keys


def suggest(trial: optuna.trial.Trial, name: str, distribution: Any) -> Any:
    """One parameter from its recorded distribution (an enqueued trial gets its fixed value)."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return trial.suggest_int(
            name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
        )
    return trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log)


def ask_like_the_search(
    study: optuna.study.Study, distributions: dict[str, Any], keys: dict[tuple[Any, Any], list[str]]
) -> optuna.trial.Trial:
    """A trial that asks only what the search asks for its backend x precision, so that its parameters
    equal a recorded row's when the recorded study measured that configuration. (Asking every recorded
    distribution at once would also draw the other backends' options, and no row would ever match.)"""
    trial = study.ask()
    backend = suggest(trial, "backend", distributions["backend"])
    name = f"{backend}.precision"
    precision = suggest(trial, name, distributions[name]) if name in distributions else None
    for key in keys.get((backend, precision), []):
        intel_only = key in ("kmp_affinity", "kmp_blocktime") and trial.params.get("openmp") != "intel"
        unbatched = key == "max_wait_ms" and trial.params.get("batch_size") == 1
        if key not in trial.params and key in distributions and not intel_only and not unbatched:
            suggest(trial, key, distributions[key])
    return trial


def exact_row(rows: list[Row], params: dict[str, Any]) -> Row | None:
    """The recorded row of exactly these parameters, if the study measured it."""
    return next((row for row in rows if row.params == params), None)


@dataclass
class LayoutTally:
    """How the replays' layout rounds were answered: a variant the recorded study never measured is not
    guessed from a neighbour (which would credit the round with a value nobody measured): it counts as
    pruned, at its leader's cost."""

    exact: int = 0
    unrecorded: int = 0


def recorded_attention_layers(recorded: optuna.study.Study) -> int | None:
    """The model's attention layers, as the search recorded them; for a study from before, as an int8
    artifact of ONNX Runtime or OpenVINO recorded them in its details (None: neither says)."""
    if recorded.user_attrs.get("attention_layers") is not None:
        return int(recorded.user_attrs["attention_layers"])
    for trial in recorded.get_trials(deepcopy=False):
        details = (trial.user_attrs.get("artifact") or {}).get("details") or {}
        if isinstance(details.get("attention_layers"), dict):
            return sum(details["attention_layers"].values())
    return None


# Which strategies run which rounds (see the module docstring): the layout round as soon as a coverage
# family leads, the layout round at all, the coverage round at all.
LAYOUT_ROUND_WHEN_A_FAMILY_LEADS = frozenset(
    {
        "default",
        "default-relaunching-lost-families",
        "default-capping-repeats",
        "int8-by-preparation-cost",
        "int8-by-cpu-alone",
        "quantized-first",
        "layout-round-first",
    }
)
WITH_LAYOUT_ROUND = LAYOUT_ROUND_WHEN_A_FAMILY_LEADS | {"layout-round-after-coverage"}
WITH_COVERAGE_ROUND = WITH_LAYOUT_ROUND | {"default-without-layout-round", "coverage-in-space-order"}
UNLAUNCHED_S = 0.5  # a config pruned before launch: the sampler's and the storage's time
REPEATS_CAP = 3  # default-capping-repeats: a sampled configuration launched this often is not launched again


def replay(
    strategy: str,
    recorded: optuna.study.Study,
    rows: list[Row],
    budget_s: float,
    isa: dict[str, bool],
    seed: int,
    tally: LayoutTally | None = None,
    reduction_depth: float | None = None,
) -> list[tuple[float, float]]:
    """One replay: (seconds, what its answer would be worth: the best row value among the FINALISTS
    configurations with the best draws so far) after each trial, until the budget is spent."""
    tally = tally if tally is not None else LayoutTally()
    noise = random.Random(seed)
    distributions: dict[str, Any] = {}
    for trial in recorded.get_trials(deepcopy=False):
        distributions.update(trial.distributions)
    keys = family_keys(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = (
            optuna.samplers.RandomSampler(seed=seed)
            if strategy == "random"
            else optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed)
        )
        study = optuna.create_study(direction="maximize", sampler=sampler)
    # the round as soon as a coverage family leads, ahead of the rest
    early = strategy in LAYOUT_ROUND_WHEN_A_FAMILY_LEADS
    layouts_due = strategy in WITH_LAYOUT_ROUND and recorded_objective(recorded) in LAYOUT_OBJECTIVES
    late: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []  # early: coverage released one at a time, as the search's callback does
    splits: list[tuple[dict[str, Any], dict[str, Any]]] = []  # the layout round's, held likewise
    released_last = "coverage"
    # as layouts.py: a classifier's splits in turn with the coverage, text generation's back to back
    generation = (recorded.user_attrs.get("spec") or {}).get("task") == "generate"
    in_turn = strategy != "layout-round-first" and not generation
    if strategy in WITH_COVERAGE_ROUND:
        first = [r.params for r in rows if r.baseline][:1]
        coverage = [r.params for r in rows if r.coverage]
        if strategy != "coverage-in-space-order":
            task = (recorded.user_attrs.get("spec") or {}).get("task", "classify")
            attention = recorded_attention_layers(recorded)
            int8_first = None if strategy == "int8-by-preparation-cost" else int8_first_backend(isa, attention)
            depth = None if strategy == "int8-by-cpu-alone" else reduction_depth
            as_if = {**isa, "avx_vnni": True} if strategy == "quantized-first" else isa
            ordered = order_by_payoff(coverage, as_if, task, int8_first=int8_first, reduction_depth=depth)
            coverage = [plan.params for plan in ordered if not (layouts_due and plan.expected_to_lose)]
            late = [plan.params for plan in ordered if plan.params not in coverage]
        if early and layouts_due:
            held, coverage = coverage, []
        for params in first:
            study.enqueue_trial(params, user_attrs={"baseline": True})
        for params in coverage:
            study.enqueue_trial(params)
    # the search's rule: a sampled config of a family whose every launched trial lost by far is not launched
    skip_lost = strategy not in ("default-relaunching-lost-families", "tpe", "random")
    cap_repeats = strategy == "default-capping-repeats"
    launches: dict[tuple[Any, ...], int] = {}
    throughput = recorded_objective(recorded) == "throughput"
    launched: dict[tuple[Any, Any], list[Row]] = {}
    best_per_core = 0.0  # the replay's own best so far, per core

    def lost(row: Row, proposed: Row) -> bool:
        """As tuning/hopeless.py: far below the best so far per core, or far beyond the drift bound with
        the proposal's numerics."""
        slow = throughput and row.gate_per_core is not None and row.gate_per_core < FAR_SLOWER * best_per_core
        return slow or (row.drift_lost and row.fallback_key == proposed.fallback_key)

    clock, best, curve = 0.0, 0.0, []
    worth = 0.0  # what the answer would be worth now: the curve
    contenders: dict[tuple[Any, ...], tuple[float, float]] = {}  # configuration: its best draw, its row value
    while clock < budget_s:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = ask_like_the_search(study, distributions, keys)
            sampled = "fixed_params" not in study.get_trials(deepcopy=False)[trial.number].system_attrs
        earlier = launched.get(family(trial.params), [])
        key = tuple(sorted(trial.params.items()))
        hopeless = sampled and skip_lost and bool(earlier) and all(lost(r, answer(rows, trial.params)) for r in earlier)
        capped = sampled and cap_repeats and launches.get(key, 0) >= REPEATS_CAP
        if hopeless or capped:
            clock += UNLAUNCHED_S
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            curve.append((clock, worth))
            continue
        launches[key] = launches.get(key, 0) + 1
        row = answer(rows, trial.params)
        if trial.user_attrs.get("layout"):
            found = exact_row(rows, trial.params)
            tally.exact += found is not None
            tally.unrecorded += found is None
            row = found or Row(trial.params, None, 0.0, trial.user_attrs["leader_cost_s"], False, False)
        clock += row.cost_s
        launched.setdefault(family(trial.params), []).append(row)
        if row.value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            value = row.value * (1 + noise.gauss(0, row.noise_rel / 1.96))
            study.tell(trial, value)
            if value > best:
                best, best_per_core = value, value / row.cores
            contenders[key] = (max(value, contenders.get(key, (value, 0.0))[0]), row.value)
            worth = max(w for _, w in sorted(contenders.values(), reverse=True)[:FINALISTS])
        curve.append((clock, worth))
        if study.get_trials(states=(optuna.trial.TrialState.WAITING,)):
            continue
        if study.user_attrs.get("sequences_round_due") is not None and not splits:
            enqueue_most_sequences(study, rows, distributions, recorded)
            if study.get_trials(states=(optuna.trial.TrialState.WAITING,)):
                continue
        leads = best > 0 and not study.best_trial.user_attrs.get("baseline")  # as layouts.py decides
        # as the search's callback: once a coverage family leads, or once the enqueued rounds are through
        if layouts_due and ((held and leads) or (not held and best > 0)):
            layouts_due = False
            splits = layout_round(study, rows, distributions, recorded)
        if splits and (not held or not in_turn or released_last != "layout"):
            params, attrs = splits.pop(0)  # in turn with the coverage still held, as layouts.py releases them
            study.enqueue_trial(params, user_attrs=attrs)
            released_last = "layout"
        elif held:
            study.enqueue_trial(held.pop(0))
            released_last = "coverage"
        else:
            for params in late:  # the families expected to lose, after the round (at once if nothing leads)
                study.enqueue_trial(params)
            late = []
    return curve


def layout_round(
    study: optuna.study.Study, rows: list[Row], distributions: dict[str, Any], recorded: optuna.study.Study
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The replay's leader with every other instance split (layout_variants), to enqueue with their user
    attributes, each charged its leader's cost when the recorded study never measured it; for text
    generation the most-sequences trial follows (enqueue_most_sequences), and a split keeps the leader's
    sequences (the total, in a study whose sequences count it). Not replayed (tuning/layouts.py): the
    generation coverage's drift deferral, the later rounds
    for a family that takes the lead after the first, and text generation's coverage at the most sequences
    and, after the round, at its best layout (round_layout): the replay runs the recorded coverage trials
    as they were."""
    leader = study.best_trial
    cost = answer(rows, leader.params).cost_s
    dims = instance_dims(distributions, recorded)
    if dims[4] == "sequences":  # then the best layout with the most sequences, as the search's callback does
        study.set_user_attr("sequences_round_due", leader.number)
    generation = dims[4] == "sequences"
    # a split keeps a generation leader's sequences: on each instance in a study stored when they counted per
    # instance, in all (each instance its share) in one stored since
    total = generation and StoredSpec.of(recorded).sequences_meaning == "total"
    variants = layout_variants(leader.params, *dims[:3], None if generation else dims[3], dims[4], split_total=total)
    return [(params, {"layout": True, "leader_cost_s": cost}) for params in variants]


def enqueue_most_sequences(
    study: optuna.study.Study, rows: list[Row], distributions: dict[str, Any], recorded: optuna.study.Study
) -> None:
    """Text generation: once the splits ran, the best of the leader and its splits with the most sequences
    (most_sequences_variant), charged its layout's cost when the recorded study never measured it."""
    best = best_layout(study, study.user_attrs["sequences_round_due"])
    study.set_user_attr("sequences_round_due", None)
    if best is None:
        return
    dims = instance_dims(distributions, recorded)
    params = most_sequences_variant(best.params, dims[3], dims[4])
    if params is not None:
        cost = answer(rows, best.params).cost_s
        study.enqueue_trial(params, user_attrs={"layout": True, "leader_cost_s": cost}, skip_if_exists=True)


def recorded_objective(recorded: optuna.study.Study) -> str:
    return str((recorded.user_attrs.get("spec") or {}).get("objective", "throughput"))


def instance_dims(
    distributions: dict[str, Any], recorded: optuna.study.Study
) -> tuple[list[int], list[int] | None, int, list[int] | None, str]:
    """The recorded space's instance counts, its thread counts (None: any that fit), the machine's cores,
    and its batch sizes with their parameter's name (what layout_variants takes)."""
    instances = distributions.get("instances")
    threads = distributions.get("threads_per_instance")
    hardware = (recorded.user_attrs.get("fingerprint") or {}).get("hardware") or {}
    batch_key = "sequences" if "sequences" in distributions else "batch_size"
    batches = distributions.get(batch_key)
    return (
        list(getattr(instances, "choices", None) or [1]),
        list(threads.choices) if isinstance(threads, optuna.distributions.CategoricalDistribution) else None,
        int(hardware.get("physical_cores") or 1),
        [b for b in batches.choices if isinstance(b, int)]
        if isinstance(batches, optuna.distributions.CategoricalDistribution)
        else None,
        batch_key,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    parser.add_argument("--storage", help="default: the study's own SQLite file under --studies-dir")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--budget-min", type=float, default=20.0)
    parser.add_argument(
        "--reduction-depth",
        type=float,
        help="the model's multiply-adds per output of its convolutions and linear layers, for a study recorded "
        "before its reference measured them (default: the study's reduction_depth)",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = args.storage or default_storage(args.studies_dir, args.study)
    recorded = optuna.load_study(study_name=args.study, storage=storage)
    rows = merge_repeats(read_table(recorded))
    target = max((r.value for r in rows if r.value is not None), default=None)
    if target is None:
        parser.error(f"study {args.study} has no clean completed trial to replay against")
    isa = ((recorded.user_attrs.get("fingerprint") or {}).get("hardware") or {}).get("isa") or {}
    depth = args.reduction_depth if args.reduction_depth is not None else recorded.user_attrs.get("reduction_depth")
    budget_s = args.budget_min * 60
    console = Console(width=150)
    console.print(
        f"study {args.study}: {len(rows)} recorded trials, best {target:.2f}, "
        f"{sum(r.cost_s for r in rows) / 60:.1f} min measured; {args.runs} replays of {args.budget_min:g} min each; "
        f"reduction depth {'not recorded' if depth is None else f'{depth:.0f}'}",
        markup=False,
    )
    table = Table(title="time until the answer is worth 95% of the recorded best (replays with the recorded noise)")
    for column in ("strategy", "reached 95%", "median min to 95%", "p90 min", "worth at 25% of budget", "at 100%"):
        table.add_column(column)
    tally = LayoutTally()
    strategies = (
        "default",
        "int8-by-preparation-cost",
        "int8-by-cpu-alone",
        "quantized-first",
        "layout-round-first",
        "layout-round-after-coverage",
        "default-without-layout-round",
        "coverage-in-space-order",
        "default-relaunching-lost-families",
        "default-capping-repeats",
    )
    for strategy in (*strategies, "tpe", "random"):
        reached, quarter, end = [], [], []
        for seed in range(args.runs):
            curve = replay(strategy, recorded, rows, budget_s, isa, seed, tally, depth)
            hit = next((t for t, b in curve if b >= 0.95 * target), None)
            if hit is not None:
                reached.append(hit / 60)
            quarter.append(next((w for t, w in reversed(curve) if t <= budget_s / 4), 0.0) / target)
            end.append(curve[-1][1] / target if curve else 0.0)
        table.add_row(
            strategy,
            f"{len(reached)}/{args.runs}",
            f"{statistics.median(reached):.1f}" if reached else "-",
            f"{nearest_rank(reached, 0.9):.1f}" if reached else "-",
            f"{statistics.median(quarter):.0%}",
            f"{statistics.median(end):.0%}",
        )
    console.print(table)
    console.print(
        f"layout rounds (every strategy with one): {tally.exact} variant(s) answered by the recorded study's "
        "own measurement, "
        f"{tally.unrecorded} never measured there and counted as pruned at their leader's cost",
        markup=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

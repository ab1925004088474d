"""What a study found, as tables: the best configurations, and what went wrong grouped by cause.

Read from the stored study only (end of a search, `autotune show`), so it works on any machine that
reaches the storage.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import optuna
from rich.table import Table

from autotune.backends import engine_of
from autotune.common.errors import UserError
from autotune.machine.runtimes import MAIN
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.spec import StoredSpec
from autotune.results.best_json import choose_winner
from autotune.results.selection import (
    baseline_trial,
    clean_trials,
    is_server,
    metrics_of,
    primary_unit,
    primary_value,
    throughput_unit,
)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True)
class LeaderboardRow:
    """One clean trial as the leaderboard shows it (the show command's table and the HTML report)."""

    rank: int
    trial: int
    config: str
    throughput_sps: float | None
    p50_ms: float | None
    p99_ms: float | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    perplexity_increase: float | None
    drift: float | None
    speedup: float | None
    sustained_rps: float | None
    server_p99_ms: float | None
    max_wait_ms: float | None
    runtime: str
    baseline: bool
    split: str | None = None  # generation: "8 = 2 x 4", total sequences as instances x sequences each
    kl_divergence: float | None = None  # generation: mean KLD of the next-token distributions from FP32's
    same_top_token: float | None = None  # generation: share of positions whose top token is FP32's
    server_tpot_ms: float | None = None  # a language model's server: TPOT's quantile at the sustained rate

    def latency_columns(self, generation: bool, server: bool) -> tuple[float | None, ...]:
        """The columns beside throughput: TTFT and TPOT for generation, the sustained rate and what it
        took for the server scenario, one call's p50 and p99 otherwise."""
        if server and generation:  # a language model's server: TTFT and TPOT at the sustained rate
            return (self.sustained_rps, self.server_p99_ms, self.server_tpot_ms)
        if server:
            return (self.sustained_rps, self.server_p99_ms, self.max_wait_ms)
        if generation:
            return (self.ttft_p50_ms, self.tpot_p50_ms, self.tpot_p99_ms)
        return (self.p50_ms, self.p99_ms)


def leaderboard_rows(study: optuna.study.Study, top: int = 10) -> list[LeaderboardRow]:
    """The best clean trials in the study's direction, with the numbers a user compares them by."""
    baseline = baseline_trial(study)
    server = is_server(study)
    base_sps = (baseline.value if server else metrics_of(baseline).throughput_sps) if baseline else None
    rows = []
    for rank, trial in enumerate(clean_trials(study)[:top], start=1):
        metrics, attrs = metrics_of(trial), TrialAttrs.of(trial)
        sps = metrics.throughput_sps
        at_rate = metrics.server.at_sustained if metrics.server else None
        served = metrics.llm_server.at_sustained if metrics.llm_server else None  # a language model's server
        compared = metrics.sustained_rps if metrics.sustained_rps is not None else sps
        generation = metrics.generation
        rows.append(
            LeaderboardRow(
                rank=rank,
                trial=trial.number,
                config=attrs.config_summary or "",
                throughput_sps=sps,
                p50_ms=metrics.latency_ms.p50,
                p99_ms=metrics.latency_ms.p99,
                ttft_p50_ms=generation.ttft_ms.p50 if generation else None,
                tpot_p50_ms=generation.tpot_ms.p50 if generation else None,
                tpot_p99_ms=generation.tpot_ms.p99 if generation else None,
                perplexity_increase=metrics.drift.perplexity_increase if metrics.drift else None,
                kl_divergence=metrics.drift.kl_divergence if metrics.drift else None,
                same_top_token=metrics.drift.top1_agreement if metrics.drift and generation else None,
                drift=metrics.drift.relative_l2 if metrics.drift else None,
                speedup=compared / base_sps if compared and base_sps else None,
                sustained_rps=metrics.sustained_rps,
                server_p99_ms=at_rate.latency_ms.p99 if at_rate else served.load.ttft_ms.p99 if served else None,
                server_tpot_ms=served.load.tpot_ms.p99 if served else None,
                max_wait_ms=metrics.server.max_wait_ms if metrics.server else None,
                runtime=metrics.runtime.name if metrics.runtime else MAIN,
                baseline=attrs.baseline,
                split=attrs.config.split if generation and attrs.config else None,
            )
        )
    return rows


def leaderboard_table(study: optuna.study.Study, top: int = 10, rows: list[LeaderboardRow] | None = None) -> Table:
    table = Table(title=f"study {study.study_name}: best {top} clean configurations, one search measurement each")
    rows = rows if rows is not None else leaderboard_rows(study, top)
    generation = throughput_unit(study) == "tokens/s"
    server = is_server(study)
    latency: tuple[str, ...] = ("TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms") if generation else ("p50 ms", "p99 ms")
    if server and generation:  # the sustained rate within the TTFT and TPOT bounds; the offline speed beside it
        latency = ("requests/s", "TTFT p99 ms", "TPOT p99 ms", "offline tok/s")
    elif server:  # the sustained rate first; the closed-loop throughput and one call's latency beside it
        bound = StoredSpec.of(study).slo_ms
        latency = (f"requests/s at p99<={bound:g}ms", "p99 ms there", "wait ms", "closed-loop samples/s")
    split = ("sequences = instances x each",) if generation else ()
    columns = (
        "#",
        "trial",
        *split,
        "config",
        *(() if server else (throughput_unit(study),)),
        *latency,
        "drift (rel. L2)",
    )
    quality = ("KLD", "same top token", "ppl change") if generation else ()
    for column in (*columns, *quality, "vs baseline"):
        table.add_column(column, no_wrap=column != "config")
    for row in rows:
        values = row.latency_columns(generation, server) + ((row.throughput_sps,) if server else ())
        ppl = row.perplexity_increase
        table.add_row(
            str(row.rank),
            f"{row.trial}{' (baseline)' if row.baseline else ''}",
            *((row.split or "-",) if generation else ()),
            row.config,
            *(() if server else (_fmt(row.throughput_sps),)),
            *(_fmt(value) for value in values),
            "-" if row.drift is None else f"{row.drift:.2e}",
            *(
                (
                    "-" if row.kl_divergence is None else f"{row.kl_divergence:.2e}",
                    "-" if row.same_top_token is None else f"{row.same_top_token:.1%}",
                    "-" if ppl is None else f"{ppl:+.2%}",
                )
                if generation
                else ()
            ),
            "-" if row.speedup is None else f"{row.speedup:.2f}x",
        )
    return table


def cause_group(cause: str) -> str:
    """Causes that differ only in numbers (instance, pid, seconds, MiB, layer counts) fall in one group;
    digits that end a name (int8, f32, bf16) are not numbers."""
    return re.sub(r"(?<![A-Za-z\d])\d+(\.\d+)?", "N", cause)


@dataclass
class OutcomeGroup:
    """Failed or pruned trials whose causes differ only in numbers: the first one's cause as it was
    recorded (its numbers kept, as an example) and every trial number in the group."""

    state: str  # FAIL or PRUNED
    example: str
    trials: list[int] = field(default_factory=list)

    @property
    def trial_list(self) -> str:
        """The trial numbers, the first ones when there are many."""
        shown = ", ".join(map(str, self.trials[:MAX_LISTED_TRIALS]))
        return shown + (
            f" and {len(self.trials) - MAX_LISTED_TRIALS} more" if len(self.trials) > MAX_LISTED_TRIALS else ""
        )


MAX_LISTED_TRIALS = 8


def _outcome_cause(trial: optuna.trial.FrozenTrial) -> tuple[str, str]:
    """(group key, the trial's own cause) of a failed or pruned trial."""
    attrs = TrialAttrs.of(trial)
    if trial.state == optuna.trial.TrialState.FAIL:
        cause = (attrs.fail_cause or "unknown (no cause recorded)").splitlines()[0]
        return cause_group(cause), cause
    reason = (attrs.prune_reason or "pruned").splitlines()[0]
    for prefix, kind in PRUNE_KINDS:
        if reason.startswith(prefix):
            return kind, reason
    return cause_group(reason), reason


PRUNE_KINDS = (
    ("drift", "drift beyond the bound"),
    ("screening", "clearly slower at screening"),
    ("server:", "server: no rate sustained at the bound"),
)


def outcome_groups(study: optuna.study.Study) -> list[OutcomeGroup]:
    """FAIL causes, then PRUNED reasons, each grouped, the largest group first."""
    groups: dict[tuple[str, str], OutcomeGroup] = {}
    for trial in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
    ):
        key, cause = _outcome_cause(trial)
        group = groups.setdefault((trial.state.name, key), OutcomeGroup(trial.state.name, cause))
        group.trials.append(trial.number)
    order = {"FAIL": 0, "PRUNED": 1}
    return sorted(groups.values(), key=lambda g: (order[g.state], -len(g.trials)))


def outcome_table(study: optuna.study.Study) -> Table | None:
    groups = outcome_groups(study)
    if not groups:
        return None
    table = Table(title="failed and pruned trials, by cause (the first trial's cause shown)")
    for column in ("state", "count", "trials", "cause"):
        table.add_column(column, no_wrap=column not in ("cause", "trials"))
    for group in groups:
        table.add_row(group.state, str(len(group.trials)), group.trial_list, group.example)
    return table


def winner_lines(study: optuna.study.Study) -> list[str]:
    """What a user should read first: the winner as the finalist round re-measured it (median, range,
    clean runs, speedup over the baseline re-measured alike), or, without a round, its one search
    measurement labelled as such. Empty when nothing completed."""
    try:
        best, record, why = choose_winner(study)
    except UserError:
        return []
    unit = primary_unit(study)
    name = f"trial {best.number} {TrialAttrs.of(best).config_summary or ''}".rstrip()
    config = TrialAttrs.of(best).config
    if config is not None and throughput_unit(study) == "tokens/s":
        name += f" ({config.total_batch} sequences as {config.instances} x {config.batch_size})"
    candidate = record.entry(best.number) if record is not None else None
    summary = candidate.summary if candidate is not None else None
    if record is None or summary is None or summary.median is None:
        return [f"winner: {name}: {primary_value(best):.1f} {unit} from one search measurement ({why})"]
    base = record.baseline_median()
    speedup = f", {summary.median / base:.2f}x the baseline re-measured alike" if base and unit.endswith("/s") else ""
    runs = f"{summary.runs} clean runs of {summary.of_runs if summary.of_runs is not None else summary.runs}"
    return [
        f"winner: {name}: {summary.median:.1f} {unit} re-measured (median of {runs}, "
        f"{summary.min or 0.0:.1f}-{summary.max or 0.0:.1f}){speedup}; its search measurement was "
        f"{primary_value(best):.1f}",
        f"  {why}",
    ]


# On the study: the coverage trials and the layout round's splits the search holds back and releases one at
# a time (tuning/layouts.py).


HELD_WHY = "its coverage trial was still held when the search stopped (a longer --budget, the same command, runs it)"


def untried_engines(study: optuna.study.Study) -> dict[str, str]:
    """The engines the space offers that no trial launched, each with why: its coverage trial still held when
    the budget ended, or deferred (its preparation would not fit the time left). Engines as a user picks
    them (backends.engine_of: torchao apart for a language model)."""
    task = StoredSpec.of(study).task
    tried: set[str] = set()
    why: dict[str, str] = {}
    for trial in study.get_trials(deepcopy=False):
        attrs = TrialAttrs.of(trial)
        backend = attrs.config.backend if attrs.config else trial.params.get("backend")
        precision = attrs.config.precision if attrs.config else trial.params.get(f"{backend}.precision")
        if not isinstance(backend, str):
            continue
        engine = engine_of(backend, str(precision), task)
        if attrs.budget is not None or trial.state == optuna.trial.TrialState.COMPLETE:
            tried.add(engine)
        elif trial.user_attrs.get(Attr.DEFERRED):  # its reason says so (tuning/stage_times.deferral)
            why.setdefault(engine, attrs.prune_reason or "deferred")
        elif attrs.prune_reason:  # pruned before launching: the configuration it was to run could not
            why.setdefault(engine, f"its trial {trial.number} was not launched: {attrs.prune_reason}")
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    held = [
        *(plan.get("params") or {} for plan in study.user_attrs.get(Attr.COVERAGE_QUEUE) or []),
        *(t.system_attrs.get("fixed_params") or {} for t in waiting),  # enqueued, never asked for
    ]
    for params in held:
        backend = params.get("backend")
        if isinstance(backend, str):
            why.setdefault(engine_of(backend, str(params.get(f"{backend}.precision")), task), HELD_WHY)
    return {engine: reason for engine, reason in sorted(why.items()) if engine not in tried}


def study_summary(study: optuna.study.Study) -> str:
    """The trials by state, and the coverage trials and splits never released (the budget ran out first)."""
    counts = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    summary = f"{len(study.trials)} trials: " + ", ".join(
        f"{counts[s]} {s}" for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING") if counts[s]
    )
    untried = untried_engines(study)
    never = "; ".join(f"{engine}: {reason}" for engine, reason in untried.items())
    held = len(study.user_attrs.get(Attr.COVERAGE_QUEUE) or [])
    splits = len(study.user_attrs.get(Attr.LAYOUT_QUEUE) or [])
    return (
        summary
        + (f"; {held} coverage trial(s) not run yet" if held else "")
        + (f"; {splits} layout round split(s) not run yet" if splits else "")
        + (f"; engines never tried: {never}" if never else "")
    )

"""When a generation search first measured each engine, and how near its best it was by then: read from one
study (never changed), for the engine round's promise: within the first quarter of the budget every engine
the space offers has completed its most promising configuration, and the best so far is within 5% of the
search's best.

    .venv/bin/python docs/benchmarks/engine_coverage.py --study llm-t1 --studies-dir /tmp/bench/studies \
        [--started 2026-11-29T17:05:00] [--share 0.25]

The clock starts at `--started` (the search command's launch: the budget counts from there, the reference
outputs included) or at the first trial's start. An engine counts as measured at the completion of its first
trial that completed, or was pruned after it launched (screening, drift: it ran); engines as a user picks them
(autotune.backends.engine_of: torchao apart from the backend that runs it). The best so far is the best clean
trial's single search measurement at the study's winning total sequences. Writes
docs/results/engine-coverage-<study>-<date>.json (machine, commit, command, a row per engine, the curve).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rich.console import Console
from rich.table import Table
from search_budget import launch_time

from autotune.backends import engine_of
from autotune.records.attributes import TrialAttrs
from autotune.records.spec import StoredSpec, default_storage
from autotune.results.leaderboard import untried_engines
from autotune.results.selection import clean_trials, sequences_total

NEAR_BEST = 0.95  # "within 5% of the search's best"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    parser.add_argument("--started", help="ISO time the search was launched (default: its first trial's start)")
    parser.add_argument("--share", type=float, default=0.25, help="the share of the budget checked (default 0.25)")
    parser.add_argument("--out", help="results file (default docs/results/engine-coverage-<study>-<today>.json)")
    return parser


def first_measured(study: optuna.study.Study, started: datetime.datetime) -> dict[str, dict]:
    """Each engine's first trial that ran (completed, or pruned or failed after launching): when it ended
    (seconds since the launch), its number, state and configuration."""
    task = StoredSpec.of(study).task
    firsts: dict[str, dict] = {}
    ended = sorted((t for t in study.trials if t.datetime_complete is not None), key=lambda t: t.datetime_complete)
    for trial in ended:
        attrs = TrialAttrs.of(trial)
        if attrs.config is None or (trial.state.name != "COMPLETE" and attrs.budget is None):
            continue  # never launched: not measured
        engine = engine_of(attrs.config.backend, attrs.config.precision, task)
        firsts.setdefault(
            engine,
            {
                "at_s": (trial.datetime_complete - started).total_seconds(),
                "trial": trial.number,
                "state": trial.state.name,
                "config": attrs.config_summary,
                "value": trial.values[0] if trial.values else None,
                "why": attrs.prune_reason or attrs.fail_cause,
            },
        )
    return firsts


def curve_at_total(study: optuna.study.Study, started: datetime.datetime, total: int | None) -> list[list[float]]:
    """(seconds since the launch, best clean value so far) at each clean trial of `total` sequences."""
    clean = sorted(clean_trials(study, total), key=lambda t: t.datetime_complete)
    curve: list[list[float]] = []
    for trial in clean:
        best = max(trial.values[0], curve[-1][1] if curve else 0.0)
        curve.append([(trial.datetime_complete - started).total_seconds(), best])
    return curve


def main() -> int:
    args = build_parser().parse_args()
    study = optuna.load_study(study_name=args.study, storage=default_storage(args.studies_dir, args.study))
    spec = study.user_attrs.get("spec") or {}
    budget_s = float(spec.get("budget_s") or 0.0)
    started = launch_time(study, args.started)
    leading = clean_trials(study)[:1]
    total = sequences_total(leading[0]) if leading else None
    curve = curve_at_total(study, started, total)
    mark = args.share * budget_s
    best = curve[-1][1] if curve else None
    by_mark = max((value for at, value in curve if at <= mark), default=None)
    firsts = first_measured(study, started)
    console = Console(width=160)
    table = Table(title=f"{args.study}: each engine's first measured trial ({budget_s / 60:.0f}-minute budget)")
    for column in ("engine", "ended at min", "in the first quarter", "trial", "state", "tokens/s", "config"):
        table.add_column(column)
    for engine, first in sorted(firsts.items(), key=lambda item: item[1]["at_s"]):
        table.add_row(
            engine,
            f"{first['at_s'] / 60:.1f}",
            "yes" if first["at_s"] <= mark else "no",
            str(first["trial"]),
            first["state"],
            "-" if first["value"] is None else f"{first['value']:.1f}",
            first["config"] or "",
        )
    console.print(table)
    untried = untried_engines(study)
    for engine, why in untried.items():
        console.print(f"never tried: {engine}: {why}", markup=False)
    near = by_mark / best if by_mark and best else None
    console.print(
        f"best so far at {mark / 60:.1f} min ({args.share:.0%} of the budget), {total} sequences in all: "
        f"{by_mark or 0:.1f} tokens/s, {near or 0:.1%} of the search's best {best or 0:.1f}"
        f" ({'within' if near and near >= NEAR_BEST else 'not within'} 5%)",
        markup=False,
    )
    from results import write_results

    rows = [
        {
            "row": f"{engine}: first measured at {first['at_s'] / 60:.1f} min (#{first['trial']}, {first['state']})",
            "value": first["value"],
            "engine": engine,
            **first,
        }
        for engine, first in sorted(firsts.items(), key=lambda item: item[1]["at_s"])
    ]
    rows.append({"row": "the search's best (its single measurement)", "value": best, "line": "the search's best"})
    in_quarter = [engine for engine, first in firsts.items() if first["at_s"] <= mark]
    texts = [
        f"engines measured within {mark / 60:.1f} min ({args.share:.0%} of the budget): {', '.join(sorted(in_quarter))}"
        + (f"; after it: {', '.join(sorted(set(firsts) - set(in_quarter)))}" if set(firsts) - set(in_quarter) else "")
        + (f"; never tried: {', '.join(untried)}" if untried else ""),
        f"best so far at {mark / 60:.1f} min: {by_mark or 0:.1f} tokens/s, {near or 0:.1%} of the search's best "
        f"{best or 0:.1f} ({'within' if near and near >= NEAR_BEST else 'not within'} 5%)",
    ]
    out = write_results(
        f"engine-coverage-{args.study}",
        "a generation search's engine round: when each engine was first measured, and the best so far",
        {"study": args.study, "total sequences": total, "budget minutes": budget_s / 60},
        rows,
        args.out,
        targets=[{"text": text} for text in texts],
        best_so_far={"study": args.study, "budget_s": budget_s, "points": curve},
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How fast a search gets near its best: a short search's best-so-far against time, next to a longer
reference search of the same model on the same machine.

Both studies are read from their storages (never changed). The clock starts at `--started` (the moment
the search command was launched: the budget counts from there, reference outputs included) or, without
it, at the first trial's start. A trial counts when it completed with a clean measurement (not flagged
as noisy), at its completion time; its value is the search's single measurement of it (samples/s,
requests/s or tokens/s), so the curve and the target carry each measurement's noise (the table shows
each trial's stated interval). The target is 95% of the reference study's best clean trial.

    .venv/bin/python docs/bench_budget.py --study vit20 --studies-dir /tmp/b18/vit20/studies \
        --reference vit60 --reference-dir /tmp/b18/vit60/studies [--started 2026-11-23T20:09:54]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rich.console import Console
from rich.table import Table

from autotune.results.selection import clean_trials
from autotune.search.spec import default_storage

TARGET_SHARE = 0.95


def _load(name: str, studies_dir: str) -> optuna.study.Study:
    return optuna.load_study(study_name=name, storage=default_storage(studies_dir, name))


def _family(trial: optuna.trial.FrozenTrial) -> str:
    config = trial.user_attrs.get("config") or {}
    return f"{config.get('backend', '?')} {config.get('precision', '?')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    parser.add_argument("--reference", required=True, help="the longer search of the same model")
    parser.add_argument("--reference-dir", default="studies")
    parser.add_argument("--started", help="ISO time the short search was launched (default: its first trial's start)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    short, reference = _load(args.study, args.studies_dir), _load(args.reference, args.reference_dir)
    reference_clean = clean_trials(reference)
    if not reference_clean:
        parser.error(f"study {args.reference} has no clean completed trial")
    reference_best = reference_clean[0]
    target = reference_best.values[0]
    starts = [t.datetime_start for t in short.trials if t.datetime_start is not None]
    if not starts:
        parser.error(f"study {args.study} has not started a trial")
    started = datetime.datetime.fromisoformat(args.started) if args.started else min(starts)
    if started.tzinfo is not None:  # Optuna stores local times without a zone
        started = started.astimezone().replace(tzinfo=None)
    budget_s = float((short.user_attrs.get("spec") or {}).get("budget_s") or 0.0)
    clean = {t.number for t in clean_trials(short)}

    console = Console(width=160)
    table = Table(title=f"{args.study}: best so far against the clock (target: 95% of {args.reference}'s best)")
    for column in ("min", "% budget", "trial", "configuration", "value", "± (95%)", "best so far", "% of ref best"):
        table.add_column(column)
    best, reached_s, first_int8_s = 0.0, None, None
    done = sorted(
        (t for t in short.trials if t.datetime_complete is not None and t.state.name in ("COMPLETE", "PRUNED", "FAIL")),
        key=lambda t: t.datetime_complete,
    )
    for trial in done:
        at = (trial.datetime_complete - started).total_seconds()
        value = trial.values[0] if trial.number in clean and trial.values else None
        if value is not None:
            best = max(best, value)
            if reached_s is None and best >= TARGET_SHARE * target:
                reached_s = at
            if first_int8_s is None and (trial.user_attrs.get("config") or {}).get("precision") == "int8":
                first_int8_s = at
        ci_rel = (trial.user_attrs.get("measurement") or {}).get("throughput_ci_rel")
        outcome = f"{value:.2f}" if value is not None else trial.state.name.lower()
        if value is None and trial.state.name == "COMPLETE":
            outcome = "noisy"
        table.add_row(
            f"{at / 60:.1f}",
            f"{at / budget_s:.0%}" if budget_s else "-",
            str(trial.number),
            trial.user_attrs.get("config_summary", _family(trial)),
            outcome,
            f"{ci_rel:.1%}" if ci_rel and value is not None else "",
            f"{best:.2f}" if best else "-",
            f"{best / target:.0%}" if best else "-",
        )
    console.print(table)
    reference_budget = float((reference.user_attrs.get("spec") or {}).get("budget_s") or 0.0)
    console.print(
        f"reference {args.reference} ({reference_budget / 60:.0f} min): best {target:.2f}, trial "
        f"{reference_best.number} {reference_best.user_attrs.get('config_summary', '')}",
        markup=False,
    )
    if reached_s is None:
        console.print(f"{args.study} never reached 95% of it (best {best:.2f}, {best / target:.0%})", markup=False)
    else:
        share = f" = {reached_s / budget_s:.0%} of its {budget_s / 60:.0f}-minute budget" if budget_s else ""
        console.print(f"{args.study} reached 95% of it at {reached_s / 60:.1f} min{share}", markup=False)
    if first_int8_s is not None:
        console.print(f"first clean int8 measurement at {first_int8_s / 60:.1f} min", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How fast a search gets near its best: a short search's best-so-far against time, next to a longer
reference search of the same model on the same machine.

Both studies are read from their storages (never changed). The clock starts at `--started` (the moment
the search command was launched: the budget counts from there, reference outputs included) or, without
it, at the first trial's start. A trial counts when it completed with a clean measurement (not flagged
as noisy), at its completion time; its value is the search's single measurement of it (samples/s,
requests/s or tokens/s), so the curve and the target carry each measurement's noise (the table shows
each trial's stated interval). The target is 95% of the reference study's best clean trial; when the
reference ran a finalist round, also 95% of its fastest finalist's median over the round's interleaved
runs (the best single measurement of many noisy trials runs high: the top of many draws).

    .venv/bin/python docs/benchmarks/search_budget.py --study vit20 --studies-dir /tmp/b18/vit20/studies \
        --reference vit60 --reference-dir /tmp/b18/vit60/studies [--started 2026-11-23T20:09:54]
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

from autotune.records.spec import default_storage
from autotune.results.selection import clean_trials

TARGET_SHARE = 0.95


def _load(name: str, studies_dir: str) -> optuna.study.Study:
    return optuna.load_study(study_name=name, storage=default_storage(studies_dir, name))


def _family(trial: optuna.trial.FrozenTrial) -> str:
    config = trial.user_attrs.get("config") or {}
    return f"{config.get('backend', '?')} {config.get('precision', '?')}"


def best_finalist(study: optuna.study.Study) -> tuple[int, float, int] | None:
    """The fastest configuration of the study's finalist round by its median over interleaved runs (trial,
    median, clean runs), or None without a round: a target that a lucky single measurement does not set."""
    record = study.user_attrs.get("finalists") or {}
    medians = [
        (c["trial"], summary["median"], summary.get("runs", 0))
        for c in record.get("candidates", [])
        if c.get("candidate") and (summary := c.get("summary") or {}).get("median") is not None
    ]
    return max(medians, key=lambda item: item[1]) if medians else None


def _reached(name: str, curve: list[tuple[float, float]], target: float, budget_s: float) -> str:
    """When the best so far first reached TARGET_SHARE of `target`, as a sentence."""
    at = next((t for t, best in curve if best >= TARGET_SHARE * target), None)
    best = curve[-1][1] if curve else 0.0
    if at is None:
        return f"{name} never reached 95% of {target:.2f} (best {best:.2f}, {best / target:.0%})"
    share = f" = {at / budget_s:.0%} of its {budget_s / 60:.0f}-minute budget" if budget_s else ""
    return f"{name} reached 95% of {target:.2f} at {at / 60:.1f} min{share}"


def completed_in_order(study: optuna.study.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that ended (completed, pruned or failed), in the order they ended."""
    return sorted(
        (t for t in study.trials if t.datetime_complete is not None and t.state.name in ("COMPLETE", "PRUNED", "FAIL")),
        key=lambda t: t.datetime_complete,
    )


def launch_time(study: optuna.study.Study, started: str | None) -> datetime.datetime:
    """When the search was launched (`started`, ISO) or else its first trial's start, in Optuna's local,
    zone-less times."""
    starts = [t.datetime_start for t in study.trials if t.datetime_start is not None]
    if not starts:
        raise SystemExit(f"study {study.study_name} has not started a trial")
    moment = datetime.datetime.fromisoformat(started) if started else min(starts)
    return moment.astimezone().replace(tzinfo=None) if moment.tzinfo is not None else moment


def best_so_far(study: optuna.study.Study, started: datetime.datetime) -> list[tuple[float, float]]:
    """(seconds since the launch, best clean value so far) at each clean trial's completion."""
    clean = {t.number for t in clean_trials(study)}
    curve: list[tuple[float, float]] = []
    for trial in completed_in_order(study):
        if trial.number in clean and trial.values:
            best = max(trial.values[0], curve[-1][1] if curve else 0.0)
            curve.append(((trial.datetime_complete - started).total_seconds(), best))
    return curve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    parser.add_argument("--reference", required=True, help="the longer search of the same model")
    parser.add_argument("--reference-dir", default="studies")
    parser.add_argument("--started", help="ISO time the short search was launched (default: its first trial's start)")
    parser.add_argument("--out", help="results file (default docs/results/search-budget-<study>-<today>.json)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    short, reference = _load(args.study, args.studies_dir), _load(args.reference, args.reference_dir)
    reference_clean = clean_trials(reference)
    if not reference_clean:
        parser.error(f"study {args.reference} has no clean completed trial")
    reference_best = reference_clean[0]
    target = reference_best.values[0]
    started = launch_time(short, args.started)
    budget_s = float((short.user_attrs.get("spec") or {}).get("budget_s") or 0.0)
    clean = {t.number for t in clean_trials(short)}

    console = Console(width=160)
    table = Table(title=f"{args.study}: best so far against the clock (target: 95% of {args.reference}'s best)")
    for column in ("min", "% budget", "trial", "configuration", "value", "± (95%)", "best so far", "% of ref best"):
        table.add_column(column)
    best, first_int8_s = 0.0, None
    curve = best_so_far(short, started)
    for trial in completed_in_order(short):
        at = (trial.datetime_complete - started).total_seconds()
        value = trial.values[0] if trial.number in clean and trial.values else None
        if value is not None:
            best = max(best, value)
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
    console.print(_reached(args.study, curve, target, budget_s), markup=False)
    remeasured = best_finalist(reference)
    if remeasured is not None:
        number, median, runs = remeasured
        console.print(
            f"reference {args.reference}'s best re-measured: #{number}, median {median:.2f} of {runs} interleaved "
            f"finalist runs (its single best measurement is the top of {len(reference_clean)} noisy ones)",
            markup=False,
        )
        console.print(_reached(args.study, curve, median, budget_s), markup=False)
    if first_int8_s is not None:
        console.print(f"first clean int8 measurement at {first_int8_s / 60:.1f} min", markup=False)
    spec = short.user_attrs.get("spec") or {}
    unit = "tokens/s" if spec.get("task") == "generate" else "requests/s" if spec.get("slo_ms") else "samples/s"
    reached = [_reached(args.study, curve, target, budget_s)]
    rows = [
        {"row": f"{args.study}: best clean trial", "value": best or None, "runs": [best] if best else []},
        {"row": f"{args.reference}: best clean trial", "value": target, "runs": [target], "line": "reference's best"},
        {"row": "the target: 95% of the reference's best", "value": TARGET_SHARE * target, "line": "95% of it"},
    ]
    if remeasured is not None:
        rows.append({"row": f"{args.reference}: fastest finalist's median", "value": remeasured[1], "runs": []})
        reached.append(_reached(args.study, curve, remeasured[1], budget_s))
    from results import write_results

    out = write_results(
        f"search-budget-{args.study}",
        f"How fast a search gets near its best: {args.study} against the longer {args.reference}",
        {
            "study": args.study,
            "budget": f"{budget_s / 60:.0f} min",
            "reference": args.reference,
            "reference budget": f"{reference_budget / 60:.0f} min",
        },
        rows,
        args.out,
        unit=unit,
        targets=[{"text": text} for text in reached],
        best_so_far={"study": args.study, "budget_s": budget_s, "points": [[round(t, 1), v] for t, v in curve]},
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

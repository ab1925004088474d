"""Several exported winners re-measured side by side, interleaved: which search found the faster answer.

Searches run at different times on a shared machine are not comparable by their own numbers (the same
baseline measured 2.5 and 4.5 samples/s an hour apart on one machine). This re-measures each best.json's
winner (and, with `--baseline`, the eager fp32 baseline of the first one) in fresh processes by the
search's own protocol (autotune.runner.trials.run_config, as `autotune verify` does), once per round, the
runs interleaved (A, B, C, A, B, C, ... as `autotune compare` and `bench` do); runs flagged as noisy
are left out of the medians. Ratios are of medians from this one run. Writes
docs/results/winners-<model>-<date>.json for the summary page.

    .venv/bin/python docs/benchmarks/winners_side_by_side.py --best r20=/tmp/b18/r20/studies/r20/best.json \
        --best r60=/tmp/b18/r60/studies/r60/best.json --baseline --rounds 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rich.console import Console

from autotune.common.errors import UserError
from autotune.remeasure.bench import config_measure, measure_side_by_side, median_throughput, print_results
from autotune.remeasure.context import context_from_best
from autotune.results.best_json import read_best

OBJECTIVES = (None, "throughput", "server")  # what a re-measurement compares (as `autotune verify`)


def parse_bests(entries: list[str]) -> list[tuple[str, Path]]:
    """LABEL=PATH pairs, labels unique and not the baseline's."""
    bests: list[tuple[str, Path]] = []
    for entry in entries:
        label, sep, path = entry.partition("=")
        if not sep or not label or not path:
            raise UserError(f"--best {entry!r}: expected LABEL=PATH")
        if label == "baseline" or label in (known for known, _ in bests):
            raise UserError(f"--best {entry!r}: the label {label!r} is taken; give each winner its own")
        bests.append((label, Path(path)))
    return bests


def side_by_side(bests: list[tuple[str, Path]], with_baseline: bool) -> tuple[dict[str, Any], dict[str, str], str]:
    """The measurements to interleave (each winner in its own study's context), their settings, the model."""
    measures: dict[str, Any] = {}
    settings: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for label, path in bests:
        best = read_best(path)
        objective = best.objective.name
        if objective not in OBJECTIVES:
            raise UserError(f"{path} was tuned for {objective}; this compares throughput or a sustained rate")
        seen.add((best.model.name if best.model else "?", objective or "throughput"))
        if len(seen) > 1:
            raise UserError(f"{path} is another model or objective than the first: compare like with like")
        ctx = context_from_best(best)
        config = best.config
        measures[label], settings[label] = config_measure(config, ctx), config.summary()
        if with_baseline and "baseline" not in measures:
            baseline = best.baseline.config if best.baseline else None
            if baseline is None:
                raise UserError(f"{path} names no baseline configuration: run without --baseline")
            config = baseline
            measures["baseline"], settings["baseline"] = config_measure(config, ctx), config.summary()
    return measures, settings, next(iter(seen))[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--best", action="append", required=True, help="LABEL=PATH of a best.json (repeat)")
    parser.add_argument("--baseline", action="store_true", help="also the first best.json's eager fp32 baseline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default="studies/bench_winners", help="where the runs' files go")
    parser.add_argument("--out", help="results file (default docs/results/winners-<model>-<today>.json)")
    args = parser.parse_args()
    console = Console(width=170)  # read from a file too: a generation table has ten columns
    try:
        if args.rounds < 1:
            raise UserError(f"--rounds {args.rounds}: expected at least 1")
        measures, settings, model = side_by_side(parse_bests(args.best), args.baseline)
    except UserError as exc:
        print(f"bench_winners: error: {exc}", file=sys.stderr)
        return 2
    runs = measure_side_by_side(measures, args.rounds, Path(args.work), console)
    title = f"{model}: winners re-measured, {args.rounds} interleaved rounds"
    print_results(console, title, settings, runs, ["baseline"] if args.baseline else [])
    from results import side_by_side_row, write_results

    references = {"baseline": median_throughput(runs.get("baseline", []))}
    rows = [
        side_by_side_row(
            f"{label}: {settings[label]}",
            measured,
            references,
            measured[0].drift.relative_l2 if measured and measured[0].drift else None,
        )
        for label, measured in runs.items()
    ]
    unit = next((r.unit for measured in runs.values() for r in measured), "samples/s")
    out = write_results(
        f"winners-{model}",
        f"{model}: search winners re-measured side by side",
        {"model": model, "interleaved rounds": args.rounds},
        rows,
        args.out,
        unit="requests/s sustained" if unit == "requests/s" else unit,
        ratio_to="baseline",
        bests={label: str(path) for label, path in parse_bests(args.best)},
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

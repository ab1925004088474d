"""Several exported winners re-measured side by side, round-robin: which search found the faster answer.

Searches run at different times on a shared machine are not comparable by their own numbers (the same
baseline measured 2.5 and 4.5 samples/s an hour apart on one machine). This re-measures each best.json's
winner (and, with `--baseline`, the eager fp32 baseline of the first one) in fresh processes by the
search's own protocol (autotune.runner.trials.run_config, as `autotune verify` does), once per round, the
order rotated each round so no configuration always runs first; runs flagged as noisy are left out of
the medians. Ratios are of medians from this one run.

    .venv/bin/python docs/bench_winners.py --best r20=/tmp/b18/r20/studies/r20/best.json \
        --best r60=/tmp/b18/r60/studies/r60/best.json --baseline --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rich.console import Console
from rich.table import Table

from autotune.checks.verify import TIMEOUT_S, value_of
from autotune.common.errors import TrialFailed, UserError
from autotune.records.config import TrialConfig
from autotune.results.best_json import context_from_best, read_best
from autotune.runner.trials import TrialContext, run_config


@dataclass
class Contender:
    """One configuration to re-measure, with the context (reference, caches, settings) of its best.json."""

    label: str
    config: TrialConfig
    ctx: TrialContext
    values: list[float] = field(default_factory=list)
    noisy: int = 0
    failed: str | None = None


def contenders(bests: list[tuple[str, Path]], with_baseline: bool) -> list[Contender]:
    out = []
    for i, (label, path) in enumerate(bests):
        best: dict[str, Any] = read_best(path)
        ctx = context_from_best(best)
        out.append(Contender(label, TrialConfig.from_dict(best["config"]), ctx))
        if with_baseline and i == 0:
            baseline = (best.get("baseline") or {}).get("config")
            if baseline is None:
                raise UserError(f"{path} names no baseline configuration: run without --baseline")
            out.append(Contender("baseline", TrialConfig.from_dict(baseline), ctx))
    return out


def measure_rounds(items: list[Contender], rounds: int, scratch: Path, console: Console) -> None:
    for r in range(rounds):
        shift = r % len(items)
        for item in items[shift:] + items[:shift]:
            if item.failed:
                continue
            try:
                metrics = run_config(
                    item.config, item.ctx, scratch / f"{item.label}-{r}", TIMEOUT_S, server_round=r + 1
                )[0]
            except TrialFailed as exc:
                item.failed = exc.cause
                console.print(f"round {r + 1}: {item.label} failed: {exc.cause}", markup=False)
                continue
            if metrics.valid:
                item.values.append(value_of(metrics))
            else:
                item.noisy += 1
            console.print(f"round {r + 1}: {item.label} {value_of(metrics):.2f}{metrics.noisy_note()}", markup=False)


def report(items: list[Contender], rounds: int, console: Console) -> None:
    reference = next((i for i in items if i.label == "baseline" and i.values), None)
    table = Table(title=f"winners re-measured round-robin, {rounds} rounds (medians of the clean runs)")
    for column in ("label", "configuration", "clean runs", "median", "min-max", "vs baseline"):
        table.add_column(column)
    for item in items:
        if not item.values:
            table.add_row(item.label, item.config.summary(), "0", item.failed or "all noisy", "", "")
            continue
        median = statistics.median(item.values)
        ratio = f"{median / statistics.median(reference.values):.2f}x" if reference else ""
        table.add_row(
            item.label,
            item.config.summary(),
            f"{len(item.values)} ({item.noisy} noisy)",
            f"{median:.2f}",
            f"{min(item.values):.2f}-{max(item.values):.2f}",
            ratio,
        )
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--best", action="append", required=True, help="LABEL=PATH of a best.json (repeat)")
    parser.add_argument("--baseline", action="store_true", help="also the first best.json's eager fp32 baseline")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    console = Console()
    try:
        bests = []
        for entry in args.best:
            label, sep, path = entry.partition("=")
            if not sep or not label or not path:
                raise UserError(f"--best {entry!r}: expected LABEL=PATH")
            bests.append((label, Path(path)))
        if args.rounds < 1:
            raise UserError(f"--rounds {args.rounds}: expected at least 1")
        items = contenders(bests, args.baseline)
    except UserError as exc:
        print(f"bench_winners: error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="autotune-winners-") as scratch:
        measure_rounds(items, args.rounds, Path(scratch), console)
    report(items, args.rounds, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

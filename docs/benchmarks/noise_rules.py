"""Which of a study's multi-instance measurements the drift check flags, one instance at a time or the
instances together, from the call stamps the study kept.

A measurement of several instances is judged for drift by their combined time per call over the common
window (stopwatch.combined_early_late); before, by each instance's own calls, which flagged instances
that traded speed with a steady sum. This re-judges every attempt of a finished study both ways, from
its stamps files (trials/NNNNN/stamps-*.npy and retry-*/), with the default limits:

    .venv/bin/python docs/benchmarks/noise_rules.py --study r60 --studies-dir studies

Only the drift rule is re-judged: the other signals (foreign CPU, steal, spread, run queue) are the
same under both rules and are not repeated here.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from rich.console import Console
from rich.table import Table

from autotune.measure.noise import NoiseLimits, noise_flags
from autotune.measure.stopwatch import combined_early_late, common_window_throughput, latency_summary
from autotune.tuning.space import family


def attempt_dirs(trials_dir: Path) -> list[Path]:
    """Every measurement attempt with two or more instances' stamps, in trial order."""
    found = []
    for trial_dir in sorted(p for p in trials_dir.iterdir() if p.is_dir()):
        for attempt in [trial_dir, *sorted(trial_dir.glob("retry-*"))]:
            if len(list(attempt.glob("stamps-*.npy"))) > 1:
                found.append(attempt)
    return found


def drift_flags(instances: list[dict[str, Any]], combined: float | None, limits: NoiseLimits) -> list[str]:
    """The drift flags of one attempt: judged together with its combined drift, one by one without."""
    return [f for f in noise_flags(instances, None, None, len(instances), limits, combined) if "drifted" in f]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", type=Path, default=Path("studies"))
    args = parser.parse_args()
    study_dir = args.studies_dir / args.study
    if not (study_dir / "study.db").is_file() or not (study_dir / "trials").is_dir():
        parser.error(f"no study {args.study!r} with kept trials under {args.studies_dir}: pass --studies-dir")
    study = optuna.load_study(study_name=args.study, storage=f"sqlite:///{study_dir / 'study.db'}")
    params = {t.number: t.params for t in study.get_trials(deepcopy=False)}
    limits = NoiseLimits()
    table = Table(title=f"{args.study}: drift flags of its multi-instance attempts, two rules")
    for column in ("attempt", "config", "per instance", "flagged one by one", "together", "flagged together"):
        table.add_column(column)
    counts = {"one by one": 0, "together": 0, "attempts": 0}
    for attempt in attempt_dirs(study_dir / "trials"):
        stamps = [np.load(p) for p in sorted(attempt.glob("stamps-*.npy"))]
        window = common_window_throughput(stamps, batch_size=1)
        combined = combined_early_late(stamps, window.start, window.end) if window.valid else None
        summaries = [latency_summary(s[:, 1] - s[:, 0]) for s in stamps]
        instances = [{"signals": {}, "latency": summary} for summary in summaries]
        alone, together = drift_flags(instances, None, limits), drift_flags(instances, combined, limits)
        trial_dir = attempt if attempt.name.isdigit() else attempt.parent
        p = params.get(int(trial_dir.name), {})
        backend, precision = family(p)
        config = f"{backend}/{precision} bs={p.get('batch_size')} {len(stamps)} instances"
        counts["attempts"] += 1
        counts["one by one"] += bool(alone)
        counts["together"] += bool(together)
        table.add_row(
            str(attempt.relative_to(study_dir / "trials")),
            config,
            ", ".join("-" if s.early_late_rel is None else f"{s.early_late_rel:+.0%}" for s in summaries),
            "yes" if alone else "",
            "-" if combined is None else f"{combined:+.1%}",
            "yes" if together else "",
        )
    console = Console(width=160)
    console.print(table)
    console.print(
        f"{counts['attempts']} attempts with several instances: {counts['one by one']} flagged for drift "
        f"one instance at a time, {counts['together']} judged together (limit {limits.max_early_late_rel:.0%})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

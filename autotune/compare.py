"""Side-by-side re-measurement of the exported winner against the eager fp32 baseline.

Both run in fresh processes, alternating (baseline, winner, baseline, winner, ...) so that slow drifts
of a shared machine hit both alike; the table reports medians and their ratio.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from autotune.config import TrialConfig
from autotune.errors import TrialFailed, UserError
from autotune.files import read_json
from autotune.measure import MeasureSettings
from autotune.models import ModelSource
from autotune.probe import probe_machine
from autotune.trials import Reference, run_config


def compare_with_baseline(best_path: Path, repeats: int, console: Console, timeout_s: float = 900) -> dict[str, Any]:
    try:
        best = read_json(best_path)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {best_path}: {exc}") from None
    if not best.get("baseline"):
        raise UserError(f"{best_path} has no baseline trial to compare with")
    job = best["job"]
    machine = probe_machine()
    reference = Reference(Path(job["reference_path"]), ModelSource.from_dict(job["model"]))
    measure = MeasureSettings.from_dict(job["measure"])
    configs = {"baseline": TrialConfig.from_dict(best["baseline"]["config"]), "winner": TrialConfig.from_dict(best["config"])}
    runs: dict[str, list[float]] = {name: [] for name in configs}
    work = best_path.parent / "compare"
    for repeat in range(repeats):
        for name, config in configs.items():
            try:
                metrics, _ = run_config(config, machine, reference, measure, work / f"{repeat}-{name}", Path(job["workdir"]), timeout_s)
            except TrialFailed as exc:
                raise UserError(f"{name} failed to run: {exc.cause}") from None
            runs[name].append(metrics["throughput_sps"])
            console.print(f"repeat {repeat + 1}/{repeats} {name:<8} {metrics['throughput_sps']:8.2f} samples/s", markup=False)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    table = Table(title=f"{best['model']['name']} {'x'.join(map(str, best['model']['input_shape']))}: {repeats} alternating runs each")
    for column in ("", "config", "median samples/s", "min", "max", "vs baseline"):
        table.add_column(column)
    for name, config in configs.items():
        values = runs[name]
        table.add_row(name, config.summary(), f"{medians[name]:.2f}", f"{min(values):.2f}", f"{max(values):.2f}",
                      f"{medians[name] / medians['baseline']:.2f}x")
    console.print(table)
    return {"runs": runs, "medians": medians, "ratio": medians["winner"] / medians["baseline"]}

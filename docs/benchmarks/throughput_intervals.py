"""Each trial's throughput interval as recorded, next to the one the current code computes from the same
recorded call stamps: what a change to the interval does to studies already measured, without running
them again.

A trial's stamps (each instance's [start, end] per timed call, `stamps-N.npy` in its trial folder) are
read back and counted through `common_window_throughput` as the trial's measurement counted them; the
study itself is never changed.

    .venv/bin/python docs/benchmarks/throughput_intervals.py --study g60 --studies-dir /tmp/b26/g60/studies
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rich.console import Console
from rich.table import Table

from autotune.measure.stopwatch import BATCH_MEANS_METHOD, CALL_RATES_METHOD, common_window_throughput
from autotune.records.spec import default_storage

METHODS = {BATCH_MEANS_METHOD: "batch means", CALL_RATES_METHOD: "whole calls' rates"}


def _percent(value: float | None) -> str:
    return "-" if value is None else f"±{value:.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name=args.study, storage=default_storage(args.studies_dir, args.study))
    table = Table(title=f"study {args.study}: throughput intervals, recorded and recomputed from the stamps")
    for column in ("trial", "config", "calls per instance", "rate", "recorded", "now", "method now"):
        table.add_column(column)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        measurement = trial.user_attrs.get("measurement") or {}
        per_call = measurement.get("samples_per_call")
        stamps = [np.load(path) for path in measurement.get("stamps") or [] if Path(path).exists()]
        if not (per_call and stamps):
            continue
        window = common_window_throughput(stamps, per_call)
        table.add_row(
            str(trial.number),
            str(trial.user_attrs.get("config_summary", ""))[:48],
            ", ".join(str(len(s)) for s in stamps),
            f"{window.throughput_sps:.1f}",
            _percent(measurement.get("throughput_ci_rel")),
            _percent(window.ci_rel),
            METHODS.get(window.ci_method, "none"),
        )
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

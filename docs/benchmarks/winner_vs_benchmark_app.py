"""A search's winner against what a user would run instead: its eager fp32 baseline, OpenVINO's
`benchmark_app -hint throughput` on the NNCF int8 IR (one command), and the winner timed by benchmark_app
itself as tuned (an independent stopwatch), interleaved in one run, as `autotune compare --independent
--vs-benchmark-app` measures them; and the search's best-so-far against time from its study. Writes
docs/results/<study>-<date>.json for the summary page (a table, a bar chart, the best-so-far curve).

Medians of the clean runs (runs flagged noisy are counted, not averaged in); ratios of medians from this one
run. Drift: the winner's and the baseline's as the search measured them (relative L2 of the outputs against
FP32 eager on the study's evaluation inputs); benchmark_app's row runs the same int8 IR the search builds
for `openvino int8`, whose drift the search measured when it tried that configuration.

    .venv/bin/autotune search --model resnet50 --budget 20m --study resnet50-icelake
    .venv/bin/python docs/benchmarks/winner_vs_benchmark_app.py --study resnet50-icelake --repeats 3 \\
        --started 2026-11-28T13:48:00Z
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rich.console import Console

from autotune.common.durations import parse_duration
from autotune.common.errors import UserError
from autotune.records.spec import default_storage, study_dir
from autotune.remeasure.bench import (
    BASELINE_ROW,
    INDEPENDENT_ROW,
    ONE_COMMAND_ROW,
    WINNER_ROW,
    compare_with_baseline,
    median_throughput,
)
from autotune.results.best_json import read_best


def int8_ir_drift(study: optuna.study.Study) -> float | None:
    """The drift the search measured for OpenVINO int8 (the IR benchmark_app's row loads): the median over
    the trials that measured it, or None when the search never tried it."""
    drifts = [
        d
        for t in study.trials
        if (t.user_attrs.get("config") or {}).get("backend") == "openvino"
        and (t.user_attrs.get("config") or {}).get("precision") == "int8"
        and (d := (t.user_attrs.get("drift") or {}).get("relative_l2")) is not None
    ]
    return statistics.median(drifts) if drifts else None


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_results_commands.py parses the commands results files quote with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--studies-dir", default="studies")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--independent", default="20s", help="benchmark_app's window on the winner")
    parser.add_argument("--vs-benchmark-app", default="20s", help="benchmark_app's window on the one command")
    parser.add_argument("--started", help="ISO time the search was launched (default: its first trial's start)")
    parser.add_argument("--out", help="results file (default docs/results/<study>-<today>.json)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    from search_budget import best_so_far, launch_time

    console = Console(width=160)
    best_path = study_dir(args.studies_dir, args.study) / "best.json"
    try:  # every input checked before minutes of measuring
        if not best_path.is_file():
            raise UserError(f"{best_path} does not exist: run 'autotune search --study {args.study}' first")
        best = read_best(best_path)
        independent, versus = parse_duration(args.independent), parse_duration(args.vs_benchmark_app)
        study = optuna.load_study(study_name=args.study, storage=default_storage(args.studies_dir, args.study))
        try:
            started = launch_time(study, args.started)
        except ValueError:
            raise UserError(f"--started {args.started!r}: expected an ISO time, e.g. 2026-11-28T13:45:33Z") from None
    except UserError as exc:
        parser.exit(2, f"winner_vs_benchmark_app: error: {exc}\n")
    runs = compare_with_baseline(best_path, args.repeats, console, independent, versus)
    baseline, tool = median_throughput(runs[BASELINE_ROW]), median_throughput(runs.get(ONE_COMMAND_ROW, []))
    assert best.baseline is not None and best.baseline.config is not None  # compare_with_baseline checked
    winner_drift = best.drift.measured.relative_l2 if best.drift.measured else None
    references = {"baseline": baseline, "benchmark_app": tool}
    from results import side_by_side_row, write_results

    rows = [
        side_by_side_row(
            f"baseline: {best.baseline.config.summary()}", runs[BASELINE_ROW], references, 0.0, line="baseline"
        ),
        side_by_side_row(
            f"OpenVINO's benchmark_app -hint throughput (one command): NNCF int8 IR, batch 1, {args.vs_benchmark_app}",
            runs.get(ONE_COMMAND_ROW, []),
            references,
            int8_ir_drift(study),
            line="benchmark_app, one command",
        ),
        side_by_side_row(
            f"autotune search winner: {best.config.summary()}", runs[WINNER_ROW], references, winner_drift
        ),
        side_by_side_row(
            "the winner timed by benchmark_app (independent stopwatch): same IR and settings, pinned as tuned, "
            + args.independent,
            runs.get(INDEPENDENT_ROW, []),
            references,
            winner_drift,
        ),
    ]
    budget_s = float((study.user_attrs.get("spec") or {}).get("budget_s") or 0.0)
    curve = best_so_far(study, started)
    winner = rows[2]
    targets = []
    if winner["vs_benchmark_app"] is not None:
        targets.append(
            {
                "text": f"winner {winner['vs_benchmark_app']:.2f}x benchmark_app's one command and "
                f"{winner['vs_baseline']:.2f}x the baseline (medians of {args.repeats} interleaved runs)"
            }
        )
    assert best.model is not None  # a timed winner's best.json names its model
    shape = "x".join(map(str, best.model.input_shape))
    out = write_results(
        args.study,
        f"{best.model.name}: the search's winner against its baseline and OpenVINO's benchmark_app",
        {
            "model": f"{best.model.name} ({best.model.weights_path or 'random init'})",
            "input": shape,
            "search budget": f"{budget_s / 60:.0f} min",
            "interleaved runs": args.repeats,
        },
        rows,
        args.out,
        unit="samples/s",
        ratio_to="baseline",
        targets=targets,
        best_so_far={"study": args.study, "budget_s": budget_s, "points": [[round(t, 1), v] for t, v in curve]},
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

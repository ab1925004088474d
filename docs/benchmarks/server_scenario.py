"""The server scenario side by side: the highest Poisson request rate sustained at a p99 bound by

- the winner of a server-scenario search (its configuration and batching policy),
- the winner of an offline (closed-loop throughput) search, served the same way with its own batch size
  as max_batch and no wait (what a user gets by deploying the offline answer behind a queue),
- OpenVINO's own throughput mode on the NNCF int8 IR, each request submitted at its arrival to an
  AsyncInferQueue (autotune.remeasure.openvino_server),

each found by the same rate search on the same seeded arrivals, in fresh processes, interleaved per bound.

    .venv/bin/python docs/benchmarks/server_scenario.py --server studies/r50-server/best.json \\
        --offline studies/resnet50/best.json --bounds 100,50 [--repeats 1] [--measure-seconds 5s-20s]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def configured(best: dict[str, Any], bound_ms: float, window: tuple[float, float], wait_ms: float | None):
    """The best.json's configuration and context, set to serve at this bound."""
    from autotune.api import measure_settings
    from autotune.records.best import BestJson
    from autotune.records.config import TrialConfig
    from autotune.records.job import ServerSettings
    from autotune.remeasure.context import context_from_best
    from autotune.tuning.study import SERVER_SEED

    ctx = context_from_best(BestJson.from_json(best))
    settings = measure_settings(window[0], max_s=window[1])
    ctx = dataclasses.replace(ctx, measure=settings, server=ServerSettings(bound_ms, SERVER_SEED))
    config = TrialConfig.from_json(best["config"])
    if wait_ms is not None or config.max_wait_ms is None:
        config = dataclasses.replace(config, max_wait_ms=wait_ms or 0.0)
    return config, ctx


def autotune_row(best: dict[str, Any], bound_ms: float, window, wait_ms, work: Path) -> dict[str, Any]:
    from autotune.common.errors import TrialFailed
    from autotune.runner.trials import run_config

    config, ctx = configured(best, bound_ms, window, wait_ms)
    try:
        metrics, _, _ = run_config(config, ctx, work, 3600.0)
    except TrialFailed as exc:
        return {"config": config.summary(), "failed": exc.cause}
    assert metrics.server is not None
    return {"config": config.summary(), **metrics.server.to_json(), "valid": metrics.valid}


def openvino_row(best: dict[str, Any], bound_ms: float, window, work: Path) -> dict[str, Any]:
    from autotune.remeasure.crosscheck import ONE_COMMAND_CONFIG
    from autotune.runner.trials import ensure_artifact

    _, ctx = configured(best, bound_ms, window, None)
    artifact = ensure_artifact(ONE_COMMAND_CONFIG, ctx, work, 3600.0)
    assert artifact is not None
    shape = ",".join(map(str, [1, *best["model"]["input_shape"]]))
    command = [
        sys.executable,
        "-m",
        "autotune.remeasure.openvino_server",
        str(Path(artifact.dir) / "model.xml"),
        shape,
        "--slo-ms",
        str(bound_ms),
        "--min-s",
        str(window[0]),
        "--max-s",
        str(window[1]),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ov = result["openvino"]
    return {
        "config": f"openvino/int8 bs=1 THROUGHPUT hint ({ov['streams']} streams, {ov['requests']} requests)",
        **result,
    }


def same_configuration(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """The same configuration apart from the batching wait (an offline study has none)."""
    return {**one["config"], "max_wait_ms": None} == {**other["config"], "max_wait_ms": None}


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from autotune.api import measure_window

    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True, help="best.json of a --scenario server search")
    parser.add_argument("--offline", required=True, help="best.json of an offline (throughput) search")
    parser.add_argument("--bounds", default="100,50", help="p99 bounds in ms, comma-separated")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--measure-seconds", default="5s-20s", help="each probe's window, MIN-MAX")
    parser.add_argument("--work", default="studies/bench-server")
    parser.add_argument("--json", help="write every row's record here")
    args = parser.parse_args()
    window = measure_window(args.measure_seconds)
    window = (window[0], window[1] or 4 * window[0])
    server_best = json.loads(Path(args.server).read_text())
    offline_best = json.loads(Path(args.offline).read_text())
    work = Path(args.work)
    console = Console(highlight=False, soft_wrap=True)
    rows: list[dict[str, Any]] = []
    for bound in [float(b) for b in args.bounds.split(",")]:
        for repeat in range(args.repeats):
            measures = {
                "server-search winner": lambda w, b=bound: autotune_row(server_best, b, window, None, w),
                "offline winner, its batch, no wait": lambda w, b=bound: autotune_row(offline_best, b, window, 0.0, w),
                "OpenVINO throughput mode, int8": lambda w, b=bound: openvino_row(server_best, b, window, w),
            }
            if same_configuration(server_best, offline_best):
                console.print("the offline winner is the server winner's configuration: measured once", markup=False)
                del measures["offline winner, its batch, no wait"]
            for name, measure in measures.items():
                measured = measure(work / f"{bound:g}-{repeat}-{name[:6]}")
                row = {"bound_ms": bound, "repeat": repeat, "row": name, **measured}
                rows.append(row)
                console.print(
                    f"p99 <= {bound:g} ms, repeat {repeat + 1}: {name}: "
                    + (f"FAILED {row['failed']}" if "failed" in row else f"{row['sustained_rps']:.1f} requests/s"),
                    markup=False,
                )
    table = Table(title="highest Poisson request rate sustained at the p99 bound (same arrivals, same rate search)")
    for column in ("p99 bound", "configuration", "requests/s", "p99 ms there", "probes", "closed loop", "vs server"):
        table.add_column(column)
    for bound in sorted({r["bound_ms"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["bound_ms"] == bound and "failed" not in r]
        reference = (
            statistics.median(r["sustained_rps"] for r in mine if r["row"] == "server-search winner")
            if any(r["row"] == "server-search winner" for r in mine)
            else None
        )
        for name in dict.fromkeys(r["row"] for r in rows):
            runs = [r for r in mine if r["row"] == name]
            if not runs:
                table.add_row(f"{bound:g} ms", name, "failed", "", "", "", "")
                continue
            rate = statistics.median(r["sustained_rps"] for r in runs)
            at = [p for r in runs for p in r["probes"] if p["sustained"] and p["rate_rps"] == r["sustained_rps"]]
            p99 = statistics.median(p["latency_ms"]["p99"] for p in at) if at else None
            table.add_row(
                f"{bound:g} ms",
                f"{name}: {runs[0]['config']}",
                f"{rate:.1f}",
                "-" if p99 is None else f"{p99:.1f}",
                str(sum(len(r["probes"]) for r in runs)),
                f"{statistics.median(r['upper_bound_rps'] for r in runs):.1f}",
                f"{rate / reference:.2f}x" if reference else "-",
            )
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

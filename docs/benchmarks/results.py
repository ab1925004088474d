"""The results file every bench script writes (docs/results/<name>-<date>.json): the machine it ran on, the
commit (marked `-dirty` when the tree had uncommitted changes), the command as typed, the workload and the
rows, so the summary page (summary.py) can show each number beside its command and machine."""

from __future__ import annotations

import datetime
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def commit() -> str:
    """The checkout's short commit, `-dirty` when it had uncommitted changes to tracked files."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def side_by_side_row(
    row: str, runs: list[Any], references: dict[str, float | None], drift: float | None, **extra: Any
) -> dict[str, Any]:
    """A row of an interleaved run (autotune.remeasure.bench's BenchRun list): the median of its clean
    runs, every run, and its ratio to each reference median (`vs_<name>`)."""
    from autotune.remeasure.bench import median_throughput

    median = median_throughput(runs)
    return {
        "row": row,
        "value": median,
        "runs": [round(r.throughput_sps, 3) for r in runs],
        "clean_runs": sum(r.valid for r in runs),
        **{f"vs_{name}": round(median / ref, 3) if median and ref else None for name, ref in references.items()},
        "drift_relative_l2": drift,
        **extra,
    }


def write_results(
    name: str,
    benchmark: str,
    workload: dict[str, Any],
    rows: list[dict[str, Any]],
    out: str | Path | None = None,
    **extra: Any,
) -> Path:
    """Write the results file (default docs/results/<name>-<today>.json, -2, -3 ... when that one exists) and
    return its path."""
    from autotune.machine.probe import probe_machine

    machine = probe_machine()
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")  # a model named by its path: one file name
    path = Path(out) if out else RESULTS / f"{name}-{datetime.date.today().isoformat()}.json"
    for again in range(2, 100):  # a second run the same day keeps the first one's file
        if out or not path.exists():
            break
        path = RESULTS / f"{name}-{datetime.date.today().isoformat()}-{again}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": benchmark,
        "machine": {"cpu": machine.cpu_model, "physical_cores": machine.physical_cores, "isa": machine.isa},
        "commit": commit(),
        "command": shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]]),
        "workload": workload,
        "rows": rows,
        **extra,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path

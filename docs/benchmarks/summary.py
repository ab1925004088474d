"""The benchmarks' summary page, made from the results files the bench scripts write (docs/results/*.json:
machine, commit, command, workload, rows), so every number on it names its command and machine: one table
per results file (per machine and workload), the speed of each row against eager fp32 as a bar chart
(matplotlib SVG, inlined), and where a file holds them, the search winner's targets against the tools.

docs/hooks.py puts it into docs/manual/benchmarks/index.md when the site is built;
`python docs/benchmarks/summary.py` prints the Markdown.
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def isa_summary(isa: dict[str, bool]) -> str:
    """The instruction sets that decide bf16 and int8 speed, in words."""
    if isa.get("amx_tile"):
        return "AMX"
    if isa.get("avx512f"):
        extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16")) if isa.get(flag)]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    return "AVX2 only" if isa.get("avx2") else "no AVX2"


def chart(rows: list[dict[str, Any]], title: str) -> str:
    """Each row's speed against eager fp32 as horizontal bars, one group per sequences: an inlined SVG image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.get("vs_eager_fp32")]
    figure, axes = plt.subplots(figsize=(7.5, 0.28 * len(shown) + 1.0))
    labels = [f"{r['sequences']} seq. · {r['row']}" for r in shown]
    values = [r["vs_eager_fp32"] for r in shown]
    colours = ["#c0392b" if r["row"].startswith("autotune search winner") else "#2c7fb8" for r in shown]
    axes.barh(range(len(shown)), values, color=colours)
    axes.set_yticks(range(len(shown)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.axvline(1.0, color="#555", linewidth=0.8)
    axes.set_xlabel("x eager fp32 (same sequences)", fontsize=8)
    axes.set_title(title, fontsize=9)
    for index, value in enumerate(values):
        axes.text(value, index, f" {value:.2f}x", va="center", fontsize=7)
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    encoded = base64.b64encode(buffer.getvalue().encode()).decode()
    return f'<img alt="{title}" src="data:image/svg+xml;base64,{encoded}">'  # one line: Markdown keeps it whole


def _number(value: Any, digits: str = ".1f") -> str:
    return "" if value is None else format(value, digits)


def results_section(path: Path) -> str:
    """One results file: where and how it ran, its rows, its chart, its targets."""
    data = json.loads(path.read_text())
    machine = data["machine"]
    date = re.search(r"\d{4}-\d{2}-\d{2}", path.name)
    workload = ", ".join(f"{k} {v}" for k, v in data.get("workload", {}).items())
    lines = [
        f"## {data['benchmark']} ({date.group(0) if date else 'undated'})",
        "",
        f"Machine: {machine['cpu']}, {machine['physical_cores']} cores, {isa_summary(machine.get('isa', {}))}. "
        f"Workload: {workload}. Commit `{data['commit']}`; results file `docs/results/{path.name}`. Command:",
        "",
        f"    {data['command']}",
        "",
        "| sequences | row | tokens/s | runs | vs eager fp32 | drift (rel. L2) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for row in data["rows"]:
        drift = row.get("drift_relative_l2")
        lines.append(
            f"| {row['sequences']} | {row['row']} | {_number(row['tokens_per_s'])} | {len(row.get('runs', []))} | "
            f"{_number(row.get('vs_eager_fp32'), '.2f')}{'x' if row.get('vs_eager_fp32') else ''} | "
            f"{'' if drift is None else format(drift, '.2g')} |"
        )
    targets = data.get("targets") or []
    if targets:
        lines += [
            "",
            "Targets (the search's winner against the best tool row within the drift bound, and the recipe):",
            "",
        ]
        lines += [f"- {target['text']}" for target in targets]
    lines += ["", chart(data["rows"], f"{machine['cpu']} · {workload}"), ""]
    return "\n".join(lines)


def summary() -> str:
    """Every results file, newest first."""
    files = sorted(RESULTS.glob("*.json"), key=lambda p: (re.findall(r"\d{4}-\d{2}-\d{2}", p.name), p.name))
    return "\n".join(results_section(path) for path in reversed(files))


if __name__ == "__main__":
    print(summary())

"""The benchmarks' summary page, made from the results files the bench scripts write (docs/results/*.json:
machine, commit, command, workload, rows), so every number on it names its command and machine: one table
per results file (per machine and workload), the speed of each row against the file's baseline as a bar
chart (matplotlib SVG, inlined), where a file holds them the search winner's targets against the tools,
and a search's best-so-far against time.

A row holds `row`, its median (`value` in the file's `unit`; text-generation files: `tokens_per_s`), its
`runs`, its ratio to the baseline (`vs_baseline`; text generation: `vs_eager_fp32`), other ratios
(`vs_<row>`), `drift_relative_l2` (and `drift_kld` ...), and for text generation the `sequences` it ran. A row
whose drift is past the file's bound (`drift_bound`: its metric and maximum; else `max_drift_relative_l2`,
else the relative L2 0.05 every run used before files held it) is shown
for reference only, marked so in its table and drawn grey and hatched, labelled, in its chart: a search
prunes such a configuration before timing it, so it never competes with the winner.

docs/hooks.py puts it into docs/manual/benchmarks/index.md when the site is built;
`python docs/benchmarks/summary.py` prints the Markdown.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

RESULTS = Path(__file__).resolve().parents[1] / "results"
# The drift bound (relative L2) of a results file written before files held theirs: autotune's default then.
DEFAULT_BOUND = 0.05
PAST_BOUND = "past the drift bound: does not count"
METRIC_LABELS = {"relative_l2": "relative L2", "kld": "KL divergence"}


class Bound(NamedTuple):
    """The drift bound a results file's rows are held to: the row key `drift_<metric>` and its maximum."""

    metric: str
    value: float

    @property
    def label(self) -> str:
        return METRIC_LABELS.get(self.metric, self.metric)


def isa_summary(isa: dict[str, bool]) -> str:
    """The instruction sets that decide bf16 and int8 speed, in words."""
    if isa.get("amx_tile"):
        return "AMX"
    if isa.get("avx512f"):
        extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16")) if isa.get(flag)]
        return "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    return "AVX2 only" if isa.get("avx2") else "no AVX2"


def value_of(row: dict[str, Any]) -> float | None:
    """A row's median in its file's unit."""
    return row.get("value", row.get("tokens_per_s"))


def ratio_of(row: dict[str, Any]) -> float | None:
    """A row's speed against its file's baseline."""
    return row.get("vs_baseline", row.get("vs_eager_fp32"))


def label_of(row: dict[str, Any]) -> str:
    return f"{row['sequences']} seq. · {row['row']}" if "sequences" in row else row["row"]


def bound_of(data: dict[str, Any]) -> Bound:
    """The drift bound a results file's rows are held to."""
    if "drift_bound" in data:
        return Bound(data["drift_bound"]["metric"], float(data["drift_bound"]["max"]))
    return Bound("relative_l2", float(data.get("max_drift_relative_l2", DEFAULT_BOUND)))


def past_bound(row: dict[str, Any], bound: Bound) -> bool:
    """True when the row's drift is past the bound (or not finite): shown for reference, never counted.
    A row without a drift (a tool's own timing of a file another row measured) is not judged here."""
    drift = row.get(f"drift_{bound.metric}")
    return drift is not None and not (math.isfinite(drift) and drift <= bound.value)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _inline(figure: Any, title: str) -> str:
    """The figure as an inlined SVG image, on one line (Markdown keeps it whole)."""
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    _pyplot().close(figure)
    encoded = base64.b64encode(buffer.getvalue().encode()).decode()
    return f'<img alt="{title}" src="data:image/svg+xml;base64,{encoded}">'


def chart(
    rows: list[dict[str, Any]],
    title: str,
    baseline: str = "eager fp32",
    bound: Bound = Bound("relative_l2", DEFAULT_BOUND),
) -> str:
    """Each row's speed against the baseline as horizontal bars (the search's winner in red); a row past
    the drift bound grey and hatched, its label saying it does not count, so a garbage configuration's
    long bar cannot read as a competitor."""
    plt = _pyplot()
    shown = [r for r in rows if ratio_of(r)]
    figure, axes = plt.subplots(figsize=(7.5, 0.28 * len(shown) + 1.0))
    values = [ratio_of(r) for r in shown]
    past = [past_bound(r, bound) for r in shown]
    colours = [
        "#d9d9d9" if out else "#c0392b" if r["row"].startswith("autotune search winner") else "#2c7fb8"
        for r, out in zip(shown, past)
    ]
    bars = axes.barh(range(len(shown)), values, color=colours)
    for bar, out in zip(bars, past):
        if out:
            bar.set_hatch("///")
            bar.set_edgecolor("#888")
    short = [label_of(r).split(": ")[0] for r in shown]  # the row's name; its settings are in the table
    labels = [text if len(text) <= 64 else text[:63] + "…" for text in short]
    axes.set_yticks(range(len(shown)), [f"{text} (past the bound)" if out else text for text, out in zip(labels, past)])
    for tick, out in zip(axes.get_yticklabels(), past):
        tick.set_fontsize(8)
        tick.set_color("#888" if out else "black")
    # room for each bar's label beside it, a longer one beside a grey bar
    axes.set_xlim(0, max(value * (1.6 if out else 1.15) for value, out in zip(values, past)))
    axes.invert_yaxis()
    axes.axvline(1.0, color="#555", linewidth=0.8)
    axes.set_xlabel(f"x {baseline}" + (" (same sequences)" if any("sequences" in r for r in shown) else ""), fontsize=8)
    key = f"\ngrey, hatched: {bound.label} past {bound.value:g}, does not count"
    axes.set_title(title + (key if any(past) else ""), fontsize=9)
    for index, (value, out) in enumerate(zip(values, past)):
        text = f" {value:.2f}x" + (": does not count" if out else "")
        axes.text(value, index, text, va="center", fontsize=7, color="#888" if out else "black")
    return _inline(figure, title)


def best_so_far_chart(record: dict[str, Any], rows: list[dict[str, Any]], unit: str, title: str) -> str:
    """The search's best clean value against minutes since its launch, a step at each clean trial, with the
    budget's first quarter marked and the rows the file marks (`line`: e.g. the baseline, the tool) as
    horizontal lines."""
    plt = _pyplot()
    points = record["points"]
    budget_min = record.get("budget_s", 0.0) / 60
    figure, axes = plt.subplots(figsize=(7.5, 3.0))
    end = max(budget_min, points[-1][0] / 60 if points else 0.0)
    xs = [t / 60 for t, _ in points] + [end]
    ys = [v for _, v in points] + [points[-1][1] if points else 0.0]
    axes.step(xs, ys, where="post", color="#c0392b", label="autotune search: best so far")
    axes.plot(xs[:-1], ys[:-1], "o", color="#c0392b", markersize=3)
    styles = iter([("#2c7fb8", "--"), ("#555", ":"), ("#27ae60", "-."), ("#8e44ad", "--")])
    for row in rows:  # the rows a file marks as reference lines (`line`: their short label)
        if row.get("line") and value_of(row):
            colour, style = next(styles, ("#555", ":"))
            axes.axhline(value_of(row), color=colour, linestyle=style, linewidth=1, label=row["line"])
    if budget_min:
        axes.axvline(budget_min / 4, color="#999", linewidth=0.8, label="a quarter of the budget")
    axes.set_xlim(0, end * 1.02 if end else 1)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("minutes since the search was launched", fontsize=8)
    axes.set_ylabel(unit, fontsize=8)
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=7, loc="lower right")
    return _inline(figure, title)


def _number(value: Any, digits: str = ".1f") -> str:
    return "" if value is None else format(value, digits)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def quality_table(rows: list[dict]) -> list[str]:
    """autotune's KL divergence beside llama-perplexity's on the same GGUFs (a trained-model results file)."""
    if not rows:
        return []
    lines = [
        "",
        f"autotune's KL divergence beside `llama-perplexity --kl-divergence` ({rows[0]['chunks']} chunks), "
        "each GGUF against its F32 GGUF:",
        "",
        "| GGUF | autotune KLD | llama-perplexity KLD | autotune / tool | same top: autotune | same top: tool |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ours, same, ratio = row.get("autotune_kld"), row.get("autotune_same_top"), row.get("ratio")
        lines.append(
            f"| {row['type']} | {'' if ours is None else format(ours, '.3g')} | {row['llama_perplexity_kld']:.3g} "
            f"± {row['llama_perplexity_kld_pm']:.2g} | {'' if ratio is None else format(ratio, '.3f')} | "
            f"{'' if same is None else format(100 * same, '.1f') + '%'} | {row['llama_perplexity_same_top_percent']}% |"
        )
    return lines


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
    ]
    rows = data["rows"]
    unit, baseline = data.get("unit", "tokens/s"), data.get("ratio_to", "eager fp32")
    bound = bound_of(data)
    grouped = any("sequences" in row for row in rows)
    others = sorted({key for row in rows for key in row if key.startswith("vs_")} - {"vs_baseline", "vs_eager_fp32"})
    header = ["sequences"] * grouped + ["row", unit, "runs", f"vs {baseline}"]
    header += [f"vs {key[3:].replace('_', ' ')}" for key in others] + [f"drift ({bound.label})"]
    if rows:
        lines += [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" if h == "row" else "---:" for h in header) + "|",
        ]
    for row in rows:
        drift = row.get(f"drift_{bound.metric}")
        out = past_bound(row, bound)
        cells = ([str(row.get("sequences", ""))] if grouped else []) + [
            row["row"] + (f" (*{PAST_BOUND}*)" if out else ""),
            _number(value_of(row)),
            str(len(row.get("runs", []))),
        ]
        cells += [_ratio(ratio_of(row))] + [_ratio(row.get(key)) for key in others]
        cells.append("" if drift is None else format(drift, ".2g") + (f" (past {bound.value:g})" if out else ""))
        lines.append("| " + " | ".join(cells) + " |")
    if any(past_bound(row, bound) for row in rows):
        lines += [
            "",
            f"A row past the drift bound ({bound.label} above {bound.value:g}) is shown for reference only: a search "
            "prunes such a configuration before timing it, so it never competes with the winner.",
        ]
    lines += quality_table(data.get("llama_perplexity") or [])
    targets = data.get("targets") or []
    if targets:
        lines += ["", "Targets:", ""]
        lines += [f"- {target['text']}" for target in targets]
    if any(ratio_of(row) for row in rows):
        lines += ["", chart(rows, f"{machine['cpu']}, {machine['physical_cores']} cores", baseline, bound), ""]
    if data.get("best_so_far", {}).get("points"):
        title = f"{data['best_so_far']['study']}: best so far · {machine['cpu']}"
        lines += [best_so_far_chart(data["best_so_far"], rows, unit, title), ""]
    return "\n".join(lines)


def summary() -> str:
    """Every results file, newest first."""
    files = sorted(RESULTS.glob("*.json"), key=lambda p: (re.findall(r"\d{4}-\d{2}-\d{2}", p.name), p.name))
    return "\n".join(results_section(path) for path in reversed(files))


if __name__ == "__main__":
    print(summary())

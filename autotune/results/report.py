"""`autotune report`: one self-contained HTML file about a study, readable with no network.

Charts are drawn with matplotlib and inlined as SVG (no scripts, no fonts or styles fetched): the
Pareto front of throughput against p99 latency, parameter importances, the best speedup per backend
and precision, and drift against speed. Then the leaderboard and the failures grouped by cause.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import warnings
from pathlib import Path
from typing import Any

import optuna

from autotune.records.attributes import TrialAttrs
from autotune.records.fingerprint import Fingerprint, HardwareFacts
from autotune.records.spec import StoredSpec
from autotune.results.budget_breakdown import budget_breakdown
from autotune.results.leaderboard import leaderboard_rows, outcome_groups, study_summary, winner_lines
from autotune.results.selection import (
    baseline_trial,
    clean_trials,
    is_server,
    maximizes,
    metrics_of,
    primary_unit,
    primary_value,
    throughput_unit,
)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; } figure { margin: 0; min-width: 0; }
figure svg { max-width: 100%; height: auto; } figcaption { font-size: 0.85em; color: #555; }
.note { color: #555; font-size: 0.9em; }
"""


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline SVG


def _figure(columns: int = 1):
    """A figure of `columns` charts side by side, 6 x 4 inches for one (matplotlib without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(6, 4) if columns == 1 else (4.5 * columns, 4))


def pareto_front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """(throughput, p99, trial) points no other point beats on both (more throughput, less latency)."""
    front = [
        p for p in points if not any(q[0] >= p[0] and q[1] <= p[1] and (q[0], q[1]) != (p[0], p[1]) for q in points)
    ]
    return sorted(front, key=lambda p: p[1])


def _complete_points(study: optuna.study.Study) -> list[tuple[float, float, int]]:
    points = []
    for trial in clean_trials(study):
        metrics = metrics_of(trial)
        latency = metrics.generation.tpot_ms if metrics.generation else metrics.latency_ms  # per token for LMs
        sps, p99 = metrics.throughput_sps, latency.p99 or latency.p50
        if sps and p99:
            points.append((sps, p99, trial.number))
    return points


def pareto_chart(study: optuna.study.Study) -> str | None:
    points = _complete_points(study)
    if not points:
        return None
    fig, ax = _figure()
    ax.scatter([p[1] for p in points], [p[0] for p in points], s=18, color="#9bb", label="clean trials")
    front = pareto_front(points)
    ax.plot([p[1] for p in front], [p[0] for p in front], "o-", color="#c33", label="Pareto front")
    for sps, p99, number in front:
        ax.annotate(f"#{number}", (p99, sps), textcoords="offset points", xytext=(4, 4), fontsize=8)
    generation = throughput_unit(study) == "tokens/s"
    per = "TPOT: per output token" if generation else "per call"
    ax.set_xlabel(f"p99 latency {per} (ms; p50 where too few calls)")
    ax.set_ylabel(f"throughput ({throughput_unit(study)})")
    ax.set_xscale("log")
    ax.legend(loc="lower right")
    return _svg(fig)


def importance_chart(study: optuna.study.Study) -> str | None:
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 3:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError):
        return None
    if not importances:
        return None
    names = [name for name, value in importances.items() if value > 0][:12][::-1]  # the ones that matter
    if not names:
        return None
    fig, ax = _figure()
    ax.barh(names, [importances[n] for n in names], color="#47a")
    ax.set_xlabel("importance for the objective (fANOVA, parameters every completed trial has)")
    return _svg(fig)


def speedup_chart(study: optuna.study.Study) -> str | None:
    """Each backend x precision's best over the baseline, by the study's own value (a server study's
    sustained rate, not its closed-loop throughput)."""
    baseline = baseline_trial(study)
    server = is_server(study)
    base = (baseline.value if server else metrics_of(baseline).throughput_sps) if baseline else None
    best: dict[str, float] = {}
    for trial in clean_trials(study):
        config = TrialAttrs.of(trial).config
        key = f"{config.backend} {config.precision}" if config else "None None"
        value = (trial.value or 0.0) if server else metrics_of(trial).throughput_sps
        best[key] = max(best.get(key, 0.0), value)
    if not best:
        return None
    names = sorted(best, key=lambda name: best[name])
    fig, ax = _figure()
    values = [best[n] / base if base else best[n] for n in names]
    ax.barh(names, values, color="#6a4")
    for y, value in enumerate(values):
        ax.annotate(
            f"{value:.2f}{'x' if base else ''}", (value, y), textcoords="offset points", xytext=(3, -3), fontsize=8
        )
    ax.set_xlabel("best speedup over the eager fp32 baseline" if base else f"best {primary_unit(study)}")
    return _svg(fig)


def _backend(trial: optuna.trial.FrozenTrial) -> str | None:
    config = TrialAttrs.of(trial).config
    return config.backend if config else None


def drift_chart(study: optuna.study.Study) -> str | None:
    """Throughput against the drift the study bounds (its --drift-metric), the bound drawn where it is absolute."""
    spec = StoredSpec.of(study)
    criterion = spec.criterion
    points = [
        (drop, metrics.throughput_sps, _backend(t))
        for t in clean_trials(study)
        if (metrics := metrics_of(t)).drift is not None and (drop := criterion.drop(metrics.drift)) is not None
    ]
    if not points:
        return None
    fig, ax = _figure()
    for backend in sorted({str(p[2]) for p in points}):
        mine = [p for p in points if str(p[2]) == backend]
        ax.scatter([max(p[0], 1e-9) for p in mine], [p[1] for p in mine], s=18, label=backend)
    if not spec.drift_relative:
        ax.axvline(spec.max_drift, color="#c33", linestyle="--", label="drift bound")
    front = speed_front([(max(p[0], 1e-9), p[1]) for p in points])
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#333", linewidth=1, label="front")
    ax.set_xscale("log")
    ax.set_xlabel(f"drift from FP32 ({criterion.metric} drop; 1e-9 shown for exact or better)")
    ax.set_ylabel(f"throughput ({throughput_unit(study)})")
    ax.legend(fontsize=8)
    return _svg(fig)


def speed_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (drift, speed) points no other point beats on both (less drift and more speed), least drift first:
    the best speed each quality buys."""
    front: list[tuple[float, float]] = []
    for drift, speed in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or speed > front[-1][1]:
            front.append((drift, speed))
    return front


def mix_trial(study: optuna.study.Study) -> tuple[optuna.trial.FrozenTrial, dict[str, Any]] | None:
    """The fastest clean trial of a mix (its build ranked the model's matrices), with its build details."""
    mixes = [
        (t, details)
        for t in clean_trials(study)
        if "sensitivity" in (details := metrics_of(t).backend_details or {}) and metrics_of(t).throughput_sps
    ]
    return max(mixes, key=lambda pair: metrics_of(pair[0]).throughput_sps or 0.0, default=None)


def sensitivity_chart(study: optuna.study.Study) -> str | None:
    """The model's matrices by sensitivity (the KL divergence each moves the model by alone in the low type),
    those the fastest mix kept in the wider type marked: what the mix search traded."""
    found = mix_trial(study)
    if found is None:
        return None
    trial, details = found
    layers = details["sensitivity"]["layers"]
    kept = set(details.get("kept_layers") or [])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, max(3.0, 0.12 * len(layers))))
    colors = ["#c33" if layer["name"] in kept else "#4a7ab5" for layer in layers]
    ax.barh(range(len(layers)), [max(layer["score"], 1e-12) for layer in layers], color=colors)
    ax.set_yticks(range(len(layers)), [layer["name"] for layer in layers], fontsize=max(3, min(7, 400 // len(layers))))
    ax.set_xscale("log")
    low, wide = details["sensitivity"]["low_type"], details.get("kept_type", "?")
    ax.set_xlabel(f"KL divergence from FP32 with the matrix alone in {low}")
    ax.set_title(
        f"trial #{trial.number}: share {details.get('compressed_share')} in {low}, red kept in {wide}", fontsize=9
    )
    return _svg(fig)


def best_so_far_chart(study: optuna.study.Study) -> str | None:
    """The best clean value against the time the search had run: whether a longer budget would have
    helped (a curve still climbing at the end) or the answer came early."""
    trials = [t for t in clean_trials(study) if t.datetime_complete is not None]
    starts = [t.datetime_start for t in study.get_trials(deepcopy=False) if t.datetime_start is not None]
    if len(trials) < 2 or not starts:
        return None
    origin = min(starts)
    maximize = maximizes(study)
    times, best, current = [], [], None
    for trial in sorted(trials, key=lambda t: t.datetime_complete or origin):
        value = primary_value(trial)
        if current is None or (value > current if maximize else value < current):
            current = value
        times.append(((trial.datetime_complete or origin) - origin).total_seconds() / 60)
        best.append(current)
    fig, ax = _figure()
    ax.step(times, best, where="post", color="#47a")
    ax.plot(times, best, "o", color="#47a", markersize=3)
    ax.set_xlabel("minutes since the study's first trial started")
    ax.set_ylabel("best clean " + (primary_unit(study) if maximize else "ms per call") + " so far")
    return _svg(fig)


def server_chart(study: optuna.study.Study, top: int = 3) -> str | None:
    """The server scenario: p99 request latency against the offered rate, one curve per top
    configuration (the finalists' candidates), with the bound: where each one's queue gives way."""
    if not is_server(study):
        return None
    curves = []
    for trial in clean_trials(study)[:top]:
        server = metrics_of(trial).server
        if server is None:
            continue
        probes = sorted((p for p in server.probes if p.latency_ms.p99 is not None), key=lambda p: p.rate_rps)
        if probes:
            curves.append((trial.number, "", probes, server.slo_ms))
    if not curves:
        return None
    fig, ax = _figure()
    for number, _, probes, _ in curves:
        line = ax.plot([p.rate_rps for p in probes], [p.latency_ms.p99 for p in probes], "o-", label=f"#{number}")[0]
        over = [p for p in probes if p.overloaded]
        ax.plot([p.rate_rps for p in over], [p.latency_ms.p99 for p in over], "x", color=line.get_color(), ms=9)
    ax.axhline(curves[0][3], color="#c33", linestyle="--", label=f"bound {curves[0][3]:g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (requests/s, Poisson; x: the queue grew)")
    ax.set_ylabel("p99 latency, arrival to answer (ms)")
    ax.legend(fontsize=8)
    return _svg(fig)


def llm_server_chart(study: optuna.study.Study, top: int = 3) -> str | None:
    """A language model's server scenario: the p99 (the bounds' quantile) of TTFT and of TPOT against the
    offered rate, one curve per top configuration, with the bounds: where each one's server gives way."""
    if not is_server(study):
        return None
    curves = []
    for trial in clean_trials(study)[:top]:
        served = metrics_of(trial).llm_server
        if served is not None:
            curves.append((trial.number, served, sorted(served.probes, key=lambda p: p.rate_rps)))
    if not curves:
        return None
    fig, axes = _figure(2)
    bounds = curves[0][1].bounds
    q = bounds.quantile
    for ax, measure, bound in ((axes[0], "ttft_ms", bounds.ttft_ms), (axes[1], "tpot_ms", bounds.tpot_ms)):
        for number, _, probes in curves:
            points = [(p.rate_rps, getattr(getattr(p.load, measure), f"p{q}"), p.overloaded) for p in probes]
            points = [(rate, value, over) for rate, value, over in points if value is not None]
            line = ax.plot([r for r, _, _ in points], [v for _, v, _ in points], "o-", label=f"#{number}")[0]
            over = [(r, v) for r, v, o in points if o]
            ax.plot([r for r, _ in over], [v for _, v in over], "x", color=line.get_color(), ms=9)
        if bound is not None:
            ax.axhline(bound, color="#c33", linestyle="--", label=f"bound {bound:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (requests/s, Poisson; x: the backlog grew)")
        ax.set_ylabel(f"{measure.split('_')[0].upper()} p{q} (ms)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _leaderboard(study: optuna.study.Study, server: bool) -> str:
    """The report's leaderboard table: the ten best trials, with the columns of the study's scenario."""
    leaders = leaderboard_rows(study, 10)

    def fmt(v: float | None, d: int = 1) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    generation = throughput_unit(study) == "tokens/s"
    leader_rows = [
        [
            r.rank,
            r.trial,
            r.config,
            *((fmt(v) for v in r.latency_columns(generation, server)) if server else ()),
            fmt(r.throughput_sps),
            *(() if server else (fmt(v) for v in r.latency_columns(generation, server))),
            "-" if r.drift is None else f"{r.drift:.2e}",
            "-" if r.speedup is None else f"{r.speedup:.2f}x",
        ]
        for r in leaders
    ]
    leader_headers = [
        "#",
        "trial",
        "config",
        *(("requests/s sustained", "p99 ms at that rate", "max_wait ms") if server else ()),
        f"{throughput_unit(study)} ({'closed loop, ' if server else ''}one search measurement)",
        *(() if server else ("TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms") if generation else ("p50 ms", "p99 ms")),
        "drift (rel. L2)",
        "vs baseline",
    ]
    return _table(leader_headers, leader_rows) if leader_rows else "<p>No completed trial.</p>"


def build_report(study: optuna.study.Study) -> str:
    spec = StoredSpec.of(study)
    model = spec.model_name
    stored = Fingerprint.of(study)
    hardware = stored.hardware if stored and stored.hardware else HardwareFacts()
    server = is_server(study)
    charts = [
        (
            "Throughput against p99 latency (TPOT for text generation): the Pareto front",
            None if server else pareto_chart(study),  # closed-loop figures: the server chart replaces it
        ),
        ("Parameter importances", importance_chart(study)),
        ("Speedup by backend and precision", speedup_chart(study)),
        ("Drift against speed: each trial a point, the bound dashed, the front a step line", drift_chart(study)),
        ("Best so far against time", best_so_far_chart(study)),
    ]
    sensitivity = sensitivity_chart(study)  # a study with a mix only: no note where there is none
    if sensitivity:
        charts.append(("Sensitivity of each matrix to the low type, the fastest mix's kept ones in red", sensitivity))
    if server:
        charts.insert(0, ("p99 latency against offered request rate (server scenario)", server_chart(study)))
        charts.insert(
            0, ("TTFT and TPOT p99 against offered request rate (a language model's server)", llm_server_chart(study))
        )
    figures = "".join(
        f"<figure>{svg}<figcaption>{html.escape(title)}</figcaption></figure>" for title, svg in charts if svg
    )
    missing = [title for title, svg in charts if not svg]
    outcomes = [[g.state, len(g.trials), g.trial_list, g.example] for g in outcome_groups(study)]
    cpu = html.escape(hardware.cpu_model or "?")
    winner = "".join(f"<p>{html.escape(line.strip())}</p>" for line in winner_lines(study)) or "<p>None yet.</p>"
    leaderboard = _leaderboard(study, server)
    failures = (
        _table(["state", "count", "trials", "cause (the first trial's)"], outcomes) if outcomes else "<p>None.</p>"
    )
    spent = budget_breakdown(study)
    total = sum(seconds for _, seconds in spent) or 1.0
    budget = (
        _table(["stage", "seconds", "share"], [[name, f"{s:.1f}", f"{s / total:.0%}"] for name, s in spent])
        if spent
        else "<p>No trial yet.</p>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>autotune report: {html.escape(study.study_name)}</title>
<style>{STYLE}</style></head><body>
<h1>autotune report: study {html.escape(study.study_name)}</h1>
<p>model <b>{html.escape(str(model))}</b> on {cpu}, {hardware.physical_cores or "?"} physical cores;
objective {html.escape(spec.objective)}; {html.escape(study_summary(study))}.
<span class="note">Generated {dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}.</span></p>
<h2>Winner</h2>{winner}
<h2>Charts</h2><div class="charts">{figures}</div>
{f'<p class="note">Not drawn (not enough completed trials): {html.escape(", ".join(missing))}.</p>' if missing else ""}
<h2>Leaderboard</h2>{leaderboard}
<h2>Failed and pruned trials, by cause</h2>{failures}
<h2>Where the time went</h2>{budget}
</body></html>
"""


def write_report(study: optuna.study.Study, path: Path) -> Path:
    from autotune.common.files import write_text_atomic

    return write_text_atomic(path, build_report(study))

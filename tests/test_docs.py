"""The manual (docs/manual) builds as a site with MkDocs --strict, as `make docs` and CI build it: its
command reference is made from the parser, so it lists every command and every option of the code as it
is, and a broken link fails the build."""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(docs: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` as `make docs` runs it, its hooks importing this checkout's autotune."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    command = [str(mkdocs), "build", "--strict", "-f", str(docs / "mkdocs.yml"), "-d", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_the_manual_builds_strict_and_its_reference_is_the_parsers(tmp_path):
    """Every page builds without a warning; the reference page holds each command and each of its
    options as the parser declares them (search's from its options record)."""
    from autotune.cli import build_parser
    from autotune.records.options import options_table

    done = build(ROOT / "docs", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert f'id="autotune-{name}"' in page, name
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"<code>{flag}" in page, (name, flag)
    # the benchmarks' summary: every results file, its command, its rows and a chart, made at build time
    summary = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    for results in sorted((ROOT / "docs" / "results").glob("*.json")):
        data = json.loads(results.read_text())
        assert results.name in summary and html.escape(data["command"], quote=False) in summary, results.name
        assert all(html.escape(row["row"], quote=False) in summary for row in data["rows"]), results.name
    charts = 0  # a bar chart where rows have a ratio to the baseline, a curve where a search's best so far is kept
    for results in (ROOT / "docs" / "results").glob("*.json"):
        data = json.loads(results.read_text())
        charts += any(row.get("vs_baseline", row.get("vs_eager_fp32")) for row in data["rows"])
        charts += bool(data.get("best_so_far", {}).get("points"))
    assert summary.count('src="data:image/svg+xml;base64,') == charts
    markdown = (ROOT / "docs" / "manual" / "reference" / "cli.md").read_text()
    assert "| option |" not in markdown and options_table().count("\n") > 30  # made at build time, not pasted


def test_a_broken_link_in_the_manual_fails_the_build(tmp_path):
    """--strict is what makes the build a check: a link to a page that does not exist fails it."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("__pycache__"))
    page = docs / "manual" / "troubleshooting.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = build(docs, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr, done.stderr[-2000:]


def test_best_json_fields_are_each_described_and_each_description_names_a_field(tmp_path, monkeypatch):
    """The manual's best.json table is made from descriptions checked against the record: none missing,
    none of a field that is not there; a field added without a row, or a row left for a field renamed,
    is named (and the built page holds every row)."""
    import dataclasses

    from autotune.records import best_fields

    assert best_fields.undocumented() == [] and best_fields.unknown() == []
    rows = best_fields.FIELDS
    monkeypatch.setattr(best_fields, "FIELDS", tuple(r for r in rows if r.paths != ("launch.commands",)))
    assert best_fields.undocumented() == ["launch.commands"]
    renamed = dataclasses.replace(rows[0], paths=("metrics.throughput_ci_sps",))
    monkeypatch.setattr(best_fields, "FIELDS", (*rows, renamed))
    assert best_fields.unknown() == ["metrics.throughput_ci_sps"]  # TrialMetrics has it, best.json does not
    monkeypatch.setattr(best_fields, "FIELDS", rows)
    done = build(ROOT / "docs", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "site" / "reference" / "best-json" / "index.html").read_text()
    assert all(f"<code>{path}</code>" in page for row in rows for path in row.paths)


def test_the_engines_summary_counts_no_row_past_the_drift_bound_the_recipe_included():
    """llm_engines.py's targets: the winner against the best tool row within the bound, never against a
    tool row or a recipe past it (inductor da8w8 decoded garbage on an AMX Xeon: relative L2 8e3)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "benchmarks"))
    import llm_engines

    def row(name: str, speed: float, drift: float) -> dict:
        return {"sequences": 1, "row": name, "tokens_per_s": speed, "drift_relative_l2": drift}

    rows = [
        row("autotune search winner", 130.0, 0.036),
        row("autotune inductor da8w8 recipe", 250.0, 8.2e3),
        row("openvino-genai int8_asym", 100.0, 0.036),
        row("openvino-genai int4_sym", 170.0, 0.44),
    ]
    (line,) = llm_engines.targets(rows, 0.05)
    assert line["best_tool"] == "openvino-genai int8_asym" and line["winner_vs_best_tool"] == 1.3
    assert "winner_vs_recipe" not in line and line["recipe_past_bound"] == 8.2e3
    assert "the recipe (drift 8.2e+03; target 1.2x not measurable)" in line["text"], line["text"]
    rows[1]["drift_relative_l2"] = 0.04
    (line,) = llm_engines.targets(rows, 0.05)
    assert line["winner_vs_recipe"] == 130.0 / 250.0 and "recipe_past_bound" not in line


def test_the_mix_summary_sets_the_winner_beside_the_best_whole_type_and_never_counts_its_own_file_as_a_tool():
    """llm_engines.py's targets with a mixed winner: the tool run on the winner's own file is not a tool's
    type (a user of the tool alone has no mix), and the best whole-model type is the fastest autotune row
    within the bound, never one past it nor the winner itself."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "benchmarks"))
    import llm_engines

    def row(name: str, speed: float, drift: float, **extra: object) -> dict:
        return {"sequences": 1, "row": name, "tokens_per_s": speed, "drift_relative_l2": drift, **extra}

    rows = [
        row("autotune search winner", 8.0, 0.045, compressed_share=0.625, kept_type="fp16"),
        row("autotune openvino fp16", 5.0, 0.026),
        row("autotune openvino int8_asym", 10.0, 0.086),
        row(f"{llm_engines.WINNER_FILE_ROW} (openvino-genai)", 8.4, 0.045),
        row("openvino-genai fp16", 4.8, 0.026),
        row("openvino-genai int8_asym", 10.1, 0.086),
    ]
    (line,) = llm_engines.targets(rows, 0.05, tool_target=1.5)
    assert line["best_tool"] == "openvino-genai fp16" and line["winner_vs_best_tool"] == 8.0 / 4.8
    assert line["best_whole_type"] == "autotune openvino fp16" and line["winner_vs_best_whole_type"] == 8.0 / 5.0
    assert "target 1.5x" in line["text"] and "share 0.625" in line["text"], line["text"]


def _commands(parser: argparse.ArgumentParser, path: str = "autotune"):
    """(command, its parser) for the parser and every subcommand's, nested ones included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def test_every_command_and_every_option_has_a_help_text():
    """The reference page is each command's --help, one row per option: an option added without a help
    text would be a blank row there and in --help."""
    from autotune.cli import build_parser

    missing = []
    for command, parser in _commands(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{command} {c.dest}" for c in action._choices_actions if not (c.help or "").strip()]
            elif not (action.help or "").strip():
                missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    assert missing == [], f"options without a help text: {', '.join(missing)}"


def test_the_drift_metric_texts_name_every_metric_the_code_knows():
    """--drift-metric's help and the reference's row are made from measure/drift.py's own list, so a
    metric added there (perplexity was once left out of the reference) is in both; --data's say what a
    text file is for a language model."""
    from autotune.cli import build_parser
    from autotune.cli_reference import cli_reference
    from autotune.measure.drift import METRIC_HELP, METRICS, RELATIVE_METRICS
    from autotune.records.options import flag_of

    search = dict(_commands(build_parser()))["autotune search"]
    help_text = next(a.help for a in search._actions if "--drift-metric" in a.option_strings)
    row = next(line for line in cli_reference().splitlines() if line.startswith("| `--drift-metric"))
    assert set(METRIC_HELP) == set(METRICS)
    for metric in METRICS:
        assert f"{metric}: " in help_text, metric
        assert f"`{metric}`" in row, metric
    assert all(f"`{metric}`" in flag_of("max_drift").text() for metric in RELATIVE_METRICS)
    for text in (flag_of("data").help, flag_of("data").text()):
        assert "language model" in text and "text file" in text and "UTF-8 bytes" in text, text


def test_the_summary_marks_a_row_past_the_drift_bound_in_its_table_and_its_chart(tmp_path, monkeypatch):
    """A row past the file's drift bound (the AMX recipe at 8.2e3, int4 at 0.44) is shown for reference:
    its table row and drift say so, and its bar is grey and hatched, labelled as not counting, never a
    plain bar beside the winner's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_summary", ROOT / "docs" / "benchmarks" / "summary.py")
    assert spec is not None and spec.loader is not None
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)

    def row(name: str, speed: float, drift: float) -> dict:
        ratio = speed / 33.0
        return {"sequences": 1, "row": name, "tokens_per_s": speed, "vs_eager_fp32": ratio, "drift_relative_l2": drift}

    rows = [row("autotune eager fp32", 33.0, 0.0), row("autotune search winner", 132.5, 0.036)]
    rows += [row("autotune inductor da8w8 recipe", 249.9, 8.2e3), row("openvino-genai int4_sym", 172.9, 0.44)]
    results = tmp_path / "engines-2026-12-01.json"
    machine = {"cpu": "a Xeon", "physical_cores": 2, "isa": {"amx_tile": True}}
    data = {"benchmark": "engines", "machine": machine, "commit": "abc", "command": "x", "rows": rows}
    results.write_text(json.dumps({**data, "max_drift_relative_l2": 0.05}))
    figures = []
    monkeypatch.setattr(summary, "_inline", lambda figure, title: figures.append(figure) or "<chart>")
    page = summary.results_section(results)

    table = {line.split(" | ")[1]: line for line in page.splitlines() if line.startswith("| 1 | ")}
    for name in ("autotune inductor da8w8 recipe", "openvino-genai int4_sym"):
        (line,) = [text for key, text in table.items() if key.startswith(name)]
        assert "past the drift bound: does not count" in line and "(past 0.05)" in line, line
    for name in ("autotune eager fp32", "autotune search winner"):
        assert "past" not in table[name], table[name]
    assert "shown for reference only" in page
    (figure,) = figures
    axes = figure.axes[0]
    labels = [tick.get_text() for tick in axes.get_yticklabels()]
    bars = dict(zip(labels, axes.patches))
    past = [label for label in labels if label.endswith("(past the bound)")]
    assert past == [
        "1 seq. · autotune inductor da8w8 recipe (past the bound)",
        "1 seq. · openvino-genai int4_sym (past the bound)",
    ]
    winner = bars["1 seq. · autotune search winner"]
    for label in past:
        assert bars[label].get_hatch() and bars[label].get_facecolor() != winner.get_facecolor(), label
    assert not winner.get_hatch()
    notes = [text.get_text() for text in axes.texts]
    assert sum("does not count" in note for note in notes) == 2 and "does not count" in axes.get_title()
    summary._pyplot().close(figure)

    results.write_text(json.dumps({**data, "max_drift_relative_l2": 1e4}))  # a bound they are within
    figures.clear()
    page = summary.results_section(results)
    assert "does not count" not in page and not any(bar.get_hatch() for bar in figures[0].axes[0].patches)
    results.write_text(json.dumps(data))  # no bound in the file: the 0.05 of the runs before files held one
    assert "(past 0.05)" in summary.results_section(results)
    # a file bounded by KL divergence judges each row by its KLD, not its relative L2
    kld_rows = [{**r, "drift_relative_l2": 0.01, "drift_kld": 0.2 if "int4" in r["row"] else 0.01} for r in rows]
    results.write_text(json.dumps({**data, "rows": kld_rows, "drift_bound": {"metric": "kld", "max": 0.05}}))
    page = summary.results_section(results)
    (past_line,) = [line for line in page.splitlines() if "does not count*" in line]
    assert "openvino-genai int4_sym" in past_line and "(past 0.05)" in past_line, page
    assert "drift (KL divergence)" in page and "KL divergence above 0.05" in page
    for figure in figures:
        summary._pyplot().close(figure)

"""MkDocs hooks (docs/mkdocs.yml): the manual's generated parts, made from the code when the site is built,
so they cannot drift from it."""

from __future__ import annotations

from typing import Any

ARCHITECTURE_MARKER = "<!-- autotune:architecture-table -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker with what the code makes of it."""
    from autotune.cli_reference import cli_reference
    from autotune.records.best_fields import fields_table

    generated = {
        "<!-- autotune:cli-reference -->": cli_reference,
        "<!-- autotune:best-json-fields -->": fields_table,
        "<!-- autotune:benchmark-summary -->": _benchmark_summary,
        ARCHITECTURE_MARKER: _architecture_table,
    }
    for marker, make in generated.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def _benchmark_summary() -> str:
    """docs/benchmarks/summary.py's page."""
    return str(_bench_module("summary").summary())


def _bench_module(name: str) -> Any:
    """A docs/benchmarks script, loaded by its path (the bench scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _architecture_table() -> str:
    """docs/results/support/architectures.json, as docs/benchmarks/architectures.py measured it, as a table."""
    import json
    from pathlib import Path

    results = json.loads((Path(__file__).resolve().parent / "results" / "support" / "architectures.json").read_text())
    made = f"Measured by `{results['command']}` on {results['date']} ({results['machine']})."
    return _bench_module("architectures").markdown_table(results) + "\n\n" + made

"""The manual's table of which architectures run on which engine is measured, not written: its rows are what
docs/benchmarks/architectures.py measured (docs/results/support/architectures.json), and this test measures rows of
it again with the same code (a family whose cells differ), so a change that breaks an engine for a
family, or a table edited by hand, fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "benchmarks" / "architectures.py"
COMMITTED = ROOT / "docs" / "results" / "support" / "architectures.json"
REMEASURED = ("GPT-2",)  # its IPEX cell fails, llama.cpp keeps placeholder tokens: a row that differs


def verdicts(table: dict) -> dict:
    """Each cell's verdict: runs with FP32 eager's tokens, runs with others, or fails; and whether llama.cpp
    kept placeholder tokens (the words of a failure name temporary paths: not compared)."""
    return {
        family: {
            engine: (
                "no" if not cell["runs"] else "yes" if cell["same_tokens"] else "other tokens",
                str(cell.get("detail") or "").startswith("placeholder"),
            )
            for engine, cell in cells.items()
        }
        for family, cells in table.items()
    }


@pytest.mark.slow
def test_the_architecture_table_is_what_its_script_measures(tmp_path):
    committed = json.loads(COMMITTED.read_text())
    assert {"Llama", "Qwen2", "Mistral", "Phi-3", "Gemma", "GPT-2", "OPT"} <= set(committed["table"])
    out = tmp_path / "architectures.json"
    families = [arg for family in REMEASURED for arg in ("--family", family)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *families], capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = verdicts(json.loads(out.read_text())["table"])
    expected = verdicts({family: committed["table"][family] for family in REMEASURED})
    assert measured == expected
    # the families differ where the engines do: not a table of yes
    cells = [v for row in verdicts(committed["table"]).values() for v in row.values()]
    assert ("yes", False) in cells and any(v[0] == "no" for v in cells)


def test_the_manual_shows_the_committed_table():
    sys.path.insert(0, str(ROOT / "docs"))
    import hooks

    page = (ROOT / "docs" / "manual" / "text-generation.md").read_text()
    assert hooks.ARCHITECTURE_MARKER in page
    rendered = hooks.on_page_markdown(page, None, None, None)
    for family in json.loads(COMMITTED.read_text())["table"]:
        assert f"| {family} |" in rendered

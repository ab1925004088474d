"""The package's layers, as folders, and the one direction imports may go.

Each subpackage declares (in its __init__ docstring) what it may import; this test holds the code to
it by reading every import statement (function-level ones too) of every module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"

# Higher layers may import lower ones; packages of one rank may not import each other.
LAYERS = {
    "common": 0,
    "measure": 1,
    "model": 1,
    "backends": 1,
    "machine": 2,
    "records": 3,
    "worker": 4,
    "runner": 5,
    "results": 6,
    "remeasure": 7,
    "tuning": 7,
    "api": 8,
    "cli": 9,
    "stopwatch_process": 9,  # a plain process, timed (python -m autotune.stopwatch_process): calls autotune.load()
    "cli_reference": 10,  # the manual's command reference, made from the parser (cli) when the site is built
    "__init__": 9,
}


def layer_of(module: str) -> str:
    """'autotune.tuning.study' -> 'tuning'; 'autotune.cli' -> 'cli'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("autotune.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "autotune":
                found += [(node.lineno, f"autotune.{alias.name}") for alias in node.names]
            elif node.module.startswith("autotune."):
                found.append((node.lineno, node.module))
    return found


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(relative.parts)


def test_every_module_belongs_to_a_declared_layer():
    undeclared = {layer_of(module_name(p)) for p in PACKAGE.rglob("*.py")} - set(LAYERS)
    assert not undeclared, f"modules outside the declared layers: {sorted(undeclared)}"


def test_imports_only_go_down_the_layers():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = layer_of(module_name(path))
        for line, target in imports_of(path):
            destination = layer_of(target)
            if destination == source:
                continue
            if destination not in LAYERS:
                violations.append(f"{module_name(path)}:{line} imports {target}: no such layer")
            elif LAYERS[destination] >= LAYERS[source]:
                violations.append(
                    f"{module_name(path)}:{line} ({source}, layer {LAYERS[source]}) imports {target} "
                    f"({destination}, layer {LAYERS[destination]})"
                )
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path):
    """The checker itself: an upward import inside a function is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from autotune.tuning.study import run_search\n")
    assert imports_of(module) == [(2, "autotune.tuning.study")]


def test_each_layer_says_what_it_may_import():
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"{folder.name}/__init__.py has no docstring saying what it may import"


MAX_FUNCTION_LINES = 80


def test_no_function_in_the_package_runs_over_80_lines():
    """A function longer than a screen does several jobs: split it by concern."""
    long = [
        f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_what_a_program_or_a_trial_imports_needs_no_optuna():
    """Optuna is the search's, not the tuned model's: the IPEX runtime (torch 2.8, no Optuna) runs trials
    and `autotune.load()` there, as a user's serving process does. A record the load path reads that
    imported Optuna at module level broke `verify --through-load` of an IPEX winner."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['optuna'] = None\n"  # importing it raises ImportError
        "import autotune, autotune.stopwatch_process, autotune.worker.process\n"
        "from autotune.records.best import BestJson\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

"""The commands the documentation quotes run as written. A results file's (docs/results/*.json: the run's
`command`, and each tool row's) parses with the parser of what it runs: an `autotune` command with
autotune's own, a bench script's with that script's `build_parser()`. In those and in the commands the
README and the manual show, every file of the repository a command names (a bench script, a search
space, a results file) exists: a script moved or a space never shipped fails here, not in a reader's
shell."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import re
import shlex
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = sorted((ROOT / "docs" / "results").glob("*.json"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "manual").rglob("*.md"))]
# The repository's top-level folders: a path into one of them names a file that ships with it (studies/ is
# where a search writes, so a path there names what a run made, not a file of the repository).
REPOSITORY_FOLDERS = ("autotune", "docs", "search_spaces", "tests")
ENVIRONMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # BENCH_LAYERS=8 before the program
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")  # --space SPACE: a word the reader replaces


def quoted_commands(value: Any) -> list[str]:
    """Every `command` a results file holds: the run's, and each one a row (or anything else) nests."""
    if isinstance(value, dict):
        found = [value["command"]] if isinstance(value.get("command"), str) else []
        return found + [c for key, item in value.items() if key != "command" for c in quoted_commands(item)]
    if isinstance(value, list):
        return [c for item in value for c in quoted_commands(item)]
    return []


def page_commands(page: Path) -> list[str]:
    """The commands a page shows: its indented code lines (a line ending in a backslash continued) and
    its inline code spans that start with a program autotune runs."""
    lines, found = page.read_text().splitlines(), []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("    ") and line.strip():
            text = line.strip()
            while text.endswith("\\") and index + 1 < len(lines):
                index += 1
                text = text[:-1] + " " + lines[index].strip()
            found.append(text)
        else:
            found += re.findall(r"`([^`]+)`", line)
        index += 1
    return [text for text in found if program(words(text)) is not None]


def words(command: str) -> list[str]:
    """The command's words as a shell splits them, without the variables set before the program (none
    for a line a shell could not split: code, not a command)."""
    try:
        split = shlex.split(command, comments=True)
    except ValueError:
        return []
    while split and ENVIRONMENT.match(split[0]):
        split.pop(0)
    return split


def program(split: list[str]) -> str | None:
    """What the command runs: 'autotune', a bench script's path, or None for a command of another tool
    (llama-batched-bench) or not a command at all."""
    if not split:
        return None
    name = PurePosixPath(split[0]).name
    if name == "autotune":
        return "autotune"
    if re.fullmatch(r"python[0-9.]*", name) and len(split) > 1:
        if split[1:3] in (["-m", "autotune"], ["-m", "autotune.cli"]):
            return "autotune"
        if split[1].endswith(".py"):
            return split[1]
    return None


def arguments(split: list[str]) -> list[str]:
    """The words the program's parser reads."""
    if PurePosixPath(split[0]).name == "autotune":
        return split[1:]
    return split[3:] if split[1] == "-m" else split[2:]


def in_repository(word: str) -> Path | None:
    """The file of the repository a word names, or None: a path under one of its folders, relative or
    into a checkout of it (a tool row's /work/main/docs/benchmarks/genai_benchmark.py); a model's
    file.py:function names its file."""
    path = PurePosixPath(word.split(":")[0] if re.search(r"\.py:", word) else word)
    parts = path.parts
    if path.is_absolute():
        starts = [i for i, part in enumerate(parts) if part in REPOSITORY_FOLDERS]
        parts = parts[starts[0] :] if starts else ()
    if len(parts) < 2 or parts[0] not in REPOSITORY_FOLDERS:
        return None
    return ROOT.joinpath(*parts)


def missing_files(split: list[str]) -> list[str]:
    """The words that name a file of the repository that is not there, and a `--space` that names none
    (a space is read, not written: a reader copying the command must find it)."""
    missing = []
    for index, word in enumerate(split):
        for candidate in {word, word.partition("=")[2]} - {""}:  # --out=PATH, --best NAME=PATH
            path = in_repository(candidate)
            if path is not None and not path.exists():
                missing.append(candidate)
        if word == "--space" and index + 1 < len(split) and not PLACEHOLDER.fullmatch(split[index + 1]):
            space = split[index + 1]
            path = in_repository(space)
            if path is None or not path.is_file():
                missing.append(space)
    return sorted(set(missing))


@functools.cache
def script_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"quoted_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_error(split: list[str]) -> str | None:
    """Why the command's program would refuse its arguments (None: they parse)."""
    runs = program(split)
    assert runs is not None
    if runs == "autotune":
        from autotune.cli import build_parser
        from autotune.common.errors import UserError

        try:
            build_parser().parse_args(arguments(split))
        except UserError as exc:
            return str(exc)
        return None
    script = in_repository(runs)
    if script is None or not script.is_file():
        return f"{runs} is not a script of the repository"
    module = script_module(script)
    if not hasattr(module, "build_parser"):
        return f"{runs} has no build_parser() to parse its arguments with"
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            module.build_parser().parse_args(arguments(split))
        except SystemExit:
            return errors.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("results", RESULTS, ids=lambda path: path.name)
def test_a_results_files_commands_parse_and_name_files_that_exist(results):
    commands = quoted_commands(json.loads(results.read_text()))
    assert commands, f"{results.name} quotes no command"
    problems = []
    for command in commands:
        split = words(command)
        missing = missing_files(split)
        problems += [f"{command}: names {word}, which is not in the repository" for word in missing]
        if program(split) is not None and program(split) not in missing:
            error = parse_error(split)
            if error:
                problems.append(f"{command}: {error}")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_commands_a_page_shows_name_files_that_exist(page):
    problems = [
        f"{command}: names {word}, which is not in the repository"
        for command in page_commands(page)
        for word in missing_files(words(command))
    ]
    assert problems == [], "\n".join(problems)


def test_the_checks_catch_a_moved_script_a_missing_space_and_an_unknown_option():
    """What the tests above refuse, on commands made up for it."""
    moved = words(".venv/bin/python docs/bench_engines.py --sequences 1,8 --repeats 1")
    assert missing_files(moved) == ["docs/bench_engines.py"] and "not a script" in (parse_error(moved) or "")
    assert words("print('it isn't a command')") == []
    tool_row = words("/work/main/.venv/bin/python /work/main/docs/genai_bench.py IR --prompt 512")
    assert missing_files(tool_row) == ["/work/main/docs/genai_bench.py"]
    unshipped = words("BENCH_LAYERS=8 autotune search --model m.py:f --space studies/spaces/generate-1x1.yaml")
    assert missing_files(unshipped) == ["studies/spaces/generate-1x1.yaml"]
    assert parse_error(unshipped) is None and missing_files(words("autotune search --space SPACE")) == []
    assert "--no-such-option" in (parse_error(words("autotune search --model m --no-such-option")) or "")
    script = words(".venv/bin/python docs/benchmarks/llm_engines.py --sequences 1 --no-such-option")
    assert "--no-such-option" in (parse_error(script) or "")


@pytest.mark.parametrize("sequences", [1, 8])
def test_the_benchmarks_spaces_are_the_shipped_generation_space_at_one_shape(sequences):
    """search_spaces/generate-1xN.yaml, the space of the text-generation benchmarks at N sequences, is
    generate.yaml with the sequences, the instances and the baseline fixed, and nothing else changed: an
    engine or a value added to generate.yaml is added there too."""
    import yaml

    shipped = yaml.safe_load((ROOT / "search_spaces" / "generate.yaml").read_text())
    shape = yaml.safe_load((ROOT / "search_spaces" / f"generate-1x{sequences}.yaml").read_text())
    fixed = {"sequences": [sequences], "instances": [1], "baseline": {"sequences": sequences}}
    assert shape == {**shipped, **fixed}

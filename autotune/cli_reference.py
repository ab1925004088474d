"""The command-line reference as Markdown, made from the parser itself (and `autotune search`'s options
from their record, records/options.py), so the manual's reference page cannot drift from the code:
docs/hooks.py puts it into the page when `make docs` builds the site.

    python -m autotune.cli_reference     # print it
"""

from __future__ import annotations

import argparse

from autotune.cli import build_parser
from autotune.records.options import options_table


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    names = action.option_strings or [action.dest]
    metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{name}{metavar}`" for name in names)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, [], ()):
        return ""
    return f"`{action.default}`"


def command_table(parser: argparse.ArgumentParser) -> str:
    """One command's arguments: how each is spelled, what it does (its --help text), its default."""
    lines = ["| argument | what it does | default |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        lines.append(f"| {_flags(action)} | {_cell(action.help)} | {_default(action)} |")
    return "\n".join(lines)


def cli_reference() -> str:
    """Every command of `autotune`, each with its one-line purpose and its arguments' table; `search`
    with the fuller descriptions of its options record."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    purposes = {choice.dest: choice.help for choice in commands._choices_actions}
    out = []
    for name, sub in commands.choices.items():
        out += [f"## autotune {name}", "", _cell(purposes.get(name)) + ".", ""]
        out += [options_table() if name == "search" else command_table(sub), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(cli_reference(), end="")

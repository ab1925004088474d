"""MkDocs hooks (docs/mkdocs.yml): the manual's generated parts, made from the code when the site is built,
so they cannot drift from it."""

from __future__ import annotations

from typing import Any


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker with what the code makes of it."""
    from autotune.cli_reference import cli_reference
    from autotune.records.best_fields import fields_table

    generated = {"<!-- autotune:cli-reference -->": cli_reference, "<!-- autotune:best-json-fields -->": fields_table}
    for marker, make in generated.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown

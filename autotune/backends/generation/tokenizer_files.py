"""The tokenizer of the Hugging Face folder a model was loaded from, copied beside the files an engine's
exporter reads (llama.cpp's converter, optimum-intel's export), so the engine's artifact carries the
model's real vocabulary and generates text in the engine's own tools. A model built in code has none."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# what a Hugging Face folder's tokenizer is read from, besides its config
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)


def tokenizer_folder(model: Any) -> Path | None:
    """The Hugging Face folder a model was loaded from, when it holds a tokenizer (transformers records the
    folder as `name_or_path`); None for a model built in code."""
    folder = Path(str(getattr(model, "name_or_path", "") or ""))
    if str(folder) in ("", ".") or not folder.is_dir():
        return None
    return folder if any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")) else None


def copy_tokenizer(model: Any, destination: Path) -> Path | None:
    """Copy the model's tokenizer files into `destination` (a folder an exporter reads); the folder they
    came from, or None when the model has no tokenizer."""
    source = tokenizer_folder(model)
    if source is not None:
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, destination / name)
    return source

"""Atomic file writes: a reader (or a crash) never sees half a file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int | None = None) -> Path:
    """Write to a temp file in the same folder, fsync, then rename over the target."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())  # as open() would have made it
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as handle:
        return json.load(handle)


def tail(path: str | os.PathLike[str], max_chars: int = 2000) -> str:
    """Last characters of a log file (stderr of a failed trial), empty if it does not exist."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_chars))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes: what a weights file is, whatever its path or name."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def json_digest(value: Any) -> str:
    """sha256 of a JSON value's canonical text (sorted keys): what a record is, whatever its key order."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()

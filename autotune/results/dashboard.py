"""Serve a study in optuna-dashboard, bound to loopback unless told otherwise."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from rich.console import Console

from autotune.common.errors import UserError
from autotune.common.storage_urls import database_url, mask_url


def dashboard_executable() -> str:
    beside_python = Path(sys.executable).with_name("optuna-dashboard")
    found = str(beside_python) if beside_python.exists() else shutil.which("optuna-dashboard")
    if not found:
        raise UserError("optuna-dashboard is not installed: run 'make setup'")
    return found


def dashboard_argv(storage_url: str, host: str, port: int, artifact_dir: Path) -> list[str]:
    """optuna-dashboard serving the study and its artifacts (trial logs, best.json, report)."""
    artifact_dir.mkdir(parents=True, exist_ok=True)
    return [
        dashboard_executable(),
        database_url(storage_url),
        "--host",
        host,
        "--port",
        str(port),
        "--artifact-dir",
        str(artifact_dir),
    ]


def serve(storage_url: str, host: str, port: int, console: Console, artifact_dir: Path) -> int:
    """Replace this process with optuna-dashboard, so Ctrl-C and signals reach the server directly.
    The caller has opened the study already, so a bad or unreachable storage failed with one line."""
    argv = dashboard_argv(storage_url, host, port, artifact_dir)
    console.print(
        f"optuna-dashboard for {mask_url(storage_url)} at http://{host}:{port}/ (Ctrl-C to stop)", markup=False
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached

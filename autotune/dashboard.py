"""Serve a study in optuna-dashboard, bound to loopback unless told otherwise."""

from __future__ import annotations

import shutil
import subprocess
import sys

from rich.console import Console

from autotune.errors import UserError
from autotune.storage import mask_url, open_storage


def serve(storage_url: str, host: str, port: int, console: Console) -> int:
    open_storage(storage_url)  # fail early, with one line, on a bad or unreachable storage
    exe = shutil.which("optuna-dashboard", path=None) or str(__import__("pathlib").Path(sys.executable).with_name("optuna-dashboard"))
    if not shutil.which(exe):
        raise UserError("optuna-dashboard is not installed: run 'make setup'")
    console.print(f"optuna-dashboard for {mask_url(storage_url)} at http://{host}:{port}/ (Ctrl-C to stop)", markup=False)
    try:
        return subprocess.call([exe, storage_url, "--host", host, "--port", str(port)])
    except KeyboardInterrupt:
        return 0

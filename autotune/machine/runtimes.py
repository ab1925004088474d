"""Runtimes: Python environments a trial can run in, what each can run, and which one a trial goes to.

The main runtime is the interpreter running autotune. `make setup` also builds `.venv-ipex` beside it
(torch 2.8 + Intel Extension for PyTorch, which imports only with torch 2.8); it serves the backends the
main runtime cannot import. Runtimes given with `--runtime PATH` compete with the main one for every
backend they run (e.g. to compare torch versions in one study).

Each runtime is probed once (`python -m autotune.machine.runtime_report` inside it) and the report cached per
interpreter, invalidated when its installed packages or autotune's probe change. Workers in another
runtime import this autotune (the orchestrator's code) through PYTHONPATH, not whatever copy the
runtime may hold, so all processes of a study speak the same job format.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from autotune.backends import ENTRY_POINT_GROUP
from autotune.common.errors import UserError
from autotune.common.files import read_json, write_json_atomic
from autotune.common.json_record import OpenRecord, Record

MAIN = "main"
IPEX_VENV = ".venv-ipex"
PROBE_TIMEOUT_S = 180.0
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the autotune package


@dataclass(frozen=True)
class RuntimeRecord(OpenRecord):
    """What a trial and best.json keep about the runtime it ran in: its name, interpreter, torch, Python and
    package versions (a fingerprint keeps each runtime's under its name, without it). A trial stored before
    the record existed has the torch version only."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("python", "python_version", "packages")

    name: str = MAIN
    python: str | None = None
    torch: str | None = None
    python_version: str | None = None
    packages: dict[str, str] | None = None


@dataclass(frozen=True)
class Runtime(Record):
    """One Python environment and what its probe found."""

    name: str
    python: str
    role: str  # "main", "auto" (.venv-ipex: only backends no other runtime runs) or "explicit" (--runtime)
    torch: str | None = None
    python_version: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    backends: dict[str, str | None] = field(default_factory=dict)  # name -> None when it imports, else why not
    openmp: dict[str, str] = field(default_factory=dict)  # "gnu"/"intel" -> library path

    def runs(self, backend: str) -> bool:
        return backend in self.backends and self.backends[backend] is None

    def describe(self) -> str:
        return f"{self.name} ({self.python}, torch {self.torch or 'missing'})"

    def record(self) -> RuntimeRecord:
        """What a trial and best.json keep about the runtime it ran in."""
        return RuntimeRecord(self.name, self.python, self.torch, self.python_version, self.packages)


def interpreter_of(path: str | Path) -> Path:
    """A runtime given as a virtual environment folder or as its python executable."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(
            f"runtime {str(path)!r} does not exist: give a virtual environment folder or its python executable"
        )
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "bin" / "python3"):
            if candidate.exists():
                return candidate.absolute()
        raise UserError(
            f"runtime {str(path)!r} is a folder without bin/python: give a virtual environment folder or its python "
            "executable"
        )
    if not os.access(path, os.X_OK):
        raise UserError(
            f"runtime {str(path)!r} is not executable: give a virtual environment folder or its python executable"
        )
    return path.absolute()


def worker_pythonpath() -> str:
    """A folder holding only a link to this autotune package, for PYTHONPATH in other runtimes (the
    package's parent may be a site-packages whose torch must not shadow the runtime's own)."""
    digest = hashlib.sha256(str(PACKAGE_DIR).encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"autotune-{os.getuid()}-{digest}"
    link = folder / "autotune"
    if not link.exists():
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".autotune-{os.getpid()}"
        temp.unlink(missing_ok=True)
        temp.symlink_to(PACKAGE_DIR, target_is_directory=True)
        os.replace(temp, link)
    return str(folder)


def runtime_env(runtime: Runtime, base: dict[str, str]) -> dict[str, str]:
    """The environment a process of this runtime starts with: the main one runs as it is; another gets
    this autotune on PYTHONPATH and nothing of the main environment's Python settings."""
    if runtime.role == MAIN:
        return base
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = worker_pythonpath()
    return env


def replay_env(runtime: RuntimeRecord | None, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """For commands a user pastes (best.json, launch script): the interpreter of the runtime a trial ran
    in, and its variables plus PYTHONPATH when that runtime is not the main one."""
    runtime = runtime or RuntimeRecord()
    if runtime.name != MAIN:
        env = {**env, "PYTHONPATH": worker_pythonpath()}
    return runtime.python or sys.executable, env


def _cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "autotune" / "runtimes.json"


def _site_state(python: Path) -> str:
    """Changes whenever packages are installed or removed in the environment, or the probe code changes."""
    prefix = python.parent.parent
    parts = [str(python.resolve()), (PACKAGE_DIR / "machine" / "runtime_report.py").read_text()]
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        parts.append(f"{site}:{site.stat().st_mtime_ns}")
    backends = PACKAGE_DIR / "backends"
    parts.extend(f"{f.relative_to(backends)}:{f.stat().st_mtime_ns}" for f in sorted(backends.rglob("*.py")))
    # the backend plugins this process sees (a runtime's report lists the backends it registers)
    parts.extend(sorted(f"{p.name}={p.value}" for p in entry_points(group=ENTRY_POINT_GROUP)))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _run_report(python: Path, role: str) -> dict[str, Any]:
    base = dict(os.environ)
    env = base if role == MAIN else runtime_env(Runtime("probe", str(python), role), base)
    try:
        done = subprocess.run(
            [str(python), "-m", "autotune.machine.runtime_report"],
            capture_output=True,
            text=True,
            env=env,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"runtime {python} could not be probed ({exc}): is it a working Python?") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"runtime {python} could not be probed: {last}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise UserError(f"runtime {python} printed no probe report: is it a Python 3.10+ interpreter?") from None


def cached_report(python: Path, kind: str, produce: Callable[[], Any], extra_key: tuple[str, ...] = ()) -> Any:
    """A report made in a runtime (`kind`: the runtime report, the generation probe), from the cache while
    the runtime's packages, autotune's backends and plugins, and `extra_key` are what they were when it
    was made; else made again by `produce` and cached."""
    cache = _cache_path()
    state = _site_state(python)
    key = hashlib.sha256("\n".join((state, *extra_key)).encode()).hexdigest() if extra_key else state
    slot = str(python) if kind == "runtime" else f"{python} {kind}"  # the runtime report keeps its old slot
    try:
        cached = read_json(cache)
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(slot) if isinstance(cached, dict) else None
    if isinstance(entry, dict) and entry.get("key") == key:
        return entry["report"]
    report = produce()
    try:
        latest = read_json(cache) if cache.exists() else {}
    except (OSError, ValueError):
        latest = {}
    latest = latest if isinstance(latest, dict) else {}
    latest[slot] = {"key": key, "report": report}
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cache, latest)
    return report


def probe_runtime(python: Path, name: str, role: str) -> Runtime:
    """The runtime's report, from the cache when its packages have not changed since it was made."""
    report = cached_report(python, "runtime", lambda: _run_report(python, role))
    return Runtime(
        name=name,
        python=str(python),
        role=role,
        torch=report["torch"],
        python_version=report["python_version"],
        packages=report["packages"],
        backends=report["backends"],
        openmp=report["openmp"],
    )


def default_ipex_runtime() -> Path | None:
    """`.venv-ipex` beside the main virtual environment, when `make setup` built it."""
    candidate = Path(sys.prefix).parent / IPEX_VENV / "bin" / "python"
    return candidate if candidate.exists() and Path(sys.prefix).name != IPEX_VENV else None


def _env_dir(python: Path) -> Path:
    """The environment an interpreter belongs to (venv interpreters are links to one shared binary)."""
    return python.parent.parent.resolve()


def _explicit_name(python: Path, taken: set[str]) -> str:
    env_dir = python.parent.parent
    base = env_dir.name.lstrip(".") or "runtime"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def discover_runtimes(explicit: list[str] | tuple[str, ...] = ()) -> dict[str, Runtime]:
    """The main runtime, `.venv-ipex` when present, and the user's; probed in parallel, main first."""
    plans: list[tuple[Path, str, str]] = [(Path(sys.executable).absolute(), MAIN, MAIN)]
    ipex = default_ipex_runtime()
    explicit_paths = [interpreter_of(p) for p in explicit]
    if ipex is not None and all(_env_dir(p) != _env_dir(ipex) for p in explicit_paths):
        plans.append((ipex, "ipex", "auto"))
    taken = {name for _, name, _ in plans}
    for python in explicit_paths:
        if any(_env_dir(python) == _env_dir(p) for p, _, _ in plans):
            continue
        name = _explicit_name(python, taken)
        taken.add(name)
        plans.append((python, name, "explicit"))
    with ThreadPoolExecutor(max_workers=len(plans)) as pool:
        runtimes = list(pool.map(lambda plan: probe_runtime(*plan), plans))
    return {runtime.name: runtime for runtime in runtimes}


def runtimes_with(record: RuntimeRecord | None) -> dict[str, Runtime]:
    """The runtimes found here, plus the one a best.json names when it was an extra (--runtime) one."""
    runtimes = discover_runtimes()
    if record and record.name not in runtimes and record.python and Path(record.python).exists():
        runtimes[record.name] = probe_runtime(Path(record.python), record.name, "explicit")
    return runtimes


def candidates(backend: str, runtimes: dict[str, Runtime]) -> list[str]:
    """Runtimes a backend's trials may run in: the first of main/auto that imports it, plus every
    explicit runtime that does. More than one makes the runtime a search dimension."""
    chosen = [r.name for r in runtimes.values() if r.role in (MAIN, "auto") and r.runs(backend)][:1]
    chosen += [r.name for r in runtimes.values() if r.role == "explicit" and r.runs(backend)]
    return chosen


def why_not(backend: str, runtimes: dict[str, Runtime]) -> str:
    return "; ".join(f"{r.name}: {r.backends.get(backend) or 'not probed'}" for r in runtimes.values())

"""Real database servers for the tests of a study shared by several workers: PostgreSQL and MariaDB from
their Debian packages (installed by `make test`), each started in a temporary folder on a free loopback
port, with one fresh database per test."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import pytest

PG_USER = "autotune"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str], user: str) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the package's own user."""
    return ["runuser", "-u", user, "--", *argv] if os.geteuid() == 0 else argv


def _wait_for_port(port: int, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(
        f"database server did not listen on port {port}: {log.read_text()[-2000:] if log.exists() else ''}"
    )


def postgres_bin(name: str) -> str:
    """A PostgreSQL server program from the Debian package (not on PATH there), newest version first."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True) or (
        [shutil.which(name)] if shutil.which(name) else []
    )
    if not found:
        pytest.fail(f"PostgreSQL's {name} is not installed: run 'make test' (it installs the postgresql package)")
    return found[0]


def start_postgres() -> Iterator[Callable[[], str]]:
    """Yield a function giving the URL of a new empty database on a server private to this test run.

    Its folder is made directly under /tmp: pytest's own is private to root, whom PostgreSQL will not run as."""
    root = Path(tempfile.mkdtemp(prefix="autotune-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, log, port = root / "data", root / "server.log", free_port()
    user = "postgres"
    subprocess.run(
        _as_server_user([postgres_bin("initdb"), "-D", str(data), "-A", "trust", "-U", PG_USER, "--no-sync"], user),
        check=True,
        capture_output=True,
    )
    subprocess.run(
        _as_server_user(
            [
                postgres_bin("pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "start",
                "-o",
                f"-h 127.0.0.1 -p {port} -k {root} -F",
            ],
            user,
        ),
        check=True,
        capture_output=True,
    )
    _wait_for_port(port, log)
    numbers = count()

    def new_database() -> str:
        name = f"study{next(numbers)}"
        subprocess.run(
            [postgres_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, name],
            check=True,
            capture_output=True,
        )
        return f"postgresql://{PG_USER}@127.0.0.1:{port}/{name}"

    try:
        yield new_database
    finally:
        subprocess.run(
            _as_server_user([postgres_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], user),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def start_mariadb(root: Path) -> Iterator[Callable[[], str]]:
    """The same for MariaDB (a MySQL server): a private server, a new database per call."""
    install, server, client = (
        shutil.which("mariadb-install-db"),
        shutil.which("mariadbd") or "/usr/sbin/mariadbd",
        shutil.which("mariadb"),
    )
    if not (install and client and Path(server).exists()):
        pytest.fail("MariaDB is not installed: run 'make test' (it installs the mariadb-server package)")
    root.mkdir(parents=True, exist_ok=True)
    data, log, port = root / "data", root / "server.log", free_port()
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    subprocess.run(
        [
            install,
            "--no-defaults",
            f"--datadir={data}",
            f"--user={user}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
        check=True,
        capture_output=True,
    )
    process = subprocess.Popen(
        [
            server,
            "--no-defaults",
            f"--datadir={data}",
            f"--user={user}",
            "--bind-address=127.0.0.1",
            f"--port={port}",
            f"--socket={root / 'sock'}",
            f"--pid-file={root / 'pid'}",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=0",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    _wait_for_port(port, log)
    numbers = count()

    def new_database() -> str:
        name = f"study{next(numbers)}"
        sql = f"CREATE DATABASE {name}; CREATE USER IF NOT EXISTS 'autotune'@'%'; GRANT ALL ON *.* TO 'autotune'@'%';"
        subprocess.run(
            [client, "--no-defaults", "-h", "127.0.0.1", "-P", str(port), "-u", "root", "-e", sql],
            check=True,
            capture_output=True,
        )
        return f"mysql://autotune@127.0.0.1:{port}/{name}"

    try:
        yield new_database
    finally:
        process.terminate()
        process.wait(timeout=30)

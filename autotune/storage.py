"""Optuna storage: any RDB URL (SQLite by default), with heartbeats so dead runs are detected."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from autotune.errors import UserError

HEARTBEAT_INTERVAL_S = 15
GRACE_PERIOD_S = 60


def mask_url(url: str) -> str:
    """The URL with any password hidden: safe for logs, best.json and printed commands."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url


def open_storage(url: str) -> optuna.storages.RDBStorage:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise UserError(f"storage {mask_url(url)!r} is not a database URL, e.g. sqlite:///studies/x/study.db or postgresql://host/db") from None
    kwargs = {}
    try:
        if parsed.get_backend_name() == "sqlite":
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=GRACE_PERIOD_S, **kwargs
            )
    except Exception as exc:  # driver missing, server down, bad credentials: one clear line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {mask_url(url)}: {first}") from None

"""Optuna storage: any RDB URL (SQLite by default; PostgreSQL or MySQL for a fleet), with heartbeats so
the trials of a dead orchestrator are failed and retried."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.engine import make_url

from autotune.common.errors import UserError
from autotune.common.storage_urls import database_url, mask_url
from autotune.tuning.fleet import SilentWorkerRetry, record_silent_worker

GRACE_PERIOD_S = 60  # a RUNNING trial whose orchestrator sent no heartbeat for this long is failed and retried
# The drivers installed with autotune, for URLs that name none (SQLAlchemy would look for psycopg2, mysqlclient).


class HeartbeatStorage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage that writes on each trial it finds stale why it is failed: whoever fails a stale
    trial (Optuna at a trial's start, autotune after one) asks this first, and a finished trial's attributes
    can no longer be written."""

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        stale = super()._get_stale_trial_ids(study_id)
        for trial_id in stale:
            record_silent_worker(self, trial_id, self.grace_period)
        return stale


def open_storage(
    url: str, grace_period_s: float = GRACE_PERIOD_S, say: Callable[[str], None] | None = None
) -> optuna.storages.RDBStorage:
    """Optuna's RDBStorage with heartbeats: every running trial beats every grace/4 seconds; a trial whose
    worker went silent gets its cause when found stale and, once failed, is queued again and `say` tells."""
    given, url = url, database_url(url)
    parsed = make_url(url)
    kwargs: dict[str, Any] = {}
    try:
        if parsed.get_backend_name() == "sqlite":
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        else:  # a database server: a connection it dropped (restart, idle timeout) is replaced, not an error
            kwargs["engine_kwargs"] = {"pool_pre_ping": True}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            grace = max(2, round(grace_period_s))
            return HeartbeatStorage(
                url,
                heartbeat_interval=max(1, grace // 4),
                grace_period=grace,
                heartbeat_stale_trial_callback=SilentWorkerRetry(say),
                **kwargs,
            )
    except Exception as exc:  # driver missing, server down, bad credentials: one clear line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {mask_url(given)}: {first}") from None

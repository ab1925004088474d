"""Storage URLs: a password hidden for anything printed or stored, and the installed driver filled in
where a URL names none (SQLAlchemy would otherwise look for psycopg2 or mysqlclient)."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from autotune.common.errors import UserError

DEFAULT_DRIVERS = {"postgresql": "psycopg", "mysql": "pymysql", "mariadb": "pymysql"}


def mask_url(url: str) -> str:
    """The URL with any password hidden: safe for logs, best.json and printed commands."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url


def database_url(url: str) -> str:
    """The URL with the installed driver where it names none: postgresql://h/db -> postgresql+psycopg://h/db."""
    try:
        parsed = make_url(url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url)
    except (ArgumentError, ValueError):
        raise UserError(
            f"storage {mask_url(url)!r} is not a database URL, e.g. sqlite:///studies/x/study.db or postgresql://user@host/db"
        ) from None
    driver = DEFAULT_DRIVERS.get(parsed.drivername)
    return (
        parsed.set(drivername=f"{parsed.drivername}+{driver}").render_as_string(hide_password=False) if driver else url
    )

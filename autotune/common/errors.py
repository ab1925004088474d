"""Errors the user can fix: the CLI prints them as one line and exits with code 2."""

from typing import Any


class UserError(Exception):
    """Bad input. The message says what is wrong and what to do about it."""


class TrialFailed(Exception):
    """A trial could not produce a measurement (crash, hang, bad output). The study goes on."""

    def __init__(self, cause: str, stderr_tail: str = "", attrs: dict[str, Any] | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.stderr_tail = stderr_tail
        self.attrs = attrs or {}  # what the failed trial records beside its cause

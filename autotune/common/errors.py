"""Errors the user can fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input. The message says what is wrong and what to do about it."""


class TrialFailed(Exception):
    """A trial could not produce a measurement (crash, hang, bad output). The study goes on."""

    def __init__(self, cause: str, stderr_tail: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.stderr_tail = stderr_tail

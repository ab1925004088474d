"""A worker ends without running native destructors.

A worker is one job in a process of its own: once its result file is written, nothing it built is
needed again. Native runtimes can deadlock while being destroyed: a finalist run of efficientnet_b0 on
OpenVINO (an AsyncInferQueue whose completion callback takes the GIL) wrote its timed stamps, then hung
as its runner was released on the way out of the task, until the search's deadline killed it 10 minutes
later. So the models and runners a task builds are kept here until the process ends, and the process
ends with os._exit once its output is flushed: no destructor, atexit hook or thread join can hold a
finished measurement hostage. The orchestrator kills the process group afterwards (runner/launch.py),
so nothing a worker started outlives it.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

_KEPT: list[Any] = []


def keep_until_exit(built: T) -> T:
    """Hold `built` (a model, a runner) so it is never destroyed while the worker runs."""
    _KEPT.append(built)
    return built


def exit_now(code: int) -> NoReturn:
    """Flush what the worker printed and end the process at once, skipping every destructor."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # what native libraries printed through C stdio
    except (OSError, AttributeError):
        pass
    os._exit(code)


def exit_code(stop: SystemExit) -> int:
    """The status a SystemExit asks for, as the interpreter would turn it into one."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1

"""The load generator's loop around an engine that batches continuously in the caller's thread (OpenVINO
GenAI's ContinuousBatchingPipeline: add_request, then step; its step holds the GIL, so arrivals and steps
share one loop): requests are handed to the engine when their scheduled arrival has passed, each step's new
tokens are stamped when the step returns, and the server idles until the next arrival when it has none.

A token's time is the end of the step that made it, as a streaming client would receive it a moment later.
A request is handed over at the first step boundary after its arrival, and its TTFT counts from the arrival:
the wait for the running step is queueing, as a user waits it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from autotune.measure.llm_load import RequestTiming
from autotune.measure.serving import wait_until


class SteppedEngine(Protocol):
    """An engine the loop drives: requests in, one batched step at a time, the tokens each step made out."""

    def add(self, request_id: int, prompt_tokens: int, max_new_tokens: int) -> None: ...

    def step(self) -> dict[int, int]:
        """Run one step; return the tokens it produced per request id (a finished request's last included)."""
        ...

    def has_work(self) -> bool: ...


def drive(
    engine: SteppedEngine,
    offsets: np.ndarray,
    prompt_lengths: np.ndarray,
    output_lengths: np.ndarray,
    give_up_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[RequestTiming]:
    """Offer the requests at `offsets` seconds from now and return each one's token times on the same clock
    (from 0). `give_up_s`: stop stepping once this many seconds have passed (an overloaded probe is refused
    without draining its queue; the requests not finished by then keep the tokens they got)."""
    count = len(offsets)
    times: list[list[float]] = [[] for _ in range(count)]
    start = clock()
    offered = 0
    while offered < count or engine.has_work():
        now = clock() - start
        if give_up_s is not None and now > give_up_s:
            break
        while offered < count and offsets[offered] <= now:
            engine.add(offered, int(prompt_lengths[offered]), int(output_lengths[offered]))
            offered += 1
        if not engine.has_work():
            wait_until(start + float(offsets[offered]), clock)
            continue
        produced = engine.step()
        stamp = clock() - start
        for request, tokens in produced.items():
            times[request].extend([stamp] * tokens)
    return [RequestTiming(float(offsets[i]), int(output_lengths[i]), tuple(times[i])) for i in range(count)]

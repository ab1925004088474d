"""The load generator's loops around a language-model server: requests are handed over when their scheduled
arrival has passed and every output token is stamped when it reaches the generator, on one clock from the
probe's start. TTFT counts from the scheduled arrival (llm_load), so waiting to be handed over is queueing,
as a user waits it.

Two kinds of server:
- one that batches continuously in the caller's thread (OpenVINO GenAI's ContinuousBatchingPipeline:
  add_request, then step; its step holds the GIL, so arrivals and steps share one loop): each step's new
  tokens are stamped when the step returns, and a request is handed over at the first step boundary after
  its arrival (`drive`); a pool of such engines in their own processes is driven by the same loop, its
  `step` returning the tokens they sent by the next arrival;
- one in another process that streams each request's tokens over its own connection (llama-server): a thread
  per request sends it at its arrival and stamps each token as its chunk is read (`drive_streaming`).
Either gives up at `give_up_s` without draining its queue: an overloaded probe is refused quickly, and the
requests not finished by then keep the tokens they got.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from autotune.measure.llm_load import RequestTiming
from autotune.measure.serving import wait_until


class SteppedEngine(Protocol):
    """An engine the loop drives: requests in, one batched step at a time, the tokens each step made out."""

    def add(self, request_id: int, prompt: np.ndarray, max_new_tokens: int) -> None: ...

    def step(self, wait_s: float | None = None) -> dict[int, list[int]]:
        """Run one step; return the token ids it produced per request id (a finished request's last ones
        included). `wait_s`: when the next request is due; an engine in this thread steps now, a pool of
        engine processes waits at most that long for their tokens (None: until some come)."""
        ...

    def has_work(self) -> bool: ...

    def abort(self) -> None:
        """Drop every request it holds (a probe given up), so the next probe starts on an idle server."""
        ...


class StreamingServer(Protocol):
    """A server a request is streamed from: `stream` sends one request and calls `on_tokens` with each chunk
    of token ids as it arrives, returning when the answer ends; `cancel_all` closes every open request's
    connection (their `stream` calls return, and the server drops them); `settle` waits until the server
    serves no request."""

    def stream(
        self,
        prompt: np.ndarray,
        max_new_tokens: int,
        on_tokens: Callable[[list[int]], None],
        cancelled: threading.Event,
    ) -> None: ...

    def cancel_all(self) -> None: ...

    def settle(self) -> None: ...


def _timings(offsets: np.ndarray, output_lengths: np.ndarray, times: list[list[float]]) -> list[RequestTiming]:
    """Each request's arrival, tokens asked and token times: what a loop returns."""
    return [RequestTiming(float(offsets[i]), int(output_lengths[i]), tuple(times[i])) for i in range(len(offsets))]


def drive(
    engine: SteppedEngine,
    offsets: np.ndarray,
    prompts: Sequence[np.ndarray],
    output_lengths: np.ndarray,
    give_up_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    received: list[list[int]] | None = None,
) -> list[RequestTiming]:
    """Offer the requests at `offsets` seconds from now and return each one's token times on the same clock
    (from 0); `received`, when given, gets each request's token ids. `give_up_s`: stop stepping once this
    many seconds have passed."""
    count = len(offsets)
    times: list[list[float]] = [[] for _ in range(count)]
    tokens: list[list[int]] = [[] for _ in range(count)]
    start = clock()
    offered = 0
    while offered < count or engine.has_work():
        now = clock() - start
        if give_up_s is not None and now > give_up_s:
            engine.abort()  # its unfinished requests would run on into the next probe
            break
        while offered < count and offsets[offered] <= now:
            engine.add(offered, prompts[offered], int(output_lengths[offered]))
            offered += 1
        if not engine.has_work():
            wait_until(start + float(offsets[offered]), clock)
            continue
        due = float(offsets[offered]) if offered < count else give_up_s
        produced = engine.step(None if due is None else due - now)
        stamp = clock() - start
        for request, ids in produced.items():
            if 0 <= request < count:  # an earlier probe's request the engine still held: not this probe's
                times[request].extend([stamp] * len(ids))
                tokens[request].extend(ids)
    if received is not None:
        received[:] = tokens
    return _timings(offsets, output_lengths, times)


def drive_streaming(
    server: StreamingServer,
    offsets: np.ndarray,
    prompts: Sequence[np.ndarray],
    output_lengths: np.ndarray,
    give_up_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    received: list[list[int]] | None = None,
) -> list[RequestTiming]:
    """`drive` for a streaming server: this thread starts each request's thread at its arrival, then waits
    for them until `give_up_s`, when the unfinished ones are cancelled. A request whose stream failed (the
    server died) keeps the tokens it got, and the failure is raised once every thread has returned."""
    count = len(offsets)
    times: list[list[float]] = [[] for _ in range(count)]
    tokens: list[list[int]] = [[] for _ in range(count)]
    failures: list[BaseException] = []
    cancelled = threading.Event()
    start = clock()

    def one(index: int) -> None:
        def on_tokens(ids: list[int]) -> None:
            stamp = clock() - start
            times[index].extend([stamp] * len(ids))
            tokens[index].extend(ids)

        try:
            server.stream(prompts[index], int(output_lengths[index]), on_tokens, cancelled)
        except BaseException as failure:  # carried to the caller's thread
            if not cancelled.is_set():  # a stream shut by the give-up is not a failure
                failures.append(failure)
                cancelled.set()

    threads = []
    for index in range(count):
        wait_until(start + float(offsets[index]), clock)
        if cancelled.is_set() or (give_up_s is not None and clock() - start > give_up_s):
            break
        thread = threading.Thread(target=one, args=(index,), daemon=True, name=f"request-{index}")
        thread.start()
        threads.append(thread)
    for thread in threads:
        left = None if give_up_s is None else max(0.0, start + give_up_s - clock())
        thread.join(left)
        if thread.is_alive():
            break
    if any(thread.is_alive() for thread in threads):
        cancelled.set()
        server.cancel_all()  # a request waiting for a slot blocks in its read: its connection is shut
        for thread in threads:
            thread.join(10.0)
        server.settle()  # the server dropped them before the next probe begins
    if failures:
        raise failures[0]
    if received is not None:
        received[:] = tokens
    return _timings(offsets, output_lengths, times)

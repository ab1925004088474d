"""The server scenario's stopwatch: requests arrive one at a time, wait in a queue, are batched by a
policy, and a request's latency is its completion time minus its arrival time.

Arrivals are a seeded Poisson process in real time (the model really runs between them); the queue is
served by one loop per instance that sends a batch when it is full (`max_batch`) or when its oldest
request has waited `max_wait_s`, and otherwise as soon as the model is free (a wait of 0). Batches are
padded: every call runs the full `max_batch` shape the backend was prepared for, however many requests
fill it. The clock is time.monotonic, as for every other measurement.

A rate is *sustained* when the p99 of the request latencies is within the bound and the queue did not
grow over the probe (a growing queue is overload, however good the p99 looked so far). The highest
sustained rate is found by bisection below the closed-loop throughput, which bounds it from above.
Pure functions and one small class over callables and arrays, so they can be tested on synthetic
servers whose answer queueing theory gives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from autotune.common.json_record import Record
from autotune.measure.stopwatch import LatencySummary, latency_summary, samples_needed

SPIN_S = 0.0003  # the last stretch of a wait is spun, not slept: a sleep overshoots by ~0.1 ms
# Overload: the queue at the end of the arrivals exceeds its level early in the probe by more than this
# share of the requests (or two full batches, whichever is larger): 2% of 1,000 requests is past the
# fluctuations of a stable queue at 90% load, and 1.2x the capacity grows it by about 170.
GROWTH_SHARE = 0.02
MIN_REQUESTS = samples_needed(99)  # a probe yields a p99 only with this many requests (all instances)
# A probe lasts long enough for this many requests when its window allows: a p99 of 100 requests is their
# second largest latency and varies by tens of percent between probes; with 1,000 (the tenth largest) a
# simulated M/D/1 server's sustained rate came out within 10% of queueing theory's in 26 of 30 searches,
# against 9 of 30 with 300 (tests/test_serving.py).
PROBE_REQUESTS = 1000
RELATIVE_TOLERANCE = 0.05  # the bisection stops once the unsustained rate is within 5% of the sustained
MAX_PROBES = 8
FIRST_PROBE_SHARE = 0.9  # the first probe: 90% of the closed-loop throughput
UPPER_HEADROOM = 1.1  # the bisection may go 10% past the closed-loop throughput, measured in a short window
LOWEST_SHARE = 1 / 64  # below this share of the closed-loop throughput the search gives up
# A refused probe during which the server loop lost more than this share of the bound at once (woken late
# from a wait, or a call stretched past the others) was refused for the machine, not the server: the
# rate is probed again, at most STALL_RETRIES times per search. Seen in a full test run on 2 shared
# cores: a 2 ms server sustained half of queueing theory's rate after one such refusal.
STALL_SHARE_OF_BOUND = 0.5
STALL_RETRIES = 2
ROUTING = "random: each instance runs its own Poisson stream at rate / instances (seeded per instance and probe)"
BATCHING = "padded: every call runs the full max_batch shape; the requests that fill it share its result"


@dataclass(frozen=True)
class ServedRequests:
    """What one instance's server loop did in one probe: per request its arrival and completion (NaN
    when it was still unanswered when the loop gave up), and per call how many requests filled it and
    the queue length when it was sent."""

    arrivals: np.ndarray
    completions: np.ndarray
    batch_fill: np.ndarray
    queue_at_send: np.ndarray
    send_times: np.ndarray
    start: float  # when the arrivals began (the probe's clock zero)
    duration_s: float  # how long arrivals came
    longest_stall_s: float = 0.0  # the longest stretch the loop lost at once (see `serve`); 0 when not measured

    @property
    def latencies_s(self) -> np.ndarray:
        """Completion minus arrival of the requests answered."""
        done = ~np.isnan(self.completions)
        return self.completions[done] - self.arrivals[done]

    @property
    def call_durations_s(self) -> np.ndarray:
        """How long each answered call took, send to completion: the service time under this load, which
        can differ from the closed loop's (another window of a shared machine, caches warm or not)."""
        firsts = np.cumsum(self.batch_fill) - self.batch_fill  # each call's first request
        if len(firsts) == 0:
            return np.empty(0)
        durations = self.completions[firsts] - self.send_times
        return durations[~np.isnan(durations)]

    def backlog_at(self, moment: float) -> int:
        """Requests arrived and not yet answered at this moment."""
        arrived = int(np.searchsorted(self.arrivals, moment, side="right"))
        answered = int(np.count_nonzero(self.completions <= moment))
        return arrived - answered

    def backlog_early(self) -> float:
        """The queue length at the sends of the probe's first quarter (0 when none was made then)."""
        early = self.queue_at_send[self.send_times <= self.start + self.duration_s / 4]
        return float(np.median(early)) if len(early) else 0.0


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int) -> np.ndarray:
    """Arrival offsets in seconds (from 0, sorted) of a Poisson process of this rate over the duration."""
    rng = np.random.default_rng(seed)
    expected = rate_per_s * duration_s
    count = int(expected + 10 * math.sqrt(expected) + 20)  # enough gaps to pass the end, almost surely
    offsets = np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))
    while offsets[-1] < duration_s:  # the rare case that was not enough
        more = offsets[-1] + np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))
        offsets = np.concatenate([offsets, more])
    return offsets[offsets < duration_s]


def wait_until(moment: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep until shortly before the moment, then spin to it."""
    remaining = moment - clock()
    if remaining > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while clock() < moment:
        pass


def serve(
    step: Callable[[], Any],
    offsets: np.ndarray,
    max_batch: int,
    max_wait_s: float,
    drain_s: float,
    clock: Callable[[], float] = time.monotonic,
    start: float | None = None,
    wait: Callable[[float], None] | None = None,
) -> ServedRequests:
    """Run one probe: requests arrive at `start + offsets`, and the loop sends a batch (one `step()`)
    when `max_batch` are queued, when the oldest has waited `max_wait_s`, or, with nothing more to
    wait for, when the model is free. After the last arrival it goes on answering for at most
    `drain_s` (an overloaded queue is not drained to the end: its requests stay unanswered). `clock` and
    `wait` (until a moment) are real time unless a test gives a simulated pair.

    The longest stall is what the machine took from the loop at once: the latest it woke from a wait
    after the moment it asked for, or the most a call took past the median call (every call runs the
    same shape)."""
    start = clock() if start is None else start
    wait = wait or (lambda moment: wait_until(moment, clock))
    arrivals = start + np.asarray(offsets, dtype=np.float64)
    total = len(arrivals)
    completions = np.full(total, np.nan)
    fills, queues, sends = [], [], []
    end_of_arrivals = start + (float(offsets[-1]) if total else 0.0)
    give_up = end_of_arrivals + drain_s
    head = 0  # the oldest request not yet sent
    late = 0.0  # the latest wake-up after the moment waited for
    while head < total:
        now = clock()
        if now > give_up:
            break
        arrived = int(np.searchsorted(arrivals, now, side="right"))
        queued = arrived - head
        if queued == 0:
            woken = arrivals[head]
            wait(woken)
            late = max(late, clock() - woken)
            continue
        deadline = arrivals[head] + max_wait_s  # the oldest may wait until then (compared as sent: no rounding)
        if queued < max_batch and now < deadline and arrived < total:
            woken = min(deadline, arrivals[arrived])
            wait(woken)
            late = max(late, clock() - woken)
            continue
        take = min(queued, max_batch)
        sends.append(now)
        queues.append(queued)
        fills.append(take)
        step()
        completions[head : head + take] = clock()
        head += take
    duration = float(offsets[-1]) if total else 0.0
    served = ServedRequests(
        arrivals,
        completions,
        np.asarray(fills, dtype=np.int64),
        np.asarray(queues, dtype=np.int64),
        np.asarray(sends, dtype=np.float64),
        start,
        duration,
    )
    calls = served.call_durations_s
    stretched = float(calls.max() - np.median(calls)) if len(calls) else 0.0
    return replace(served, longest_stall_s=max(late, stretched))


def quantile_ci(values: np.ndarray, quantile: float, confidence: float = 0.95) -> list[float] | None:
    """A distribution-free confidence interval of a quantile (order statistics, normal approximation of
    the binomial); None when there are too few values for its upper end (p99 at 95%: fewer than 381)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n == 0:
        return None
    z = 1.959963984540054 if abs(confidence - 0.95) < 1e-9 else _normal_quantile(1 - (1 - confidence) / 2)
    spread = z * math.sqrt(n * quantile * (1 - quantile))
    low, high = math.floor(n * quantile - spread), math.ceil(n * quantile + spread)  # 1-based ranks
    if low < 1 or high > n:
        return None
    return [float(x[low - 1]), float(x[high - 1])]


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


@dataclass(frozen=True)
class ServerProbe(Record):
    """One offered rate, all instances together: what it achieved, the request latencies, the queue at
    the probe's start and end, and whether the rate counts as sustained (with why not)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"latency_ms": LatencySummary, "call_ms": LatencySummary}

    rate_rps: float  # offered, all instances together
    achieved_rps: float  # answered within the arrivals' duration, per second
    requests: int
    answered: int
    duration_s: float
    latency_ms: LatencySummary
    p99_ci_ms: list[float] | None
    queue_start: float  # requests waiting at the sends of the probe's first quarter (median, worst instance)
    queue_end: int  # requests arrived and unanswered when the arrivals ended (all instances)
    mean_batch_fill: float
    overloaded: bool
    sustained: bool
    why: str  # in words: what decided it
    noise_flags: list[str] = field(default_factory=list)
    call_ms: LatencySummary | None = None  # the model's calls during the probe, send to completion
    longest_stall_ms: float = 0.0  # the longest the server loop lost at once (ServedRequests.longest_stall_s)


def growth_allowed(requests: int, max_batch: int) -> float:
    """How far an instance's queue may end above its early level before it counts as overload: two full
    batches or GROWTH_SHARE of its requests, whichever is larger, but never more than a tenth of them
    (many instances with large batches would otherwise switch the check off)."""
    return max(min(2 * max_batch, 0.1 * requests), GROWTH_SHARE * requests)


def judge_probe(
    served: list[ServedRequests], rate_rps: float, slo_ms: float, max_batch: int, confidence: float = 0.95
) -> ServerProbe:
    """One probe's verdict from every instance's requests: sustained when the p99 (which needs 100
    requests) is within the bound and no instance's queue grew over the probe."""
    latencies = np.concatenate([s.latencies_s for s in served]) if served else np.empty(0)
    requests = sum(len(s.arrivals) for s in served)
    answered = sum(int(np.count_nonzero(~np.isnan(s.completions))) for s in served)
    duration = max((s.duration_s for s in served), default=0.0)
    in_time = sum(int(np.count_nonzero(s.completions <= s.start + s.duration_s)) for s in served)
    ends = [s.backlog_at(s.start + s.duration_s) for s in served]
    starts = [s.backlog_early() for s in served]
    grew = [end - early > growth_allowed(len(s.arrivals), max_batch) for s, end, early in zip(served, ends, starts)]
    unanswered = requests - answered
    overloaded = any(grew) or unanswered > 0
    summary = latency_summary(latencies, confidence)
    ci = quantile_ci(latencies * 1e3, 0.99, confidence)
    fills = np.concatenate([s.batch_fill for s in served]) if served else np.empty(0)
    calls = np.concatenate([s.call_durations_s for s in served]) if served else np.empty(0)
    if overloaded:
        why = (
            f"overload: the queue grew to {sum(ends)} requests (from {max(starts):.0f})"
            if any(grew)
            else f"overload: {unanswered} requests still unanswered after the arrivals ended"
        )
    elif summary.p99 is None:
        why = f"too few requests for a p99 ({requests}, needs {MIN_REQUESTS})"
    elif summary.p99 > slo_ms:
        why = f"p99 {summary.p99:.1f} ms > {slo_ms:g} ms"
    else:
        why = f"p99 {summary.p99:.1f} ms <= {slo_ms:g} ms, queue steady"
    sustained = not overloaded and summary.p99 is not None and summary.p99 <= slo_ms
    stall_ms = max((s.longest_stall_s for s in served), default=0.0) * 1e3
    flags = []
    if not sustained and stall_ms > STALL_SHARE_OF_BOUND * slo_ms:
        flags.append(f"stalled: the server loop lost {stall_ms:.1f} ms at once (the machine, not the server)")
    return ServerProbe(
        rate_rps=rate_rps,
        achieved_rps=in_time / duration if duration > 0 else 0.0,
        requests=requests,
        answered=answered,
        duration_s=duration,
        latency_ms=summary,
        p99_ci_ms=ci,
        queue_start=max(starts) if starts else 0.0,
        queue_end=int(sum(ends)),
        mean_batch_fill=float(fills.mean()) if len(fills) else 0.0,
        overloaded=overloaded,
        sustained=sustained,
        why=why,
        noise_flags=flags,
        call_ms=latency_summary(calls, confidence) if len(calls) else None,
        longest_stall_ms=stall_ms,
    )


class RateSearch:
    """Bisection over the offered rate below the closed-loop throughput `upper_rps` (which bounds the
    sustainable rate from above; UPPER_HEADROOM allows for its short window): the first probe at 90% of
    it (or at the rates given first, e.g. a winner's rate and +-10% for the finalists), then halfway
    between the highest sustained and the lowest unsustained rate, until they are within
    RELATIVE_TOLERANCE, MAX_PROBES are spent, or the next rate would be below `lowest_rps` (and 1/64 of
    the upper bound) with none sustained. A refusal the machine disturbed (a stalled probe) is not a
    verdict: that rate is offered again, up to STALL_RETRIES times, each one a probe more."""

    def __init__(
        self,
        upper_rps: float,
        first_rates: list[float] | None = None,
        max_probes: int = MAX_PROBES,
        lowest_rps: float = 0.0,
    ):
        self.upper = upper_rps
        self.lowest = max(lowest_rps, upper_rps * LOWEST_SHARE)  # below this the search gives up
        self.low = 0.0  # highest sustained so far
        # lowest unsustained so far; until one is found, the closed-loop bound with room for its own noise
        # (a short window): a rate past the true capacity is caught as overload.
        self.high = upper_rps * UPPER_HEADROOM
        self.queued = [r for r in (first_rates or []) if r > 0] or [FIRST_PROBE_SHARE * upper_rps]
        self.max_probes = max_probes
        self.probes = 0
        self.retries = 0

    def next_rate(self) -> float | None:
        """The next rate to offer, or None when the search is over."""
        if self.probes >= self.max_probes or self.upper <= 0:
            return None
        while self.queued:
            rate = self.queued.pop(0)
            if max(self.low, self.lowest) <= rate < self.high:
                return rate
        if self.low > 0 and self.high <= self.low * (1 + RELATIVE_TOLERANCE):
            return None
        if self.low == 0 and self.high / 2 < self.lowest:
            return None
        return (self.low + self.high) / 2 if self.low > 0 else self.high / 2

    def record(self, rate: float, sustained: bool, disturbed: bool = False) -> None:
        self.probes += 1
        if not sustained and disturbed and self.retries < STALL_RETRIES:
            self.retries += 1
            self.max_probes += 1
            self.queued.insert(0, rate)
            return
        if sustained:
            self.low = max(self.low, rate)
        else:
            self.high = min(self.high, rate)

    @property
    def sustained_rps(self) -> float:
        return self.low


def probe_seconds(rate_rps: float, min_s: float, max_s: float) -> float:
    """A probe lasts its minimum, longer while that holds fewer than PROBE_REQUESTS arrivals (the p99's
    precision), up to `max_s`, and past it while that holds fewer than MIN_REQUESTS (a p99 at all)."""
    if rate_rps <= 0:
        return min_s
    return min(max(min_s, PROBE_REQUESTS / rate_rps), max(max_s, 1.2 * MIN_REQUESTS / rate_rps))


def lowest_rate(max_s: float) -> float:
    """The lowest rate worth a probe: one that collects MIN_REQUESTS within three of the longest windows."""
    return 1.2 * MIN_REQUESTS / (3 * max_s)


@dataclass(frozen=True)
class ServerMetrics(Record):
    """A trial of the server scenario: the highest request rate sustained at the p99 bound, the
    batching policy that sustained it, and every probe of the rate search."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"probes": ServerProbe}

    sustained_rps: float
    slo_ms: float
    max_batch: int  # the configuration's batch size: what a server built on it should batch to
    max_wait_ms: float
    upper_bound_rps: float  # the closed-loop throughput the rate search started below
    probes: list[ServerProbe]
    instances: int
    seed: int
    verdict: str = ""  # why the search ended where it did, in words
    # Requests one call takes: max_batch, or max_batch x streams for a multi-stream OpenVINO configuration,
    # whose call keeps one batch per stream in flight.
    requests_per_call: int | None = None
    batching: str = BATCHING
    routing: str = ROUTING
    rule: str = (
        "sustained: p99 of completion - arrival within the bound over at least 100 requests, and no instance's "
        "queue at the end of the arrivals above its level in the first quarter by more than max(2 batches, 2% of "
        "its requests), and every request answered"
    )

    @property
    def at_sustained(self) -> ServerProbe | None:
        """The probe at the sustained rate (None when no rate was)."""
        kept = [p for p in self.probes if p.sustained and p.rate_rps == self.sustained_rps]
        return kept[-1] if kept else None

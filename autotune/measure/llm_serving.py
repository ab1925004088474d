"""The language-model server scenario's verdicts: the highest Poisson request rate a continuous-batching
server sustains within p99 (or p90) bounds on TTFT and TPOT.

A probe offers requests at one rate (llm_load's draws, scheduled arrivals) and scores them (llm_load's
summary). It is *sustained* when every request completed, the backlog (requests arrived and not yet
finished, at each arrival) over the last quarter of the arrivals is not above its level over the first
quarter (medians) by more than GROWTH_SHARE of the requests, 2, or half the early level, whichever is
largest (a growing backlog is overload, however good the percentiles looked so far; the allowance does not
scale with a server's configured concurrency, which can be far above what it holds), and the quantile asked
of TTFT and of TPOT is within its bound over enough completed requests to have one (p99: 100, p90: 10).
A probe waits for its requests after the last arrival long enough for the longest to finish at the bounds.
The rate is bisected below the server's saturated throughput (every request offered at once), which bounds
it from above, by the classification server scenario's RateSearch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from autotune.common.json_record import Record
from autotune.measure.llm_load import LoadSummary, RequestMix, RequestTiming, summarize
from autotune.measure.serving import PROBE_REQUESTS, RELATIVE_TOLERANCE, UPPER_HEADROOM, RateSearch
from autotune.measure.stopwatch import samples_needed

QUANTILES = (90, 99)
# The seconds a probe may run past its last arrival before it is given up (the requests not finished by
# then are not completed: overload): the longest request at the bounds (TTFT bound plus its output at the
# TPOT bound, or at the per-token time measured when TPOT is unbounded), times DRAIN_MARGIN, at least
# DRAIN_MIN_S.
DRAIN_MARGIN = 2.0
DRAIN_MIN_S = 2.0
GROWTH_SHARE = 0.02
GROWTH_MIN = 2
# A search that sustained every probe up to its ceiling doubles its upper bound, at most this many times.
CEILING_RAISES = 2
# a probe's arrivals last at least and at most this long (a search's: its measuring window's)
PROBE_MIN_S = 10.0
PROBE_MAX_S = 60.0
# a search's requests: prompt and output lengths uniform within +-50% of the workload's (guidellm's and vLLM's
# random datasets take such a range ratio)
LENGTH_SPREAD = 0.5


@dataclass(frozen=True)
class LatencyBounds(Record):
    """The service level a rate must hold: the `quantile` (90 or 99) of TTFT and of TPOT in milliseconds
    (None: that one unbounded)."""

    ttft_ms: float | None
    tpot_ms: float | None
    quantile: int = 99

    def __post_init__(self) -> None:
        if self.quantile not in QUANTILES:
            raise ValueError(f"the bounds' quantile must be one of {QUANTILES}, got {self.quantile}")
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("a server scenario needs a TTFT or a TPOT bound")

    @property
    def min_requests(self) -> int:
        """Completed requests a probe needs for the quantile to exist at all."""
        return samples_needed(self.quantile)

    def drain_s(self, longest_output: int, measured_tpot_s: float = 0.0) -> float:
        """How long a probe waits for its requests after the last arrival before giving up: the longest
        output at the TPOT bound (or at `measured_tpot_s` without one) after the TTFT bound, with margin."""
        tpot_s = self.tpot_ms / 1e3 if self.tpot_ms is not None else measured_tpot_s
        longest = (self.ttft_ms or 0.0) / 1e3 + max(longest_output - 1, 0) * tpot_s
        return max(DRAIN_MIN_S, DRAIN_MARGIN * longest)

    def describe(self) -> str:
        parts = [
            f"{name} p{self.quantile} <= {bound:g} ms"
            for name, bound in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms))
            if bound is not None
        ]
        return " and ".join(parts)


@dataclass(frozen=True)
class ServingPlan(Record):
    """What a server trial offers: the request mix, the bounds, the seed its probes are drawn from, and the
    window a probe aims for."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"mix": RequestMix, "bounds": LatencyBounds}

    mix: RequestMix
    bounds: LatencyBounds
    seed: int = 0
    probe_min_s: float = PROBE_MIN_S
    probe_max_s: float = PROBE_MAX_S


def backlog_at(timings: list[RequestTiming], moments: np.ndarray) -> np.ndarray:
    """At each moment, the requests arrived by then and not finished by then (one never completed counts):
    arrivals and finishes sorted once, each moment two binary searches."""
    arrivals = np.sort([t.arrival for t in timings])
    finishes = np.sort([t.token_times[-1] if t.completed and t.token_times else np.inf for t in timings])
    moments = np.asarray(moments, dtype=np.float64)
    return np.searchsorted(arrivals, moments, side="right") - np.searchsorted(finishes, moments, side="right")


def backlog_quarters(timings: list[RequestTiming]) -> tuple[float, float]:
    """The median backlog at the arrivals of the first quarter and of the last quarter of the arrivals."""
    arrivals = np.sort([t.arrival for t in timings])
    if not len(arrivals):
        return 0.0, 0.0
    quarter = max(1, len(arrivals) // 4)
    early = float(np.median(backlog_at(timings, arrivals[:quarter])))
    late = float(np.median(backlog_at(timings, arrivals[-quarter:])))
    return early, late


def growth_allowed(requests: int, early: float) -> float:
    """How far the late backlog may lie above the early one before it counts as growth (module docstring)."""
    return max(GROWTH_SHARE * requests, GROWTH_MIN, 0.5 * early)


@dataclass(frozen=True)
class LlmServerProbe(Record):
    """One offered rate: the requests scored, the backlog a quarter in and at the last arrival, and whether
    the rate counts as sustained (with why not)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"load": LoadSummary}

    rate_rps: float
    load: LoadSummary
    backlog_early: float  # median over the first quarter of the arrivals
    backlog_late: float  # median over the last quarter
    overloaded: bool
    sustained: bool
    why: str


def _quantile(summary: LoadSummary, measure: str, quantile: int) -> float | None:
    value: float | None = getattr(getattr(summary, measure), f"p{quantile}")
    return value


def judge_llm_probe(timings: list[RequestTiming], rate_rps: float, bounds: LatencyBounds) -> LlmServerProbe:
    """The probe's verdict (module docstring)."""
    load = summarize(timings, bounds.ttft_ms, bounds.tpot_ms)
    early, late = backlog_quarters(timings)
    grew = late - early > growth_allowed(len(timings), early)
    unfinished = load.requests - load.completed
    overloaded = grew or unfinished > 0
    ttft = _quantile(load, "ttft_ms", bounds.quantile)
    tpot = _quantile(load, "tpot_ms", bounds.quantile)
    q = f"p{bounds.quantile}"
    enough = load.completed >= bounds.min_requests
    ttft_ok = bounds.ttft_ms is None or (ttft is not None and ttft <= bounds.ttft_ms)
    tpot_ok = bounds.tpot_ms is None or tpot is None or tpot <= bounds.tpot_ms  # one-token outputs: no TPOT
    sustained = not overloaded and enough and ttft_ok and tpot_ok
    if unfinished:
        why = f"overload: {unfinished} of {load.requests} requests unfinished when the probe gave up"
    elif grew:
        why = f"overload: the backlog grew from {early:g} to {late:g} requests (medians of the first and last quarter)"
    elif not enough:
        why = f"too few requests for a {q} ({load.completed}, needs {bounds.min_requests})"
    elif not ttft_ok:
        why = f"TTFT {q} {ttft:.1f} ms > {bounds.ttft_ms:g} ms"
    elif not tpot_ok:
        why = f"TPOT {q} {tpot:.1f} ms > {bounds.tpot_ms:g} ms"
    else:
        shown = ", ".join(
            f"{name} {q} {value:.1f} ms" for name, value in (("TTFT", ttft), ("TPOT", tpot)) if value is not None
        )
        why = f"{shown}: within {bounds.describe()}, backlog steady"
    return LlmServerProbe(rate_rps, load, early, late, overloaded, sustained, why)


@dataclass(frozen=True)
class LlmServerMetrics(Record):
    """A server trial: the highest rate sustained within the bounds, the saturated throughput the search
    started below, every probe, and why the search ended where it did."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"bounds": LatencyBounds, "probes": LlmServerProbe}

    sustained_rps: float
    bounds: LatencyBounds
    saturated_rps: float
    concurrency: int
    probes: list[LlmServerProbe]
    verdict: str
    seed: int
    rule: str = field(
        default=(
            "sustained: every request completed, the median backlog over the last quarter of the arrivals within "
            "max(2% of the requests, 2, half the first quarter's) of the first quarter's, and the bounds' quantile "
            "of TTFT and TPOT within them"
        )
    )

    @property
    def at_sustained(self) -> LlmServerProbe | None:
        kept = [p for p in self.probes if p.sustained and p.rate_rps == self.sustained_rps]
        return kept[-1] if kept else None

    @property
    def goodput_rps(self) -> float | None:
        """Requests per second completed within both bounds at the sustained rate."""
        at = self.at_sustained
        return at.load.goodput_rps if at else None

    @property
    def in_flight(self) -> float | None:
        """Requests in the server at once on average at the sustained rate (Little's law: the rate times the
        mean time from arrival to last token): the concurrency the bounds allowed, beside the slots configured."""
        at = self.at_sustained
        mean_ms = at.load.e2el_ms.mean if at else None
        return self.sustained_rps * mean_ms / 1e3 if mean_ms is not None else None


def saturated_rps(timings: list[RequestTiming]) -> float:
    """Completed requests per second when all were offered at once: the server's throughput at this mix,
    which no sustained rate exceeds."""
    load = summarize(timings)
    return load.completed / load.duration_s if load.completed else 0.0


def probe_requests(rate_rps: float, bounds: LatencyBounds, min_s: float, max_s: float) -> int:
    """How many requests a probe at this rate offers: its minimum window's worth, more up to PROBE_REQUESTS
    within `max_s`, and never fewer than the quantile needs (with a fifth to spare for the ones the backlog
    check may cut off)."""
    within = int(rate_rps * max_s)
    wanted = max(int(rate_rps * min_s), min(PROBE_REQUESTS, within))
    return max(wanted, int(1.2 * bounds.min_requests))


def search_rate(
    run_probe: Callable[[float, int], list[RequestTiming]],
    saturated_rps: float,
    bounds: LatencyBounds,
    concurrency: int,
    seed: int,
    deadline: float,
    max_probes: int = 8,
    clock: Callable[[], float] = time.monotonic,
    probe_seconds: Callable[[float, int], float] = lambda rate, number: 0.0,
) -> LlmServerMetrics:
    """Bisect the offered rate below `saturated_rps`: `run_probe(rate, number)` serves one probe and returns
    its requests' timings. A search that sustained every probe up to its ceiling (UPPER_HEADROOM x the upper
    bound: a saturated probe can undercount a server that batches more the more is waiting) goes on with
    the bound doubled, up to CEILING_RAISES times. A probe starts only when it ends by the deadline at the
    latest (`probe_seconds(rate, number)`: its arrivals and the wait after them), so the trial is not
    killed mid-probe with its probes so far lost."""
    upper = saturated_rps
    search = RateSearch(upper, max_probes=max_probes)
    probes: list[LlmServerProbe] = []
    out_of_time = False
    raises = 0
    while True:
        refused = False
        while (rate := search.next_rate()) is not None:
            if clock() + probe_seconds(rate, len(probes)) > deadline:
                out_of_time = True
                break
            probe = judge_llm_probe(run_probe(rate, len(probes)), rate, bounds)
            probes.append(probe)
            refused = refused or not probe.sustained
            search.record(rate, probe.sustained)
        capped = search.sustained_rps > 0 and not refused
        if out_of_time or not capped or raises >= CEILING_RAISES or len(probes) >= max_probes:
            break
        raises += 1
        low, upper = search.sustained_rps, 2 * upper
        search = RateSearch(upper, [(low + UPPER_HEADROOM * upper) / 2], max_probes=max_probes - len(probes))
        search.low = low
    sustained = max((p.rate_rps for p in probes if p.sustained), default=0.0)
    at_ceiling = search.high <= search.low * (1 + RELATIVE_TOLERANCE)
    if capped and not out_of_time and not at_ceiling:
        verdict = (
            f"every probe sustained, up to {sustained:.2f} requests/s, when the search's {max_probes} probes were spent"
        )
    elif capped and not out_of_time:
        verdict = (
            f"every probe sustained, up to {sustained:.2f} requests/s: the search's ceiling "
            f"({UPPER_HEADROOM * upper:.2f}, raised {raises} times from {UPPER_HEADROOM:g}x the saturated "
            f"throughput) was reached, and the server may sustain more"
        )
    elif sustained > 0:
        verdict = f"highest sustained rate {sustained:.2f} requests/s after {len(probes)} probes"
    elif probes:
        verdict = f"no rate down to {min(p.rate_rps for p in probes):.2f} requests/s sustained ({probes[-1].why})"
    else:
        verdict = "no rate probed"
    if out_of_time:
        verdict += "; stopped early: the trial's time ran out"
    return LlmServerMetrics(sustained, bounds, saturated_rps, concurrency, probes, verdict, seed)

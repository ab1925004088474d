"""Requests for a language-model server under load, drawn and scored by the conventions of vLLM's `bench
serve`, so a number here reads as the same number there.

Arrivals: the gaps between requests are gamma-distributed with shape `burstiness` and mean 1 / rate (shape 1:
a Poisson process; below 1 burstier, above 1 more regular), seeded. vLLM rescales a run's gaps so its last
request arrives at exactly count / rate; here they are not rescaled, so the offered rate is the process's
own and a probe's requests arrive as a Poisson stream would.
Lengths: prompt and output tokens uniform over [floor(L (1 - r)), ceil(L (1 + r))] for a length L and a
range ratio r (vLLM's --random-range-ratio; 0: every request the same length), seeded apart.
Per request, from its scheduled arrival (so time spent queued counts, as a user waits it):
TTFT = first token - arrival; TPOT = (last token - first token) / (output tokens - 1), for outputs of two
tokens or more; ITL = the gaps between consecutive tokens; E2EL = last token - arrival.
Percentiles are numpy's (linear interpolation, as vLLM's), over the completed requests; one is given only
with enough samples (p90: 10, p99: 100), as the stopwatch gives them. Goodput: the completed requests within
every bound asked, per second of the probe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from autotune.common.json_record import Record
from autotune.measure.stopwatch import LatencySummary, latency_summary


@dataclass(frozen=True)
class RequestMix(Record):
    """How a probe's requests are drawn: mean prompt and output lengths in tokens, the range ratio around
    them, and the arrival process's burstiness (1: Poisson)."""

    prompt_tokens: int
    output_tokens: int
    range_ratio: float = 0.0
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"prompt and output lengths must be at least 1 token, got {self}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"range_ratio must lie in [0, 1), got {self.range_ratio}")
        if self.burstiness <= 0.0:
            raise ValueError(f"burstiness must be positive, got {self.burstiness}")

    def span(self, length: int) -> tuple[int, int]:
        """The lowest and highest length drawn around `length`."""
        low = max(1, math.floor(length * (1.0 - self.range_ratio)))
        return low, max(low, math.ceil(length * (1.0 + self.range_ratio)))

    @property
    def longest_request(self) -> int:
        """The most tokens one request can hold: the longest prompt and the longest output."""
        return self.span(self.prompt_tokens)[1] + self.span(self.output_tokens)[1]

    def kv_context(self, slots: int, block: int = 256) -> int:
        """The tokens of one KV cache shared by `slots` sequences, each holding a longest request, in whole
        blocks: what a server trial gives llama-server, and what its export writes."""
        return -(-slots * self.longest_request // block) * block

    def lengths(self, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """`count` prompt and output lengths (int64), each uniform over its range."""
        rng = np.random.default_rng(seed)

        def draw(length: int) -> np.ndarray:
            low, high = self.span(length)
            return rng.integers(low, high + 1, size=count, dtype=np.int64)

        return draw(self.prompt_tokens), draw(self.output_tokens)


def random_prompts(lengths: np.ndarray, vocab_size: int, seed: int) -> list[np.ndarray]:
    """One prompt of random token ids per length (int64, uniform over the vocabulary, seeded), as vLLM's
    random data set draws them: the server's work depends on the lengths, not on which ids."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=int(length), dtype=np.int64) for length in lengths]


def arrival_offsets(rate_per_s: float, count: int, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """Seconds from the probe's start at which `count` requests arrive: gamma gaps of shape `burstiness` and
    mean 1 / rate, the first request one gap in."""
    if rate_per_s <= 0.0 or burstiness <= 0.0:
        raise ValueError(f"rate and burstiness must be positive, got {rate_per_s} and {burstiness}")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate_per_s * burstiness), size=count)
    return np.cumsum(gaps)


@dataclass(frozen=True)
class RequestTiming:
    """One request as the load generator saw it: its scheduled arrival, the output tokens it asked for, and
    the time each output token reached it (fewer than asked: the probe gave up on it), on the probe's clock."""

    arrival: float
    requested_tokens: int
    token_times: tuple[float, ...]

    @property
    def completed(self) -> bool:
        """Whether every token asked for came (as vLLM counts a request completed)."""
        return len(self.token_times) >= self.requested_tokens

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival if self.token_times else math.nan

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (NaN for fewer than two tokens, as vLLM leaves it out)."""
        tokens = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (tokens - 1) if tokens > 1 else math.nan

    @property
    def itl(self) -> np.ndarray:
        return np.diff(np.asarray(self.token_times, dtype=np.float64))

    @property
    def e2el(self) -> float:
        return self.token_times[-1] - self.arrival if self.token_times else math.nan


def _latencies(seconds: np.ndarray) -> LatencySummary:
    """The stopwatch's summary (milliseconds; a percentile without enough samples is None) of the defined
    values."""
    return latency_summary(seconds[~np.isnan(seconds)])


@dataclass(frozen=True)
class LoadSummary(Record):
    """A probe's requests scored: how many arrived and were completed, the percentiles of TTFT, TPOT, ITL and
    E2EL over the completed ones, and the goodput (completed requests within every bound given, per second
    from the first arrival to the last token)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {
        "ttft_ms": LatencySummary,
        "tpot_ms": LatencySummary,
        "itl_ms": LatencySummary,
        "e2el_ms": LatencySummary,
    }

    requests: int
    completed: int
    duration_s: float
    ttft_ms: LatencySummary
    tpot_ms: LatencySummary
    itl_ms: LatencySummary
    e2el_ms: LatencySummary
    goodput_rps: float
    output_tokens_per_s: float


def summarize(
    timings: list[RequestTiming], ttft_bound_ms: float | None = None, tpot_bound_ms: float | None = None
) -> LoadSummary:
    """The probe's percentiles and goodput, over the completed requests (vLLM's): one cut off when the probe
    gave up is neither scored nor good, though the tokens it got end the probe's duration. A completed
    request is good when its TTFT and TPOT are within the bounds given (a one-token output has no TPOT and
    meets that bound, as in vLLM)."""
    completed = [t for t in timings if t.completed]
    start = min((t.arrival for t in timings), default=0.0)
    end = max((t.token_times[-1] for t in timings if t.token_times), default=start)
    duration = max(end - start, 1e-9)
    good = 0
    for timing in completed:
        ttft_ok = ttft_bound_ms is None or timing.ttft * 1000.0 <= ttft_bound_ms
        tpot = timing.tpot
        tpot_ok = tpot_bound_ms is None or math.isnan(tpot) or tpot * 1000.0 <= tpot_bound_ms
        good += ttft_ok and tpot_ok
    itl = np.concatenate([t.itl for t in completed]) if completed else np.empty(0)
    return LoadSummary(
        requests=len(timings),
        completed=len(completed),
        duration_s=duration,
        ttft_ms=_latencies(np.array([t.ttft for t in completed])),
        tpot_ms=_latencies(np.array([t.tpot for t in completed])),
        itl_ms=_latencies(itl),
        e2el_ms=_latencies(np.array([t.e2el for t in completed])),
        goodput_rps=good / duration,
        output_tokens_per_s=sum(len(t.token_times) for t in completed) / duration,
    )

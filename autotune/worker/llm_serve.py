"""A language-model server's highest sustained request rate, measured: the saturated throughput first (every
request of one probe offered at once, which bounds the rate from above), then the rate search
(measure/llm_serving) over seeded Poisson probes driven by the load generator's loops (measure/
llm_server_loop): a stepped engine in this thread, a streaming one over its connections.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from autotune.common.json_record import Record
from autotune.measure.llm_load import RequestMix, RequestTiming, arrival_offsets, random_prompts, summarize
from autotune.measure.llm_server_loop import drive, drive_streaming
from autotune.measure.llm_serving import LatencyBounds, LlmServerMetrics, probe_requests, saturated_rps, search_rate

SATURATION_REQUESTS = 48  # the saturated probe: enough to fill any slot count searched several times over
SATURATION_GIVE_UP_S = 3600.0
PROBE_MIN_S = 10.0
PROBE_MAX_S = 60.0


@dataclass(frozen=True)
class ServingPlan(Record):
    """What is offered: the request mix, the bounds, the seed, and the window a probe aims for."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"mix": RequestMix, "bounds": LatencyBounds}

    mix: RequestMix
    bounds: LatencyBounds
    seed: int = 0
    probe_min_s: float = PROBE_MIN_S
    probe_max_s: float = PROBE_MAX_S


def serve_probe(server: Any, streaming: bool) -> Callable[..., list[RequestTiming]]:
    """The loop that drives this kind of server."""

    def run(
        offsets: np.ndarray, prompts: list[np.ndarray], outputs: np.ndarray, give_up_s: float
    ) -> list[RequestTiming]:
        loop = drive_streaming if streaming else drive
        return loop(server, offsets, prompts, outputs, give_up_s)

    return run


def measure_server(
    server: Any, streaming: bool, plan: ServingPlan, vocab_size: int, concurrency: int, deadline: float
) -> LlmServerMetrics:
    """The server's highest rate sustained within the plan's bounds (its saturated throughput included)."""
    run = serve_probe(server, streaming)
    mix, bounds = plan.mix, plan.bounds

    def requests(count: int, number: int) -> tuple[list[np.ndarray], np.ndarray]:
        prompt_lengths, outputs = mix.lengths(count, plan.seed + 7919 * number)
        return random_prompts(prompt_lengths, vocab_size, plan.seed + 7919 * number + 1), outputs

    prompts, outputs = requests(SATURATION_REQUESTS, 0)
    longest = int(outputs.max())
    # warm-up: compiled kernels and caches, given the saturated probe's time (no bound applies yet)
    run(np.zeros(2), prompts[:2], outputs[:2], SATURATION_GIVE_UP_S)
    burst = run(np.zeros(len(outputs)), prompts, outputs, SATURATION_GIVE_UP_S)
    saturated = saturated_rps(burst)
    # the per-token time under the heaviest load: how long a probe waits for its last answers without a TPOT bound
    tpot_ms = summarize(burst).tpot_ms
    burst_tpot_s = (tpot_ms.p90 or tpot_ms.p50 or 0.0) / 1e3
    drain_s = bounds.drain_s(longest, burst_tpot_s)

    def probe(rate: float, number: int) -> list[RequestTiming]:
        count = probe_requests(rate, bounds, plan.probe_min_s, plan.probe_max_s)
        offsets = arrival_offsets(rate, count, plan.seed + 104729 * (number + 1), mix.burstiness)
        prompts, outputs = requests(count, number + 1)
        return run(offsets, prompts, outputs, float(offsets[-1]) + drain_s)

    return search_rate(probe, saturated, bounds, concurrency, plan.seed, deadline, clock=time.monotonic)

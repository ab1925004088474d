"""A language-model server's highest sustained request rate, measured: the saturated throughput first (every
request of one probe offered at once, which bounds the rate from above), then the rate search
(measure/llm_serving) over seeded Poisson probes driven by the load generator's loops (measure/
llm_server_loop): a stepped engine in this thread, a streaming one over its connections.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autotune.measure.llm_load import RequestTiming, arrival_offsets, random_prompts, summarize
from autotune.measure.llm_server_loop import drive, drive_streaming
from autotune.measure.llm_serving import LlmServerMetrics, ServingPlan, probe_requests, saturated_rps, search_rate
from autotune.records.config import TrialConfig

SATURATION_REQUESTS = 48  # the saturated probe; a server holding more at once is found by raising the ceiling
SATURATION_GIVE_UP_S = 3600.0
CANCEL_SLACK_S = 40.0  # a given-up probe: its request threads joined (10 s) and the server settled (30 s)
# the backend option (OpenVINO's and llama.cpp's) that holds the server's sequences at once; 0 or absent: the
# trial's offline batch (its `sequences`)
SERVER_SEQUENCES = "server_sequences"


def served_sequences(config: TrialConfig) -> int:
    """The sequences a server trial's engine holds at once (GenAI's max_num_seqs, llama-server's slots): its
    backend's server_sequences, else its offline batch."""
    return int(config.options.get(SERVER_SEQUENCES) or config.batch_size)


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

    def arrivals(rate: float, number: int) -> np.ndarray:
        count = probe_requests(rate, bounds, plan.probe_min_s, plan.probe_max_s)
        return arrival_offsets(rate, count, plan.seed + 104729 * (number + 1), mix.burstiness)

    def probe(rate: float, number: int) -> list[RequestTiming]:
        offsets = arrivals(rate, number)
        prompts, outputs = requests(len(offsets), number + 1)
        return run(offsets, prompts, outputs, float(offsets[-1]) + drain_s)

    def probe_seconds(rate: float, number: int) -> float:
        """A probe's time at most: its (seeded) arrivals, the wait after the last, and the time a given-up
        probe takes to cancel its requests and see the server idle."""
        return float(arrivals(rate, number)[-1]) + drain_s + CANCEL_SLACK_S

    return search_rate(
        probe, saturated, bounds, concurrency, plan.seed, deadline, clock=time.monotonic, probe_seconds=probe_seconds
    )


def serve_trial(
    plan: ServingPlan, config: TrialConfig, generator: Any, vocab_size: int, instances: int, deadline: float
) -> LlmServerMetrics:
    """A trial of the server scenario: the engine's own server on the file the trial loaded, holding the
    config's served sequences at once (served_sequences), its highest sustained rate."""
    open_server = getattr(generator, "open_server", None)
    if open_server is None:
        raise RuntimeError(
            f"{config.backend} has no server of its own: a language model's server scenario serves OpenVINO "
            "(GenAI's continuous batching), llama.cpp (llama-server) and PyTorch eager (static batches); list "
            "those in the space"
        )
    if instances != 1:
        raise RuntimeError(
            f"a language model's server scenario serves from one instance (its engine batches the requests), "
            f"not {instances}: list instances [1] in the space"
        )
    slots = served_sequences(config)
    context = plan.mix.kv_context(slots)
    # a short path (a UNIX socket's is limited to 107 bytes) for llama-server's socket and log
    with (
        tempfile.TemporaryDirectory(prefix="autotune-serve-") as folder,
        open_server(slots, context, Path(folder)) as (server, streaming),
    ):
        return measure_server(server, streaming, plan, vocab_size, slots, deadline)

"""OpenVINO's own throughput mode as a server, fed by the same Poisson arrivals as autotune's server
scenario: a point of comparison autotune's batching policy did not shape.

The IR is compiled with PERFORMANCE_HINT THROUGHPUT (OpenVINO picks streams and threads); each request
of one sample is submitted to an AsyncInferQueue of the optimal number of requests at its arrival
moment, and its latency is its completion (stamped in OpenVINO's callback) minus that moment: when every
infer request is busy the submission waits, and the wait counts, as a queue's would. The same rate search,
verdict and probe records as a trial's (autotune.measure.serving).

    python -m autotune.remeasure.openvino_server MODEL.xml 1,3,224,224 --slo-ms 100 [--min-s 5 --max-s 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from autotune.measure.serving import (
    RateSearch,
    ServedRequests,
    ServerMetrics,
    ServerProbe,
    judge_probe,
    lowest_rate,
    poisson_arrivals,
    probe_seconds,
    wait_until,
)

CLOSED_LOOP_S = 3.0
SEED = 20_241  # the seed the search's trials use (autotune.tuning.study.SERVER_SEED)


def compile_throughput_mode(xml: str, shape: list[int]) -> tuple[Any, Any, dict[str, Any]]:
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    core = ov.Core()
    model = core.read_model(xml)
    model.reshape({model.inputs[0]: shape})
    compiled = core.compile_model(model, "CPU", {hints.performance_mode: hints.PerformanceMode.THROUGHPUT})
    requests = int(compiled.get_property(props.optimal_number_of_infer_requests))
    queue = ov.AsyncInferQueue(compiled, requests)
    details = {
        "openvino": ov.__version__,
        "streams": int(compiled.get_property(props.num_streams)),
        "threads": int(compiled.get_property(props.inference_num_threads)),
        "requests": requests,
        "precision": str(compiled.get_property(hints.inference_precision)),
    }
    return compiled, queue, details


def closed_loop_rps(queue: Any, sample: np.ndarray, seconds: float) -> float:
    """Requests per second with every infer request kept busy (what benchmark_app measures)."""
    done = [0]
    queue.set_callback(lambda request, _: done.__setitem__(0, done[0] + 1))
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        queue.start_async({0: sample})
    queue.wait_all()
    return done[0] / (time.monotonic() - start)


def serve_poisson(queue: Any, sample: np.ndarray, offsets: np.ndarray) -> ServedRequests:
    """Submit one request per arrival at its moment; completions stamped in the callback. A request's send
    is its arrival's moment, before start_async (which blocks while every infer request is busy), so the
    probes' call times here include that wait, unlike the trials' (send to completion of a call)."""
    completions = np.full(len(offsets), np.nan)
    answered = [0]

    def done(request: Any, index: int) -> None:
        completions[index] = time.monotonic()
        answered[0] += 1

    queue.set_callback(done)
    start = time.monotonic()
    arrivals = start + offsets
    sends, backlog = [], []
    for index, moment in enumerate(arrivals):
        wait_until(moment)
        sends.append(time.monotonic())
        backlog.append(index - answered[0])
        queue.start_async({0: sample}, index)  # blocks while every infer request is busy
    queue.wait_all()
    return ServedRequests(
        arrivals,
        completions,
        np.ones(len(offsets), dtype=np.int64),
        np.asarray(backlog, dtype=np.int64),
        np.asarray(sends),
        start,
        float(offsets[-1]) if len(offsets) else 0.0,
    )


def rate_search(xml: str, shape: list[int], slo_ms: float, min_s: float, max_s: float) -> dict[str, Any]:
    _, queue, details = compile_throughput_mode(xml, shape)
    sample = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    closed_loop_rps(queue, sample, 1.0)  # warm-up
    upper = closed_loop_rps(queue, sample, CLOSED_LOOP_S)
    search = RateSearch(upper, lowest_rps=lowest_rate(max_s))  # the floor the trials use
    probes: list[ServerProbe] = []
    while (rate := search.next_rate()) is not None:
        offsets = poisson_arrivals(rate, probe_seconds(rate, min_s, max_s), SEED + 7919 * len(probes))
        # as many requests in flight as infer requests: the queue may hold that many before it grows
        probe = judge_probe([serve_poisson(queue, sample, offsets)], rate, slo_ms, details["requests"])
        probes.append(probe)
        search.record(rate, probe.sustained)
    metrics = ServerMetrics(
        sustained_rps=search.sustained_rps,
        slo_ms=slo_ms,
        max_batch=1,
        max_wait_ms=0.0,
        upper_bound_rps=upper,
        probes=probes,
        instances=1,
        seed=SEED,
        batching="none: each request is its own inference, submitted at arrival to OpenVINO's AsyncInferQueue",
        routing="OpenVINO's streams take the requests in turn (one process, PERFORMANCE_HINT THROUGHPUT)",
    )
    return {**metrics.to_json(), "openvino": details}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.remeasure.openvino_server")
    parser.add_argument("xml")
    parser.add_argument("shape", help="the input shape with its batch of 1, e.g. 1,3,224,224")
    parser.add_argument("--slo-ms", type=float, required=True)
    parser.add_argument("--min-s", type=float, default=5.0)
    parser.add_argument("--max-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    result = rate_search(args.xml, [int(d) for d in args.shape.split(",")], args.slo_ms, args.min_s, args.max_s)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

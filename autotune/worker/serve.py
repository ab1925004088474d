"""The server scenario inside a trial's processes: the rate search over real-time Poisson arrivals.

Every instance runs its own arrival stream at rate / instances and its own queue. Between probes the
instances exchange what they served through files in the trial's barrier folder, so each computes the
same verdict from the same data and offers the same next rate: no orchestrator round trip per probe,
and the probes of all instances start together. Without a barrier (a winner replayed from best.json by
the launch script) each instance searches alone, over its own closed-loop rate: its figure is its own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
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
    serve,
)
from autotune.records.job import ServerSettings

PEER_POLL_S = 0.001


class Peers:
    """The instances of one trial, exchanging small payloads through the barrier folder."""

    def __init__(self, folder: Path | None, instance: int, instances: int, timeout_s: float) -> None:
        self.folder, self.instance, self.instances, self.timeout_s = folder, instance, instances, timeout_s

    def exchange_json(self, name: str, payload: Any) -> list[Any]:
        """Everyone's payload for `name`, in instance order (only ours without a folder)."""
        if self.folder is None:
            return [payload]
        path = self.folder / f"peer-{name}-{self.instance}.json"
        path.with_suffix(".tmp").write_text(json.dumps(payload))
        os.replace(path.with_suffix(".tmp"), path)
        return [json.loads(p.read_text()) for p in self._wait(name, ".json")]

    def exchange_served(self, name: str, served: ServedRequests) -> list[ServedRequests]:
        """Everyone's requests of one probe, in instance order."""
        if self.folder is None:
            return [served]
        path = self.folder / f"peer-{name}-{self.instance}.npz"
        with open(path.with_suffix(".tmp"), "wb") as out:
            np.savez(
                out,
                arrivals=served.arrivals,
                completions=served.completions,
                batch_fill=served.batch_fill,
                queue_at_send=served.queue_at_send,
                send_times=served.send_times,
                window=np.array([served.start, served.duration_s, served.longest_stall_s]),
            )
        os.replace(path.with_suffix(".tmp"), path)
        result = []
        for p in self._wait(name, ".npz"):
            with np.load(p) as data:
                result.append(
                    ServedRequests(
                        data["arrivals"],
                        data["completions"],
                        data["batch_fill"],
                        data["queue_at_send"],
                        data["send_times"],
                        float(data["window"][0]),
                        float(data["window"][1]),
                        float(data["window"][2]),
                    )
                )
        return result

    def forget(self, name: str) -> None:
        """Remove this instance's payload of an exchange every instance has read (a probe's requests
        would otherwise pile up in the trial folder)."""
        if self.folder is not None:
            for suffix in (".json", ".npz"):
                (self.folder / f"peer-{name}-{self.instance}{suffix}").unlink(missing_ok=True)

    def _wait(self, name: str, suffix: str) -> list[Path]:
        assert self.folder is not None
        paths = [self.folder / f"peer-{name}-{i}{suffix}" for i in range(self.instances)]
        deadline = time.monotonic() + self.timeout_s
        while not all(p.exists() for p in paths):
            if (self.folder / "abort").exists():
                sys.exit(0)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the other instances did not reach the server probe {name!r}")
            time.sleep(PEER_POLL_S)
        return paths


def run_rate_search(
    step: Any,
    server: ServerSettings,
    max_wait_ms: float,
    own_offline_rps: float,
    own_call_ms: float,
    max_batch: int,
    requests_per_call: int,
    peers: Peers,
    probe_min_s: float,
    probe_max_s: float,
    deadline: float,
    confidence: float = 0.95,
) -> ServerMetrics:
    """The highest total rate whose p99 request latency stays within `server.slo_ms`, by bisection below the
    instances' closed-loop throughput together; a batch waits at most `max_wait_ms` for more requests."""
    slo_ms = float(server.slo_ms)
    max_wait_s = float(max_wait_ms) / 1e3
    seed = server.seed
    closed_loop = peers.exchange_json("upper", {"rps": own_offline_rps, "call_ms": own_call_ms})
    # The instances that run together: all of them in a trial, only this one when replayed without a
    # barrier (then it is offered its own share of nothing else: rate and bound are its own).
    together = len(closed_loop)
    upper = float(sum(c["rps"] for c in closed_loop))
    fastest_call_ms = min(c["call_ms"] for c in closed_loop)
    search = RateSearch(upper, server.first_rates, lowest_rps=lowest_rate(probe_max_s))
    drain_s = max(1.0, 4 * slo_ms / 1e3)
    probes: list[ServerProbe] = []
    if fastest_call_ms > slo_ms:  # no request can be answered within the bound, at any rate
        return ServerMetrics(
            sustained_rps=0.0,
            slo_ms=slo_ms,
            max_batch=max_batch,
            max_wait_ms=float(max_wait_ms),
            upper_bound_rps=upper,
            probes=[],
            instances=together,
            seed=seed,
            requests_per_call=requests_per_call,
            verdict=f"one call takes {fastest_call_ms:.1f} ms (closed-loop median), over the bound: no rate probed",
        )
    out_of_time = False
    while (rate := search.next_rate()) is not None:
        number = len(probes)
        duration = probe_seconds(rate, probe_min_s, probe_max_s)
        # Every instance sees the same clock and plan, so all stop at the same probe.
        if peers.exchange_json(f"go{number}", time.monotonic() + duration + drain_s < deadline).count(False):
            out_of_time = True
            break
        peers.forget(f"probe{number - 1}")  # every instance has read it: it passed this barrier
        offsets = poisson_arrivals(rate / together, duration, seed + 7919 * number + peers.instance)
        if len(offsets) == 0:
            offsets = np.array([0.0])
        served = serve(step, offsets, requests_per_call, max_wait_s, drain_s)
        probe = judge_probe(
            peers.exchange_served(f"probe{number}", served), rate, slo_ms, requests_per_call, confidence
        )
        probes.append(probe)
        search.record(rate, probe.sustained, disturbed=bool(probe.noise_flags))
    return ServerMetrics(
        sustained_rps=search.sustained_rps,
        slo_ms=slo_ms,
        max_batch=max_batch,
        max_wait_ms=float(max_wait_ms),
        upper_bound_rps=upper,
        probes=probes,
        instances=together,
        seed=seed,
        verdict=search_verdict(search, probes)
        + ("; stopped early: the trial's time would have run out" if out_of_time else ""),
        requests_per_call=requests_per_call,
    )


def search_verdict(search: RateSearch, probes: list[ServerProbe]) -> str:
    """Why the rate search ended where it did."""
    if search.sustained_rps > 0:
        return f"highest sustained rate {search.sustained_rps:.1f} requests/s after {len(probes)} probes"
    if not probes:
        return "no rate probed"
    return (
        f"no rate down to {min(p.rate_rps for p in probes):.2f} requests/s was sustained "
        f"(lowest probe: {probes[-1].why}); lower rates would need probes longer than three windows"
    )

"""The server scenario: Poisson arrivals, a queue batched by a policy, the highest rate sustained at a
p99 bound. Checked against queueing theory on a server whose service time is known (a sleep), in a real
search, and on simulated clocks for the rules (overload, the batching policy, the bisection)."""

import dataclasses
import json
import math
import shutil

import mpmath
import numpy as np
import pytest
from conftest import TINY, rerun_while_noisy, tiny, write_space

from autotune.measure.serving import (
    PROBE_REQUESTS,
    STALL_RETRIES,
    RateSearch,
    judge_probe,
    lowest_rate,
    poisson_arrivals,
    probe_seconds,
    quantile_ci,
    serve,
)


# ---- queueing theory: M/D/1 (Poisson arrivals, one server, a constant service time) --------------------------
def md1_wait_cdf(t: float, rate: float, service: float) -> float:
    """P(waiting time <= t) in an M/D/1 queue (Crommelin's formula, in high precision: its terms alternate)."""
    with mpmath.workdps(80):
        lam, s, t = mpmath.mpf(rate), mpmath.mpf(service), mpmath.mpf(t)
        total, k = mpmath.mpf(0), 0
        while k * s <= t:
            x = lam * (k * s - t)
            total += x**k / mpmath.factorial(k) * mpmath.exp(-x)
            k += 1
        return float((1 - lam * s) * total)


def md1_p99_sojourn(rate: float, service: float) -> float:
    """The 99th percentile of waiting plus service time."""
    low, high = 0.0, service
    while md1_wait_cdf(high, rate, service) < 0.99:
        high *= 2
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if md1_wait_cdf(mid, rate, service) < 0.99 else (low, mid)
    return high + service


def md1_sustainable_rate(bound_s: float, service: float) -> float:
    """The highest Poisson rate whose p99 sojourn time stays within the bound."""
    low, high = 0.0, 1.0 / service
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if md1_p99_sojourn(mid, service) <= bound_s else (low, mid)
    return low


def mg1_p99_sojourn(rate: float, service_times: np.ndarray, requests: int = 200_000, seed: int = 0) -> float:
    """The 99th percentile of waiting plus service in a queue served by these service times (resampled),
    by Lindley's recursion: M/G/1 for a server whose calls jitter, as a sleep's wake-ups do."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, requests)
    services = rng.choice(service_times, requests)
    sojourn = np.empty(requests)
    wait = 0.0
    for i in range(requests):  # W_{n+1} = max(0, W_n + S_n - A_{n+1})
        sojourn[i] = wait + services[i]
        wait = max(0.0, wait + services[i] - gaps[i])
    return float(np.percentile(sojourn, 99))


def mg1_sustainable_rate(bound_s: float, service_times: np.ndarray) -> float:
    low, high = 0.0, 1.0 / float(np.mean(service_times))
    for _ in range(14):
        mid = (low + high) / 2
        low, high = (mid, high) if mg1_p99_sojourn(mid, service_times) <= bound_s else (low, mid)
    return low


def test_md1_formula_agrees_with_a_simulated_queue():
    """The theory the next tests lean on, checked by Lindley's recursion over a million requests."""
    rng = np.random.default_rng(0)
    service, rate = 0.002, 250.0
    gaps = rng.exponential(1 / rate, 1_000_000)
    waits = np.empty_like(gaps)
    wait = 0.0
    for i, gap in enumerate(gaps):  # W_{n+1} = max(0, W_n + S - A_{n+1})
        waits[i] = wait
        wait = max(0.0, wait + service - gap)
    simulated = float(np.percentile(waits + service, 99))
    assert md1_p99_sojourn(rate, service) == pytest.approx(simulated, rel=0.03)


# ---- the rules, on a simulated clock (each call advances it by the service time) --------------------------
class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, moment: float) -> None:
        self.now = max(self.now, moment)


def simulated_probe(rate, service, max_batch=1, max_wait_s=0.0, bound_ms=1e4, seed=0, requests=PROBE_REQUESTS):
    clock = SimulatedClock()

    def step():
        clock.now += service

    offsets = poisson_arrivals(rate, requests / rate, seed)
    served = serve(step, offsets, max_batch, max_wait_s, drain_s=1.0, clock=clock, wait=clock.wait, start=0.0)
    return judge_probe([served], rate, bound_ms, max_batch), served


@pytest.mark.parametrize("seed", range(20))
def test_a_rate_above_capacity_is_never_sustained_however_loose_the_bound(seed):
    """20% past what the server can do, with a bound of 10 s that the p99 meets: the queue grew, so
    it is overload, not a sustained rate."""
    service = 0.002
    probe, _ = simulated_probe(1.2 / service, service, seed=seed)
    assert probe.overloaded and not probe.sustained, probe
    assert probe.latency_ms.p99 is not None and probe.latency_ms.p99 < 1e4  # the p99 alone would have passed


def test_a_stable_queue_is_not_called_overload():
    """90% load, loose bound: the queue fluctuates but does not grow; sustained in (nearly) every seed."""
    service = 0.002
    verdicts = [simulated_probe(0.9 / service, service, seed=seed)[0] for seed in range(20)]
    assert sum(v.sustained for v in verdicts) >= 18, [v.why for v in verdicts if not v.sustained]


def test_the_batching_policy_waits_for_a_fuller_batch_then_sends_it():
    """max_batch 8, max_wait 5 ms, a call of 1 ms at a low rate: a request waits for company up to 5 ms
    (a batch leaves when full or when its oldest has waited that long); with no wait it leaves at once."""
    service, rate = 0.001, 400.0
    waited, served_waiting = simulated_probe(rate, service, max_batch=8, max_wait_s=0.005)
    eager, _ = simulated_probe(rate, service, max_batch=8, max_wait_s=0.0)
    assert waited.mean_batch_fill > 2.0 > eager.mean_batch_fill
    assert np.all(served_waiting.batch_fill <= 8)
    latencies = served_waiting.latencies_s
    assert latencies.max() <= 0.005 + 2 * service + 1e-9  # waited at most max_wait, then its call (and one before)
    assert waited.latency_ms.p50 > eager.latency_ms.p50 + 1.0  # waiting costs latency at low load


def test_a_probe_reports_the_time_its_calls_took_under_load():
    """Each call costs the service time on the simulated clock, however many requests fill it: the probe's
    call times are that, one per call (not per request), and the latency is call time plus waiting."""
    service = 0.003
    probe, served = simulated_probe(250.0, service, max_batch=4, max_wait_s=0.002)
    assert probe.call_ms is not None and probe.call_ms.samples == len(served.batch_fill) < probe.answered
    assert probe.call_ms.mean == pytest.approx(service * 1e3) and probe.call_ms.p99 == pytest.approx(service * 1e3)
    assert probe.latency_ms.p50 > probe.call_ms.p50


def test_the_p99_interval_covers_the_true_p99_at_its_stated_confidence():
    """Order statistics around the 99th percentile of 1,000 exponential latencies: the stated 95% interval
    holds the true p99 in at least 93% of 2,000 draws (its ranks 1-based, as the binomial gives them)."""
    rng = np.random.default_rng(7)
    truth = -math.log(0.01)  # p99 of Exp(1)
    hits = 0
    for _ in range(2000):
        low, high = quantile_ci(rng.exponential(1.0, 1000), 0.99)
        hits += low <= truth <= high
    assert hits / 2000 >= 0.93
    assert quantile_ci(np.arange(380.0), 0.99) is None and quantile_ci(np.arange(381.0), 0.99) is not None


def test_the_bisection_stops_within_its_tolerance_and_never_above_the_rates_it_saw_fail():
    search = RateSearch(1000.0)
    capacity = 640.0  # a server that sustains exactly up to here
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate <= capacity)
    assert capacity / 1.05 <= search.sustained_rps <= capacity
    assert search.probes <= 8


class StallingClock(SimulatedClock):
    """A simulated clock on which the machine takes the server's core away once, for `stall` seconds:
    during the call numbered `at_call`, or on waking from the wait numbered `at_wait`."""

    def __init__(self, stall: float, at_call: int | None = None, at_wait: int | None = None) -> None:
        super().__init__()
        self.stall, self.at_call, self.at_wait = stall, at_call, at_wait
        self.calls = self.waits = 0

    def wait(self, moment: float) -> None:
        super().wait(moment)
        self.waits += 1
        self.now += self.stall if self.waits == self.at_wait else 0.0

    def step(self, service: float) -> None:
        self.calls += 1
        self.now += service + (self.stall if self.calls == self.at_call else 0.0)


@pytest.mark.parametrize("where", ["call", "wait", None])
def test_a_probe_refused_because_the_machine_stalled_the_server_says_so(where):
    """40% load on a 2 ms server, bound 10 ms: sustained when nothing else runs. When the machine takes the
    core away for 100 ms once (inside a call, or before the loop wakes from a wait), the queue behind it
    breaks the p99, and the probe records the stall and flags its refusal as the machine's; undisturbed,
    it records no stall past the bound's half and no flag."""
    service, rate = 0.002, 200.0
    clock = StallingClock(0.100, at_call=300 if where == "call" else None, at_wait=200 if where == "wait" else None)
    offsets = poisson_arrivals(rate, PROBE_REQUESTS / rate, 3)
    served = serve(lambda: clock.step(service), offsets, 1, 0.0, 1.0, clock=clock, wait=clock.wait, start=0.0)
    probe = judge_probe([served], rate, 10.0, 1)
    if where is None:
        assert probe.sustained and not probe.noise_flags and probe.longest_stall_ms < 1.0, probe
    else:
        assert not probe.sustained and probe.longest_stall_ms == pytest.approx(100.0, abs=0.5), probe
        assert len(probe.noise_flags) == 1 and probe.noise_flags[0].startswith("stalled"), probe


def test_a_refusal_the_machine_disturbed_is_probed_again_before_it_counts():
    """A server that sustains up to 640 requests/s: its first probe below that is refused because the machine
    stalled it. The rate is offered again (a probe more), and the search still ends within its tolerance
    of the capacity; when every refusal is disturbed, it re-offers at most STALL_RETRIES times."""
    search = RateSearch(1000.0)
    capacity, disturbed_once, offered = 640.0, [], []
    while (rate := search.next_rate()) is not None:
        offered.append(rate)
        disturb = rate <= capacity and not disturbed_once
        disturbed_once += [rate] if disturb else []
        search.record(rate, rate <= capacity and not disturb, disturbed=disturb)
    assert capacity / 1.05 <= search.sustained_rps <= capacity, offered
    assert offered.count(disturbed_once[0]) == 2 and search.retries == 1
    always = RateSearch(1000.0)
    while (rate := always.next_rate()) is not None:
        always.record(rate, False, disturbed=True)
    assert always.retries == STALL_RETRIES and always.sustained_rps == 0


def test_probes_last_long_enough_for_the_p99_within_the_window():
    assert probe_seconds(1000.0, 1.0, 5.0) == 1.0
    assert probe_seconds(100.0, 1.0, 5.0) == 5.0  # capped: 500 requests
    assert probe_seconds(400.0, 1.0, 5.0) == pytest.approx(PROBE_REQUESTS / 400.0)
    assert probe_seconds(10.0, 1.0, 5.0) == pytest.approx(12.0)  # past the window: 100 requests for a p99


def test_a_server_that_sustains_nothing_stops_before_probes_grow_longer_than_three_windows():
    search = RateSearch(100.0, lowest_rps=lowest_rate(20.0))
    offered = []
    while (rate := search.next_rate()) is not None:
        offered.append(rate)
        search.record(rate, False)
    assert search.sustained_rps == 0 and min(offered) >= lowest_rate(20.0) == pytest.approx(2.0)
    assert max(probe_seconds(rate, 5.0, 20.0) for rate in offered) <= 60.0


# ---- real processes ------------------------------------------------------------------------------------------
def server_search(searcher, model, shape, bound_ms, space, *extra, study="srv", budget="4m"):
    return searcher.search(
        "--scenario",
        "server",
        "--slo-ms",
        str(bound_ms),
        "--eval-samples",
        "8",
        *extra,
        model=model,
        input_shape=shape,
        study=study,
        space=space,
        budget=budget,
        quick=False,
        timeout=600,
    )


def sustained_rate_search(searcher, space) -> dict:
    """The single-queue server's rate search; its best.json."""
    result = rerun_while_noisy(  # a clean closed loop is the winner whose server record is read
        lambda: server_search(
            searcher,
            f"{TINY}:service_timed",
            "4",
            10,
            space,
            "--trials",
            "1",
            "--finalists",
            "0",
            "--no-speed-pruning",
            "--measure-seconds",
            "1s-5s",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return searcher.best("srv")


def disturbed_refusals(probes: list[dict]) -> list[float]:
    """The rates refused while the machine took the server's core away, and not probed again: every call
    spins the same 2 ms, so a probe whose call p99 is over twice its median had calls stretched by
    something else running (seen in a full test run: calls of 6 ms at p99 in the probes that failed
    p99 <= 10 ms, 2.4-2.9 ms in those that passed, and a sustained rate half the theory's); or the search
    flagged the refusal as a stall and had no retry left."""
    return [
        p["rate_rps"]
        for p in probes
        if not p["sustained"] and (p["call_ms"]["p99"] > 2 * p["call_ms"]["p50"] or p["noise_flags"])
    ]


def test_the_sustained_rate_of_a_known_server_matches_queueing_theory(searcher, workdir):
    """One instance, batch 1, no wait: a single queue whose service time is the 2 ms each call spins.
    Its highest rate with p99 <= 10 ms, found by the rate search in real time, lies within queueing
    theory's bracket for this server: no lower than 85% of M/G/1's rate (Lindley's recursion) for calls
    with the closed loop's spread, shifted to the mean call time of the probe that decided the answer (as
    slow as they were measured there: a call after an idle gap costs more than one in a busy queue), and
    no higher than 115% of M/D/1's closed form at the faster of that mean and the closed loop's (a
    constant service time queues least); no rate past the server's capacity was reported sustained.

    Measured on a shared 2-core EPYC in nine searches: 0.96-1.15 of the lower end, 0.82-1.05 of the upper
    (then at the closed loop's mean, always the faster there). The test compared once with one figure,
    M/G/1 at the closed loop's calls, within 15%; a sleep's wake-ups then made a closed-loop window 2.62 ms
    a call against the probes' faster ones, and the rate came out 23% above it."""
    space = write_space(workdir / "space.yaml", batch_size=[1], max_wait_ms=[0], threads_per_instance=[1])
    for _attempt in range(3):  # searched again only when a disturbed refusal left the answer out of bounds
        shutil.rmtree(workdir / "studies", ignore_errors=True)
        best = sustained_rate_search(searcher, space)
        bracket = queueing_bracket(best)
        if bracket.holds or not disturbed_refusals(best["metrics"]["server"]["probes"]):
            break
    server, probes = best["server"], best["metrics"]["server"]["probes"]
    assert bracket.decisive is not None and bracket.decisive["rate_rps"] == server["sustained_rps"], probes
    assert bracket.probe_call_s >= 0.002  # a call spins 2 ms: the probe's call times are the calls', not zero
    probed = [(round(p["rate_rps"], 1), p["why"], round(p["longest_stall_ms"], 1)) for p in probes]
    assert bracket.holds, (bracket, disturbed_refusals(probes), probed)
    capacity = 1.0 / bracket.service_s
    assert all(p["rate_rps"] <= capacity for p in server["probes"] if p["sustained"]), server["probes"]
    assert len(server["probes"]) >= 3 and all(p["requests"] >= 100 for p in server["probes"])


@dataclasses.dataclass(frozen=True)
class QueueingBracket:
    """Where queueing theory puts a single-queue server's sustained rate, beside what the search found."""

    sustained_rps: float
    decisive: dict | None  # the probe that decided the answer: the highest rate sustained
    probe_call_s: float  # that probe's mean call
    service_s: float  # the closed loop's mean call
    lowest: float  # M/G/1 (Lindley) at the probe's calls with the closed loop's spread
    highest: float  # M/D/1 at the faster of the two means

    @property
    def holds(self) -> bool:
        return self.decisive is not None and 0.85 * self.lowest <= self.sustained_rps <= 1.15 * self.highest


def queueing_bracket(best: dict) -> QueueingBracket:
    probes = best["metrics"]["server"]["probes"]
    decisive = max((p for p in probes if p["sustained"]), key=lambda p: p["rate_rps"], default=None)
    stamps = np.load(best["metrics"]["measurement"]["stamps"][0])  # the closed loop's calls: the jitter's shape
    closed_loop_s = stamps[:, 1] - stamps[:, 0]
    service_s = float(closed_loop_s.mean())
    probe_call_s = decisive["call_ms"]["mean"] / 1e3 if decisive else service_s
    return QueueingBracket(
        sustained_rps=best["server"]["sustained_rps"],
        decisive=decisive,
        probe_call_s=probe_call_s,
        service_s=service_s,
        lowest=mg1_sustainable_rate(0.010, closed_loop_s - service_s + probe_call_s),
        highest=md1_sustainable_rate(0.010, min(service_s, probe_call_s)),
    )


def test_a_small_model_completes_a_server_study_and_everything_around_it_carries_the_scenario(searcher, workdir):
    """tiny_cnn, batch and wait searched, a finalist round probed at the leader's rate and +-10%:
    best.json names the scenario and the policy, show and the report speak in sustained requests/s, and
    the launch script exports the batching policy for the user's server."""
    space = write_space(workdir / "space.yaml", batch_size=[1, 4], max_wait_ms=[0, 2], threads_per_instance=[1])
    result = server_search(
        searcher,
        tiny(),
        "3x16x16",
        25,
        space,
        "--trials",
        "3",
        "--finalists",
        "1",
        "--finalist-repeats",
        "1",
        "--measure-seconds",
        "0.3s-1s",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "requests/s sustained at p99 <= 25 ms" in result.stdout
    best = json.loads((workdir / "studies" / "srv" / "best.json").read_text())
    assert best["scenario"] == "server" and best["objective"]["name"] == "server"
    server = best["server"]
    assert server["slo_ms"] == 25 and server["max_batch"] == best["config"]["batch_size"]
    assert server["max_wait_ms"] == best["config"]["max_wait_ms"] and server["sustained_rps"] > 0
    probe = next(p for p in server["probes"] if p["sustained"] and p["rate_rps"] == server["sustained_rps"])
    assert probe["p99_ms"] <= 25 and probe["requests"] >= 100
    finalists = best["finalists"]  # re-measured by a rate search of its own, starting at the leader's rate
    assert finalists and finalists["candidates"][0]["values"][0] > 0, result.stdout[-3000:]

    show = searcher("show", "--study", "srv")
    assert show.returncode == 0 and "requests/s at p99<=25ms" in show.stdout, show.stdout
    report = searcher("report", "--study", "srv")
    assert report.returncode == 0, report.stderr
    page = (workdir / "studies" / "srv" / "report.html").read_text()
    assert "p99 latency against offered request rate" in page and "requests/s sustained" in page
    export = searcher("export", "--study", "srv", "--format", "sh")
    assert export.returncode == 0, export.stderr
    script = next((workdir / "studies" / "srv").glob("*.sh")).read_text()
    assert f"export AUTOTUNE_MAX_BATCH={server['max_batch']}" in script
    assert f"export AUTOTUNE_MAX_WAIT_MS={server['max_wait_ms']:g}" in script
    assert math.isfinite(server["upper_bound_rps"]) and server["upper_bound_rps"] > 0


@pytest.mark.parametrize(
    "args,message",
    [
        (["--scenario", "server"], "--scenario server searches the highest request rate at a p99 latency bound"),
        (["--scenario", "server", "--slo-ms", "0"], "--slo-ms must be a positive bound"),
        (["--scenario", "server", "--slo-ms", "-5"], "--slo-ms must be a positive bound"),
        (["--scenario", "server", "--slo-ms", "50", "--objective", "latency"], "drop one of them"),
        (["--scenario", "busy"], "invalid choice: 'busy'"),
    ],
)
def test_bad_server_input_is_one_line_and_exit_2(cli, args, message):
    result = cli("search", "--model", "resnet18", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_negative_wait_in_the_space_is_one_line_and_exit_2(cli, workdir):
    (workdir / "s.yaml").write_text("max_wait_ms: [0, -1]\n")
    result = cli("search", "--model", "resnet18", "--space", "s.yaml", "--scenario", "server", "--slo-ms", "50")
    assert result.returncode == 2, result.stderr
    assert "max_wait_ms values are milliseconds" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_openvino_throughput_mode_is_fed_the_same_arrivals_and_judged_by_the_same_rules(workdir):
    """The benchmark's point of comparison (docs/benchmarks/server_scenario.py): an IR in OpenVINO's throughput mode,
    one request per arrival; its rate search ends at a sustained rate with its probes recorded."""
    import subprocess
    import sys

    import openvino as ov
    import torch
    from tiny_models import TinyCNN

    torch.manual_seed(0)
    xml = workdir / "model.xml"
    ov.save_model(ov.convert_model(TinyCNN().eval(), example_input=torch.randn(1, 3, 16, 16)), str(xml))
    command = [sys.executable, "-m", "autotune.remeasure.openvino_server", str(xml), "1,3,16,16", "--slo-ms", "20"]
    done = subprocess.run([*command, "--min-s", "0.3", "--max-s", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sustained_rps"] > 0 and result["probes"], result
    assert result["sustained_rps"] <= 1.1 * result["upper_bound_rps"]
    kept = [p for p in result["probes"] if p["sustained"]]
    assert kept and all(p["latency_ms"]["p99"] <= 20 and not p["overloaded"] for p in kept)
    assert result["openvino"]["requests"] >= 1

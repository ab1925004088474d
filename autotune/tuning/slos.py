"""Latency bounds a measured trial must meet: --slo-ms, --ttft-slo-ms / --tpot-slo-ms, and the server
scenario's sustained rate.

A config over a bound is measured, recorded and PRUNED rather than failed: it stays in the study for the
report, but never wins, becomes a finalist or sets the speed pruner's bar.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune.records.attributes import Attr
from autotune.records.metrics import TrialMetrics
from autotune.records.spec import SearchSpec


def check_latency_bounds(trial: optuna.trial.Trial, spec: SearchSpec, metrics: TrialMetrics) -> None:
    """Every bound the search was given, checked on the completed trial's metrics."""
    if spec.objective == "server":  # a language model's TTFT and TPOT bounds are its server's, judged there
        check_sustained(trial, metrics)
        return
    if spec.slo_ms is not None:
        check_slo(trial, spec.slo_ms, metrics)
    if spec.ttft_slo_ms is not None or spec.tpot_slo_ms is not None:
        check_token_slos(trial, spec.ttft_slo_ms, spec.tpot_slo_ms, metrics)


def check_slo(trial: optuna.trial.Trial, bound: float, metrics: TrialMetrics) -> None:
    """--slo-ms: a config whose p99 latency per call exceeds the bound is pruned."""
    p99 = metrics.latency_ms.p99
    slo = {"bound_ms": bound, "p99_ms": p99, "met": p99 is not None and p99 <= bound}
    trial.set_user_attr(Attr.SLO, slo)
    if not slo["met"]:
        reason = (
            f"latency SLO: p99 {p99:.1f} ms > {bound:g} ms"
            if p99 is not None
            else "latency SLO: too few calls for a p99 (needs 100)"
        )
        trial.set_user_attr(Attr.PRUNE_REASON, reason)
        raise optuna.TrialPruned(reason)


def check_sustained(trial: optuna.trial.Trial, metrics: TrialMetrics) -> None:
    """The server scenario: a configuration that sustained no rate at the bound (even 1/64 of its
    closed-loop throughput) is pruned."""
    if (metrics.sustained_rps or 0.0) > 0:
        return
    served, server = metrics.llm_server, metrics.server
    if served is not None:  # a language model's server: its TTFT and TPOT bounds
        reason = f"server: no request rate kept {served.bounds.describe()}: {served.verdict or 'no probe ran'}"
    else:
        assert server is not None
        reason = f"server: no request rate kept p99 within {server.slo_ms:g} ms: {server.verdict or 'no probe ran'}"
    trial.set_user_attr(Attr.PRUNE_REASON, reason)
    raise optuna.TrialPruned(reason)


def check_token_slos(
    trial: optuna.trial.Trial, ttft_slo_ms: float | None, tpot_slo_ms: float | None, metrics: TrialMetrics
) -> None:
    """--ttft-slo-ms / --tpot-slo-ms: over a p99 bound is pruned, as --slo-ms."""
    generation = metrics.generation
    assert generation is not None
    bounds = {
        "ttft": (ttft_slo_ms, generation.ttft_ms),
        "tpot": (tpot_slo_ms, generation.tpot_ms),
    }
    slo: dict[str, Any] = {}
    failed = []
    for name, (bound, summary) in bounds.items():
        if bound is None:
            continue
        p99 = summary.p99
        met = p99 is not None and p99 <= bound
        slo[name] = {"bound_ms": bound, "p99_ms": p99, "met": met}
        if not met:
            failed.append(
                f"{name.upper()} p99 {p99:.1f} ms > {bound:g} ms"
                if p99 is not None
                else f"{name.upper()}: too few samples for a p99 (needs 100)"
            )
    slo["met"] = not failed
    trial.set_user_attr(Attr.SLO, slo)
    if failed:
        reason = "latency SLO: " + "; ".join(failed)
        trial.set_user_attr(Attr.PRUNE_REASON, reason)
        raise optuna.TrialPruned(reason)

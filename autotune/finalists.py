"""The end of a search: the top few configs re-measured in fresh processes, interleaved, several times.

One lucky measurement must not pick the winner. Candidates (and the eager baseline, for an interleaved
speedup) run round-robin A B C A B C ... so a slow drift of a shared machine hits all alike. The winner
must beat the runner-up by more than the noise; otherwise the simpler config wins the tie.
"""

from __future__ import annotations

import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import optuna

from autotune.config import TrialConfig
from autotune.errors import TrialFailed
from autotune.pruners import clean_trials, maximizes
from autotune.trials import TrialContext, run_config

BACKEND_COMPLEXITY = {"eager": 0, "inductor": 1, "onnxruntime": 2, "openvino": 3, "torchao": 4}
PRECISION_COMPLEXITY = {"fp32": 0, "bf16": 1, "int8": 2}
MIN_TIE_NOISE = 0.01  # never call a gap under 1% a win


def complexity(config: dict[str, Any]) -> tuple:
    """Fewer moving parts first: eager < inductor < ONNX Runtime < OpenVINO < torchao; fp32 < bf16 <
    int8; one instance; the system allocator; then the smaller batch (lower latency)."""
    return (
        BACKEND_COMPLEXITY.get(config["backend"], len(BACKEND_COMPLEXITY)),
        PRECISION_COMPLEXITY.get(config["precision"], len(PRECISION_COMPLEXITY)),
        config["instances"],
        config["allocator"] != "glibc",
        config["batch_size"],
    )


def pick_candidates(study: optuna.study.Study, count: int) -> list[optuna.trial.FrozenTrial]:
    """The best `count` clean trials with distinct configs, best first."""
    picked, seen = [], set()
    for trial in clean_trials(study):
        key = trial.user_attrs.get("config_summary") or str(trial.params)
        if key not in seen:
            seen.add(key)
            picked.append(trial)
        if len(picked) == count:
            break
    return picked


def summarize_runs(values: list[float], ci_rels: list[float]) -> dict[str, Any]:
    """Median, range and relative noise of one candidate's repeated measurements."""
    if not values:
        return {"median": None, "min": None, "max": None, "spread_rel": None, "noise_rel": None, "runs": 0}
    median = statistics.median(values)
    spread = (max(values) - min(values)) / 2 / median if median else None
    noise = max([spread or 0.0, statistics.median(ci_rels) if ci_rels else 0.0, MIN_TIE_NOISE])
    return {"median": median, "min": min(values), "max": max(values), "spread_rel": spread, "noise_rel": noise, "runs": len(values)}


def select_winner(candidates: list[dict[str, Any]], maximize: bool) -> tuple[int, str]:
    """Index of the winning candidate and why.

    Each candidate has `config` and `summary` (from summarize_runs). Candidates whose median is within
    the noise of the best median tie with it, unless (3+ runs each) every run of the best beat every run
    of theirs; among the tied the simplest config wins.
    """
    measured = [i for i, c in enumerate(candidates) if c["summary"]["median"] is not None]
    if not measured:
        raise ValueError("no candidate has a clean finalist measurement")
    ordered = sorted(measured, key=lambda i: candidates[i]["summary"]["median"], reverse=maximize)
    top = candidates[ordered[0]]["summary"]
    if len(ordered) == 1:
        return ordered[0], "only one candidate has clean measurements"

    def gap(i: int) -> float:
        other = candidates[i]["summary"]["median"]
        return abs(top["median"] - other) / min(top["median"], other)

    def noise(i: int) -> float:
        return max(top["noise_rel"], candidates[i]["summary"]["noise_rel"])

    def separated(i: int) -> bool:
        """With 3+ runs each, every run of the best beats every run of the other."""
        other = candidates[i]["summary"]
        if min(top["runs"], other["runs"]) < 3:
            return False
        return top["min"] > other["max"] if maximize else top["max"] < other["min"]

    tied = [ordered[0], *(i for i in ordered[1:] if gap(i) <= noise(i) and not separated(i))]
    runner_up = ordered[1]
    if len(tied) == 1:
        return ordered[0], (f"beats the runner-up by {gap(runner_up):.1%}, more than the noise ({noise(runner_up):.1%})")
    simplest = min(tied, key=lambda i: complexity(candidates[i]["config"]))
    others = ", ".join(f"#{candidates[i]['trial']} ({gap(i):.1%} from the best, noise {noise(i):.1%})" for i in tied if i != ordered[0])
    if simplest == ordered[0]:
        return simplest, f"fastest, and the simplest of the configs within the noise of it: {others}"
    return simplest, f"tie within the noise with the fastest (#{candidates[ordered[0]]['trial']}): the simpler config wins; tied: {others}"


def run_finalists(
    study: optuna.study.Study,
    ctx: TrialContext,
    work_dir: Path,
    count: int,
    repeats: int,
    deadline: float,
    timeout_s: float,
    objective_value: Callable[[dict[str, Any]], float],
    baseline: optuna.trial.FrozenTrial | None,
    log: Callable[[str], None],
) -> dict[str, Any] | None:
    """Re-measure the top candidates (and the baseline) round-robin; store and return the record."""
    maximize = maximizes(study)
    picked = pick_candidates(study, count)
    if not picked:
        return None
    base_number = baseline.number if baseline is not None else None
    entries = [{"trial": t.number, "config": t.user_attrs["config"], "search_value": t.value, "runs": [],
                "candidate": True, "baseline": t.number == base_number} for t in picked]
    if baseline is not None and base_number not in {t.number for t in picked}:
        entries.append({"trial": base_number, "config": baseline.user_attrs["config"], "search_value": baseline.value,
                        "runs": [], "candidate": False, "baseline": True})
    typical = {e["trial"]: _trial_seconds(study, e["trial"]) for e in entries}
    # Drift depends on numerics only: the search already measured it for every entry.
    known_drift = {e["trial"]: _search_drift(study, e["trial"]) for e in entries}
    started = time.monotonic()
    log(f"finalists: re-measuring trials {', '.join('#' + str(e['trial']) for e in entries)} x{repeats}, interleaved")
    schedule = [(round_index, entry) for round_index in range(repeats) for entry in entries]  # A B C A B C ...
    for round_index, entry in schedule:
        if deadline - time.monotonic() < typical[entry["trial"]]:
            log("finalists: budget reached; deciding on the runs made so far")
            break
        run_dir = work_dir / f"round{round_index}-trial{entry['trial']:05d}"
        try:
            metrics, _, _ = run_config(TrialConfig.from_dict(entry["config"]), ctx, run_dir, timeout_s, known_drift=known_drift[entry["trial"]])
        except TrialFailed as exc:
            entry["runs"].append({"failed": exc.cause})
            log(f"finalists: round {round_index + 1} trial #{entry['trial']} FAILED: {exc.cause}")
            continue
        value = objective_value(metrics)
        entry["runs"].append({"value": value, "valid": metrics["valid"], "ci_rel": metrics["measurement"]["throughput_ci_rel"],
                              "noise_flags": metrics["measurement"]["noise_flags"], "drift": metrics["drift"],
                              "calls": metrics["measurement"]["calls"], "window_s": metrics["measurement"]["common_window_s"]})
        log(f"finalists: round {round_index + 1} trial #{entry['trial']} {value:.2f}{'' if metrics['valid'] else ' (noisy: ' + '; '.join(metrics['measurement']['noise_flags']) + ')'}")
    record: dict[str, Any] = {
        "repeats": repeats, "seconds": time.monotonic() - started, "candidates": entries,
        "last_trial": max(t.number for t in study.get_trials(deepcopy=False)),
        "order": "round-robin over the candidates and the baseline, fresh processes per run",
        "host": socket.gethostname(),  # in a fleet, the worker whose round this is (the last to finish)
    }
    decide(record, maximize)
    study.set_user_attr("finalists", record)
    return record


def decide(record: dict[str, Any], maximize: bool) -> dict[str, Any]:
    """Summarize each entry's clean runs and pick the winner; export re-decides from the stored runs."""
    for entry in record["candidates"]:
        clean = [r for r in entry["runs"] if r.get("valid")]
        entry["summary"] = summarize_runs([r["value"] for r in clean], [r["ci_rel"] for r in clean if r.get("ci_rel") is not None])
    contenders = [e for e in record["candidates"] if e["candidate"]]
    try:
        index, reason = select_winner(contenders, maximize)
        record.update(winner_trial=contenders[index]["trial"], selection=reason)
    except ValueError as exc:
        record.update(winner_trial=None, selection=str(exc))
    return record


def _search_drift(study: optuna.study.Study, number: int) -> dict[str, Any] | None:
    drift = study.trials[number].user_attrs.get("drift")
    return None if not drift else {**drift, "reused_from": drift.get("reused_from", number)}


def _trial_seconds(study: optuna.study.Study, number: int) -> float:
    trial = study.trials[number]
    if trial.datetime_start and trial.datetime_complete:
        return max(5.0, (trial.datetime_complete - trial.datetime_start).total_seconds() - (trial.user_attrs.get("prepare_s") or 0.0))
    return 30.0

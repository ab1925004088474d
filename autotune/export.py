"""best.json: the winner, how to reproduce it, what it measured, and what it is valid for.

Reads the stored study only; never re-runs the search. Schema documented in docs/best-json.md.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import optuna

from autotune.errors import UserError
from autotune.config import UNSET_IN_COMMANDS
from autotune.files import write_json_atomic
from autotune.launch import shell_command
from autotune.trials import replay_argv

SCHEMA = "autotune.best/1"

METRIC_KEYS = ("throughput_sps", "latency_ms", "peak_rss_mib", "peak_rss_mib_total", "prepare_s", "load_s", "first_call_s",
               "artifact", "measurement", "instances", "torch_version")


def baseline_trial(study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
    """The completed eager fp32 baseline trial, if the study has one."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if trial.user_attrs.get("baseline"):
            return trial
    return None


def _counts(study: optuna.study.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] = counts.get(trial.state.name.lower(), 0) + 1
    return counts


def replay_commands(attrs: dict[str, Any], best_path: Path) -> list[str]:
    """One command per instance that re-runs the winner from best.json, pinned as it was tuned."""
    return [
        shell_command(attrs.get("env", {}), [*prefix, *replay_argv(best_path.resolve(), i)], UNSET_IN_COMMANDS)
        for i, prefix in enumerate(attrs.get("pin_prefixes", []))
    ]


def build_best(study: optuna.study.Study, best_path: Path) -> dict[str, Any]:
    """The best.json document for a study's best COMPLETE trial."""
    try:
        best = study.best_trial
    except ValueError:
        raise UserError(f"study {study.study_name!r} has no COMPLETE trial yet: run 'autotune search' first") from None
    spec = study.user_attrs.get("spec", {})
    attrs = best.user_attrs
    baseline = baseline_trial(study)
    base_sps = baseline.user_attrs.get("throughput_sps") if baseline else None
    drift = dict(attrs.get("drift") or {})
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "study": {"name": study.study_name, "storage": spec.get("storage"), "trial": best.number, "trials": _counts(study)},
        "objective": {"name": spec.get("objective"), "direction": study.direction.name.lower(), "value": best.value},
        "model": study.user_attrs.get("model_for_trials", spec.get("model")),
        "config": attrs["config"],
        "environment": attrs.get("env", {}),
        "launch": {
            "pinning": attrs.get("pinning"),
            "commands": replay_commands(attrs, best_path),
            "note": "one command per instance, started together; each re-measures its instance and prints JSON",
        },
        "job": attrs.get("job"),
        "metrics": {key: attrs.get(key) for key in METRIC_KEYS},
        "measure_settings": attrs.get("measure_settings"),
        "drift": {
            **drift,
            "metric": "relative_l2",
            "max_drift": spec.get("max_drift"),
            "data": f"synthetic: {spec.get('eval_samples')} seeded random inputs (FP32 eager outputs as reference)",
        },
        "baseline": None if baseline is None else {
            "trial": baseline.number,
            "config": baseline.user_attrs.get("config"),
            "throughput_sps": base_sps,
            "latency_ms": baseline.user_attrs.get("latency_ms"),
        },
        "speedup_vs_baseline": (attrs["throughput_sps"] / base_sps) if base_sps and attrs.get("throughput_sps") else None,
        "fingerprint": study.user_attrs.get("fingerprint"),
    }


def export_best(study: optuna.study.Study, path: str | Path) -> Path:
    return write_json_atomic(path, build_best(study, Path(path)))

"""What studies already run on this machine say about a new one: a prior for the first trials.

Studies in the same storage, or under the same studies folder, whose hardware fingerprint is this
machine's and whose task is the same are read (never changed): each one's best clean trial becomes an
early trial of the new study (Optuna's `enqueue_trial`; a parameter the new space does not offer is
sampled instead, which is how Optuna adapts an enqueued trial), and each backend x precision family's
best speedup over its study's baseline orders the coverage round ahead of the ISA rule
(tuning/payoff.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune.backends.generation import WEIGHT_ONLY, activations_of
from autotune.machine.fingerprint import fingerprint_differences
from autotune.records.attributes import Attr, TrialAttrs
from autotune.records.config import TrialConfig
from autotune.records.fingerprint import Fingerprint
from autotune.records.spec import SearchSpec, StoredSpec
from autotune.results.selection import baseline_trial, clean_trials, metrics_of

MAX_SIBLING_STORAGES = 20  # opening a storage costs ~0.1 s: the most recent studies say the most
MAX_PRIOR_WINNERS = 3  # the most recent matching studies' winners; older ones add little and cost trials


@dataclass
class Prior:
    """Winners to try early (params and why) and each family's best known speedup with its source."""

    winners: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    family_speedups: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)


def sibling_storages(studies_root: Path, own: Path) -> list[str]:
    """The SQLite files of the other studies under the same studies folder (the default layout gives
    each study its own `studies/<name>/study.db`), most recently changed first."""
    files = [p for p in studies_root.glob("*/study.db") if p.resolve() != own.resolve()]
    newest = sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)[:MAX_SIBLING_STORAGES]
    return [f"sqlite:///{p.resolve()}" for p in newest]


def same_machine_studies(
    storages: list[Any], study_name: str, hardware: dict[str, Any], task: str
) -> list[tuple[Any, str]]:
    """(storage, name) of the other studies run on identical hardware for the same task, newest first;
    a storage that cannot be read (another Optuna's schema, a file being written) is skipped."""
    found = []
    for storage in storages:
        try:
            summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
        except Exception:
            continue
        for summary in reversed(summaries):
            attrs = summary.user_attrs
            stored = Fingerprint.of(summary)
            recorded = stored.hardware.to_json() if stored and stored.hardware else None
            # identical in every fact the earlier study recorded (a flag probed since is not a difference)
            if summary.study_name == study_name or not recorded or not hardware:
                continue
            if fingerprint_differences({"hardware": recorded}, {"hardware": hardware}):
                continue
            if prior_kind(StoredSpec.from_json(attrs.get(Attr.SPEC) or {})) != task:
                continue
            found.append((storage, summary.study_name))
    return found


def read_prior(storages: list[Any], study_name: str, hardware: dict[str, Any], task: str) -> Prior:
    """The prior from the studies `same_machine_studies` finds (an unreadable one is skipped)."""
    prior = Prior()
    if not hardware:
        return prior
    for storage, name in same_machine_studies(storages, study_name, hardware, task):
        try:
            study = optuna.load_study(study_name=name, storage=storage)
            clean = clean_trials(study)
        except Exception:  # a study of another autotune version or a broken one: not a reason to stop
            continue
        if not clean:
            continue
        base = baseline_trial(study)
        base_value = metrics_of(base).throughput_sps if base is not None else None
        maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        if len(prior.winners) < MAX_PRIOR_WINNERS and clean[0].params:
            best = clean[0]
            speedup = f", {metrics_of(best).throughput_sps / base_value:.2f}x its baseline" if base_value else ""
            params = as_measured(dict(best.params), TrialAttrs.of(best).config)
            prior.winners.append((params, f"prior: the winner of study {name} on this machine{speedup}"))
        if not (base_value and maximize):
            continue
        for trial in clean:
            trial_attrs = TrialAttrs.of(trial)
            if trial_attrs.baseline:  # 1.00x by definition: says nothing of its family elsewhere
                continue
            config = trial_attrs.config
            if config is None:  # a completed trial always recorded its config
                continue
            if config.precision in WEIGHT_ONLY and "activations" not in config.options:
                continue  # fp32 activations, measured before they were an option: not what its coverage runs
            family = (config.backend, config.precision)
            speedup_value = metrics_of(trial).throughput_sps / base_value
            if speedup_value > prior.family_speedups.get(family, (0.0, ""))[0]:
                prior.family_speedups[family] = (speedup_value, name)
    return prior


def as_measured(params: dict[str, Any], config: TrialConfig | None) -> dict[str, Any]:
    """A winner's parameters with what its config ran but its study did not sample: a weight-only
    precision's fp32 activations from before they were an option (Optuna would sample the missing
    value, and the enqueued winner would not be the one measured), and a generation winner's sequences as
    the total it ran (a study stored when they counted per instance held 8 for 2 x 8)."""
    if config is not None and "sequences" in params:
        params["sequences"] = config.total_batch
    backend = params.get("backend")
    weight_only = params.get(f"{backend}.precision") in WEIGHT_ONLY
    if config is not None and weight_only and f"{backend}.activations" not in params:
        params[f"{backend}.activations"] = activations_of(config.precision, config.options)
    return params


def prior_kind(spec: StoredSpec | SearchSpec) -> str:
    """Which studies inform each other: the same task, and a server study only another (its winners are
    chosen by sustained rate at a bound, not by closed-loop throughput)."""
    return f"{spec.task}:server" if spec.objective == "server" else spec.task

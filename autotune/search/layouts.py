"""The layout round: once the coverage round is through, the leader is measured with every other split
of the cores into pinned instances.

How many instances share the cores is the dimension with the largest effect after backend and
precision, and the coverage round measures every family with one instance on all cores only. Small
models win with several one-thread instances (efficientnet_b0 on a 2-core EPYC: ONNX Runtime fp32,
111.5 samples/s as one instance of two threads, 131.2 as two of one; a 20-minute search's sampler
did not get there, a 60-minute one found it after 23 minutes). So right after the coverage round the
best clean configuration (the best noisy one when no measurement was clean) is enqueued again with
each other instance count, each with the most threads that fit beside its siblings, everything else
as it is: a cheap trial (its artifact is cached, and the speed pruner stops a clearly slower layout
after screening). Once per study, for the objectives that sum work over instances (throughput, and
the server scenario's sustained rate); a call's latency only grows when its cores are split.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune.results.selection import clean_trials

ROUND_ATTR = "layout_round"  # on the study: the leader's trial number, once the round is enqueued
OBJECTIVES = ("throughput", "server")


def layout_variants(
    params: dict[str, Any], instances: list[int], threads: list[int] | None, cores: int
) -> list[dict[str, Any]]:
    """`params` with each other instance count of the space, each instance with the most threads that fit
    beside its siblings (`threads` None: any count up to cores / instances); a count with no thread
    count that fits is left out. The fewest instances first."""
    variants = []
    for count in sorted(instances):
        if count == params.get("instances"):
            continue
        limit = cores // count
        fitting = [t for t in (threads or [limit]) if 1 <= t <= limit]
        if fitting:
            variants.append({**params, "instances": count, "threads_per_instance": max(fitting)})
    return variants


def best_complete(study: optuna.study.Study) -> optuna.trial.FrozenTrial | None:
    """The best completed trial, flagged noisy or not: on a loaded machine every measurement may be, and
    a noisy leader is still the best guess of where to look (it never wins on that measurement)."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return max(complete, key=lambda t: t.values[0], default=None)


class LayoutRound:
    """Optuna callback: when no enqueued trial is left to run (baseline, prior winners, coverage round),
    enqueue the layout variants of the best clean trial (the best noisy one when none is clean) once,
    each saying why it runs then (`order`)."""

    def __init__(self, instances: list[int], threads: list[int] | None, cores: int, objective: str) -> None:
        self.instances, self.threads, self.cores = instances, threads, cores
        self.active = objective in OBJECTIVES and len(instances) > 1

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> None:
        if not self.active or ROUND_ATTR in study.user_attrs:
            return
        if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return  # the enqueued rounds before it are not through yet
        leader = next(iter(clean_trials(study)), None) or best_complete(study)
        if leader is None:
            return
        study.set_user_attr(ROUND_ATTR, leader.number)  # first: a second worker of a fleet does not enqueue again
        summary = leader.user_attrs.get("config_summary", "")
        for params in layout_variants(dict(leader.params), self.instances, self.threads, self.cores):
            layout = f"{params['instances']} instance(s) x {params['threads_per_instance']} thread(s)"
            why = f"layout round: the leader #{leader.number} ({summary}) as {layout}"
            study.enqueue_trial(params, user_attrs={"layout": True, "order": why}, skip_if_exists=True)

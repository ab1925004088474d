"""The largest `compressed_share` within the quality bound, found by bisection instead of sampled blindly.

Drift grows with the share (the least sensitive matrices are compressed first), so once a type's trial breaks
the bound at some share, the answer lies below it: the next trial of that type and its options is enqueued at
the listed share halfway between the largest share known within the bound (none yet: 0) and the smallest
known beyond it, until no listed share lies between. With the shares in eighths, a type whose whole-model
file drifts too far reaches its largest share within the bound in at most 3 more trials.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import optuna

from autotune.records.attributes import Attr, TrialAttrs
from autotune.tuning.fleet import ABANDONED, MAX_RETRIES
from autotune.tuning.space import SearchSpace

SHARE = "compressed_share"
MIX_SEARCH = "mix search"  # the order note every enqueued trial carries


def _share_of(trial: optuna.trial.FrozenTrial, backend: str, default: float) -> float:
    """The share the trial ran: its configuration's (stored once it ran), else its parameter where the mix
    search set it, else the largest listed (what a sampled trial runs: the space never samples a share)."""
    config = TrialAttrs.of(trial).config
    if config is not None and config.backend == backend:
        return float(config.options.get(SHARE, 1.0))
    value = trial.params.get(f"{backend}.{SHARE}")
    return default if value is None else float(value)


# failures from outside the trial (the search's budget, Ctrl-C): they say nothing of the share, which runs again
STOPPED_FROM_OUTSIDE = ("budget ran out", "interrupted", *ABANDONED)


def _failed_at_share(trial: optuna.trial.FrozenTrial) -> bool:
    """A mix trial that failed on its own (its build or run crashed): its share cannot be the answer. One
    stopped from outside (the budget, Ctrl-C, its worker or orchestrator gone), or one still running, is not."""
    cause = TrialAttrs.of(trial).fail_cause or ""
    return (
        trial.state == optuna.trial.TrialState.FAIL
        and Attr.MIX_SHARE in trial.user_attrs
        and not cause.startswith(STOPPED_FROM_OUTSIDE)
    )


def _abandoned_at_share(trial: optuna.trial.FrozenTrial) -> bool:
    """A mix trial failed because its worker or orchestrator went away."""
    cause = TrialAttrs.of(trial).fail_cause or ""
    return (
        trial.state == optuna.trial.TrialState.FAIL
        and Attr.MIX_SHARE in trial.user_attrs
        and cause.startswith(ABANDONED)
    )


def _verdict(trial: optuna.trial.FrozenTrial) -> bool | None:
    """True: its drift was within the bound; False: it was pruned for drift; None: not known (failed, or
    pruned before drift was measured)."""
    attrs = TrialAttrs.of(trial)
    if (attrs.prune_reason or "").startswith("drift:"):
        return False
    if trial.state == optuna.trial.TrialState.COMPLETE or attrs.drift is not None:
        return True
    return None


class MixBisection:
    """Optuna callback: for each backend whose space lists several shares, and each of its numerics (precision
    and the options that change the numbers) with a trial pruned for drift, enqueue the bisection's next share
    (module docstring) at the layout of that group's pruned trial at the smallest share."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.shares = {
            backend: sorted(float(s) for s in dims[SHARE])
            for backend, dims in space.backends.items()
            if len(dims.get(SHARE, [])) > 1
        }

    def __call__(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial | None = None) -> None:
        if not self.shares:
            return
        trials = study.get_trials(deepcopy=False)
        # a failed trial's share may run again (stopped from outside); Optuna's skip_if_exists would refuse it
        taken = {self._key(self._params(t)) for t in trials if t.state != optuna.trial.TrialState.FAIL}
        groups: dict[tuple[Any, ...], list[optuna.trial.FrozenTrial]] = {}
        for done in trials:
            if not done.state.is_finished():  # running (another worker's) or waiting: no verdict yet
                continue
            backend = done.params.get("backend")
            if backend in self.shares and self._applies(done.params, backend):
                groups.setdefault(self._numerics(done.params, backend), []).append(done)
        for members in groups.values():
            if self._kept_breaks_bound(list(trials), members[0].params):
                continue  # every share holds the kept type at least: none can pass where it does not
            params = self._next(members)
            if params is not None and self._key(params) not in taken:
                share = params[f"{params['backend']}.{SHARE}"]
                why = f"{MIX_SEARCH}: {params['backend']} {params[params['backend'] + '.precision']} at share {share}"
                user_attrs = {Attr.ORDER: why, Attr.MIX_SHARE: share}
                study.enqueue_trial(params, user_attrs=user_attrs)
                taken.add(self._key(params))

    def _next(self, members: list[optuna.trial.FrozenTrial]) -> dict[str, Any] | None:
        """The next trial of one group: the listed share halfway between the known ends, or None."""
        backend = members[0].params["backend"]
        top = self.shares[backend][-1]
        within = [_share_of(t, backend, top) for t in members if _verdict(t) is True]
        # a mix trial that failed on its own cannot be the answer: past it, lower; nor can a share whose trials
        # lost their process more often than a configuration is retried (one that kills its host, say)
        lost = Counter(_share_of(t, backend, top) for t in members if _abandoned_at_share(t))
        beyond = [
            (_share_of(t, backend, top), t)
            for t in members
            if _verdict(t) is False or _failed_at_share(t) or lost[_share_of(t, backend, top)] > MAX_RETRIES
        ]
        if not beyond:
            return None
        high, pruned = min(beyond, key=lambda pair: pair[0])
        if float(pruned.params.get(f"{backend}.ratio", 1.0)) != 1.0:  # NNCF's own mix: not ours to bisect
            return None
        low = max((s for s in within if s < high), default=None)
        between = [s for s in self.shares[backend] if (low is None or s > low) and s < high]
        if not between:
            return None
        middle = ((low if low is not None else 0.0) + high) / 2
        share = min(between, key=lambda s: (abs(s - middle), -s))
        return {**pruned.params, f"{backend}.{SHARE}": share}

    def _kept_breaks_bound(self, trials: list[optuna.trial.FrozenTrial], params: dict[str, Any]) -> bool:
        """Whether a whole-model trial of the type this group's mix keeps its sensitive matrices in, with the
        same numerics otherwise (the options both set, a KV cache's type say), was pruned for drift (int8
        weights past the bound: no int4-over-int8 mix is within it, share 0 included)."""
        backend = params["backend"]
        kept = dict(self.space.specs[backend].kept_types).get(str(params.get(f"{backend}.precision")))
        if kept is None:
            return False
        mine = dict(self._numerics(params, backend))
        for done in trials:
            if done.params.get("backend") != backend or done.params.get(f"{backend}.precision") != kept:
                continue
            if _share_of(done, backend, 1.0) != 1.0 or _verdict(done) is not False:
                continue
            theirs = dict(self._numerics(done.params, backend))
            shared = (mine.keys() & theirs.keys()) - {f"{backend}.precision"}
            if all(mine[key] == theirs[key] for key in shared):
                return True
        return False

    def _applies(self, params: dict[str, Any], backend: str) -> bool:
        """Whether the trial's precision takes a share (a quantized type)."""
        spec = self.space.specs[backend]
        return spec.applies(SHARE, str(params.get(f"{backend}.precision")))

    def _numerics(self, params: dict[str, Any], backend: str) -> tuple[Any, ...]:
        """What the drift depends on but the share: the backend's precision, runtime and options that change
        the numbers (not its scheduling ones, nor threads, instances, sequences or the allocator), so every
        layout of one type and options bisects together."""
        scheduling = set(self.space.specs[backend].options.scheduling())
        prefix = f"{backend}."
        return tuple(
            sorted(
                (k, repr(v))
                for k, v in params.items()
                if k.startswith(prefix) and k[len(prefix) :] not in scheduling and k != f"{prefix}{SHARE}"
            )
        )

    @staticmethod
    def _params(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        """A trial's parameters: a waiting one's are the fixed ones it was enqueued with."""
        fixed: dict[str, Any] = trial.system_attrs.get("fixed_params", trial.params)
        return fixed

    @staticmethod
    def _key(params: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sorted((k, repr(v)) for k, v in params.items()))

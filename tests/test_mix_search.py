"""The mix search's policy on a stored study: which share it enqueues next, given the trials' drift verdicts
(the trials here are stored records; tests/test_mixed_precision.py runs the search end to end)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autotune.records.attributes import Attr
from autotune.tuning.fleet import MAX_RETRIES, dead_orchestrator_cause, silent_worker_cause
from autotune.tuning.mix_search import MixBisection

SHARES = [1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]


class Space:
    """The part of a SearchSpace the mix search reads: each backend's listed values, and its spec."""

    def __init__(self, shares: list[float]) -> None:
        from autotune.backends import backend_specs

        self.backends = {"llamacpp": {"precision": ["Q4_0", "Q8_0", "F32"], "compressed_share": shares}}
        self.specs = backend_specs("generate")


def stored(
    study: optuna.study.Study,
    precision: str,
    share: float | None,
    drifted: bool | None,
    threads: int = 2,
    fail_cause: str | None = None,
    kv_cache_type: str | None = None,
) -> None:
    """A finished trial: pruned for drift (drifted), complete within the bound (not drifted), or failed (None)."""
    params = {"backend": "llamacpp", "llamacpp.precision": precision, "threads_per_instance": threads}
    distributions = {
        "backend": CategoricalDistribution(["llamacpp"]),
        "llamacpp.precision": CategoricalDistribution(["Q4_0", "Q8_0", "F32"]),
        "threads_per_instance": CategoricalDistribution([1, 2]),
    }
    attrs: dict = {}
    if kv_cache_type is not None:
        params["llamacpp.kv_cache_type"] = kv_cache_type
        distributions["llamacpp.kv_cache_type"] = CategoricalDistribution(["f16", "q8_0"])
    if share is not None:
        params["llamacpp.compressed_share"] = share
        distributions["llamacpp.compressed_share"] = CategoricalDistribution(SHARES)
        attrs[Attr.MIX_SHARE] = share
    if drifted:
        attrs[Attr.PRUNE_REASON] = "drift: kld drop 0.1 > max 0.05"
    if fail_cause:
        attrs[Attr.FAIL_CAUSE] = fail_cause
    states = {True: optuna.trial.TrialState.PRUNED, False: optuna.trial.TrialState.COMPLETE}
    state = states.get(drifted, optuna.trial.TrialState.FAIL)  # type: ignore[call-overload]
    value = 1.0 if state == optuna.trial.TrialState.COMPLETE else None
    trial = optuna.trial.create_trial(
        params=params, distributions=distributions, user_attrs=attrs, state=state, value=value
    )
    study.add_trial(trial)


def waiting(study: optuna.study.Study) -> list[dict]:
    """The enqueued trials' parameters (Optuna keeps a waiting trial's as its fixed parameters)."""
    return [t.system_attrs["fixed_params"] for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))]


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([(None, True)], 0.5),  # the whole-model file drifted: half first
        ([(None, True), (0.5, False)], 0.75),  # within at 0.5: above it
        ([(None, True), (0.5, True)], 0.25),  # beyond at 0.5: below it
        ([(None, True), (0.5, False), (0.75, True)], 0.625),
        ([(None, True), (0.5, False), (0.75, True), (0.625, True)], None),  # nothing listed between 0.5 and 0.625
        ([(None, True), (0.5, True), (0.25, True), (0.125, True)], None),  # no listed share below 0.125
        ([(None, False)], None),  # the whole-model file passes: nothing to search
    ],
)
def test_the_next_share_halves_the_interval_between_the_known_ends(history, expected):
    study = optuna.create_study(direction="maximize")
    for share, drifted in history:
        stored(study, "Q4_0", share, drifted)
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    enqueued = waiting(study)
    if expected is None:
        assert enqueued == []
    else:
        assert [p["llamacpp.compressed_share"] for p in enqueued] == [expected]
        assert enqueued[0]["llamacpp.precision"] == "Q4_0" and enqueued[0]["threads_per_instance"] == 2
        trial = study.get_trials(states=(optuna.trial.TrialState.WAITING,))[0]
        assert trial.user_attrs[Attr.MIX_SHARE] == expected and trial.user_attrs[Attr.ORDER].startswith("mix search")
        MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
        assert len(waiting(study)) == 1  # not enqueued twice


def test_a_type_without_shares_or_a_space_listing_one_share_is_left_alone():
    """F32 takes no share; a space that lists one share has nothing to bisect."""
    study = optuna.create_study(direction="maximize")
    stored(study, "F32", None, True)
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    assert waiting(study) == []
    stored(study, "Q4_0", None, True)
    MixBisection(Space([1.0]))(study)  # type: ignore[arg-type]
    assert waiting(study) == []


def test_a_failed_mix_trial_counts_as_past_the_bound_and_layouts_of_one_type_bisect_together():
    """A mix trial that failed cannot be the answer: the next share is below it, not the same one again. Two
    sampled trials of one type at other thread counts, both pruned for drift, start one bisection, not two."""
    study = optuna.create_study(direction="maximize")
    stored(study, "Q4_0", None, True, threads=2)
    stored(study, "Q4_0", None, True, threads=1)
    stored(study, "Q4_0", 0.5, None)
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    assert [p["llamacpp.compressed_share"] for p in waiting(study)] == [0.25]


SILENT = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={})


@pytest.mark.parametrize(
    "cause",
    [
        "budget ran out: timed out after 21s while preparing",
        "interrupted (Ctrl-C)",
        silent_worker_cause(SILENT, 60),
        dead_orchestrator_cause("a", 7),
    ],
)
def test_a_mix_trial_stopped_from_outside_runs_its_share_again(cause):
    """A share whose trial the search's budget, Ctrl-C, or its worker's death stopped says nothing of its
    drift: when the search resumes, the same share runs again, not the one below it."""
    study = optuna.create_study(direction="maximize")
    stored(study, "Q4_0", None, True)
    stored(study, "Q4_0", 0.5, None, fail_cause=cause)
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    assert [p["llamacpp.compressed_share"] for p in waiting(study)] == [0.5]


def test_no_mix_is_bisected_over_a_kept_type_that_breaks_the_bound_whole():
    """Q4_0's mix keeps its sensitive matrices in Q8_0: with the whole-model Q8_0 file pruned for drift, no
    share of Q4_0 can pass (share 0 is all Q8_0), so only Q8_0's own mix (over F16) is bisected."""
    study = optuna.create_study(direction="maximize")
    stored(study, "Q4_0", None, True)
    stored(study, "Q8_0", None, True)
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    assert [(p["llamacpp.precision"], p["llamacpp.compressed_share"]) for p in waiting(study)] == [("Q8_0", 0.5)]


def test_a_kept_type_pruned_with_other_numerics_does_not_stop_the_mix():
    """Q8_0 whole pruned with a q8_0 KV cache says nothing of Q4_0 over Q8_0 with an f16 cache: that mix is
    bisected; with the f16 cache's Q8_0 pruned too, it is not."""
    study = optuna.create_study(direction="maximize")
    stored(study, "Q4_0", None, True, kv_cache_type="f16")
    stored(study, "Q8_0", None, True, kv_cache_type="q8_0")
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    enqueued = {
        (p["llamacpp.precision"], p["llamacpp.kv_cache_type"], p["llamacpp.compressed_share"]) for p in waiting(study)
    }
    assert enqueued == {("Q4_0", "f16", 0.5), ("Q8_0", "q8_0", 0.5)}
    same = optuna.create_study(direction="maximize")  # the same numerics: Q4_0's mix cannot pass
    stored(same, "Q4_0", None, True, kv_cache_type="f16")
    stored(same, "Q8_0", None, True, kv_cache_type="f16")
    MixBisection(Space(SHARES))(same)  # type: ignore[arg-type]
    enqueued = {
        (p["llamacpp.precision"], p["llamacpp.kv_cache_type"], p["llamacpp.compressed_share"]) for p in waiting(same)
    }
    assert enqueued == {("Q8_0", "f16", 0.5)}


def test_a_mix_trial_still_running_is_neither_within_nor_beyond():
    """A share another worker is still measuring has no verdict: counting it as beyond the bound (as a failed
    one is) would enqueue the share below it, a trial wasted once it comes back within."""
    study = optuna.create_study(direction="maximize")
    stored(study, "Q4_0", None, True)
    bisection = MixBisection(Space(SHARES))  # type: ignore[arg-type]
    bisection(study)
    running = study.ask()  # the enqueued share 0.5, as a worker takes it
    for name, choices in (
        ("backend", ["llamacpp"]),
        ("llamacpp.precision", ["Q4_0", "F32"]),
        ("threads_per_instance", [1, 2]),
        ("llamacpp.compressed_share", SHARES),
    ):
        running.suggest_categorical(name, choices)
    assert running.params["llamacpp.compressed_share"] == 0.5 and Attr.MIX_SHARE in running.user_attrs
    bisection(study)
    assert waiting(study) == []


def test_a_share_whose_trials_lost_their_process_more_often_than_a_retry_allows_counts_as_past_the_bound():
    """A share whose trial lost its worker runs again, up to the fleet's retries; a third loss at the same
    share (a mix that kills its host, say) counts as past the bound, so the bisection goes below it rather
    than queueing it until the budget ends."""
    study = optuna.create_study(direction="maximize")
    stored(study, "Q4_0", None, True)
    for _ in range(MAX_RETRIES):
        stored(study, "Q4_0", 0.5, None, fail_cause=dead_orchestrator_cause("a", 7))
    MixBisection(Space(SHARES))(study)  # type: ignore[arg-type]
    assert [p["llamacpp.compressed_share"] for p in waiting(study)] == [0.5]
    again = optuna.create_study(direction="maximize")
    stored(again, "Q4_0", None, True)
    for _ in range(MAX_RETRIES + 1):
        stored(again, "Q4_0", 0.5, None, fail_cause=dead_orchestrator_cause("a", 7))
    MixBisection(Space(SHARES))(again)  # type: ignore[arg-type]
    assert [p["llamacpp.compressed_share"] for p in waiting(again)] == [0.25]

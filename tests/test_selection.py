"""Who may win: speed pruning against the best clean trial, noisy trials never win, ties go to the simpler config.

Real Optuna studies (in memory) with trials recorded as a search records them.
"""

from pathlib import Path

import optuna
import pytest
from conftest import measurement, trial_metrics

from autotune.measure.drift import Drift, DriftCriterion
from autotune.records.metrics import Screening, TrialMetrics
from autotune.results.best_json import choose_winner
from autotune.results.selection import complexity, select_winner, summarize_runs
from autotune.tuning.pruners import DriftPruner, SpeedPruner

EAGER = {"backend": "eager", "precision": "fp32", "batch_size": 8, "allocator": "glibc", "instances": 1}
OPENVINO = {"backend": "openvino", "precision": "int8", "batch_size": 8, "allocator": "tcmalloc", "instances": 2}
INDUCTOR = {"backend": "inductor", "precision": "bf16", "batch_size": 4, "allocator": "glibc", "instances": 1}


WITHIN_BOUND = Drift(relative_l2=0.001, cosine_similarity=1.0, top1_agreement=1.0, samples=8).to_json()


def full_metrics(throughput_sps: float) -> dict:
    """A completed trial's stored metrics, as the search records them."""
    return trial_metrics(throughput_sps).to_json()


def measured(ci_rel: float) -> dict:
    """A stored measurement whose throughput is known to `ci_rel`."""
    return measurement(ci_rel).to_json()


def completed(value: float, ci_rel: float = 0.01, valid: bool = True, **attrs) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        value=value,
        user_attrs={"valid": valid, "measurement": measured(ci_rel), **attrs},
    )


def study_with(*trials, direction: str = "maximize") -> optuna.study.Study:
    study = optuna.create_study(direction=direction, pruner=DriftPruner(DriftCriterion(), wrapped=SpeedPruner()))
    for trial in trials:
        study.add_trial(trial)
    return study


def screened(study: optuna.study.Study, value: float, ci_rel: float | None = 0.02, **attrs) -> bool:
    trial = study.ask()
    trial.set_user_attr("drift", WITHIN_BOUND)  # measured at the ready barrier, before any screening
    trial.set_user_attr("screening", Screening(throughput_sps=value, p50_ms=1.0, ci_rel=ci_rel, calls=10).to_json())
    for key, val in attrs.items():
        trial.set_user_attr(key, val)
    trial.report(value, step=0)
    return trial.should_prune()


def test_clearly_slower_screening_is_pruned_a_close_one_is_not():
    study = study_with(completed(10.0), completed(40.0, ci_rel=0.02))
    assert screened(study, 20.0) is True  # half the best: clearly worse
    assert screened(study, 35.0) is False  # 12.5% slower: within the 15% minimum margin
    assert screened(study, 30.0, ci_rel=0.3) is False  # a very uncertain screening is not trusted
    assert screened(study, 20.0, ci_rel=None) is False  # too few calls for a CI: half the best is not proof
    assert screened(study, 5.0, ci_rel=None) is True  # but 8x slower is


def test_a_noisy_bar_widens_the_gap_that_prunes_but_never_closes_it():
    """A best clean trial whose interval is ±19% (a sub-millisecond model on a shared machine) and a
    screening too short for an interval: the noise widens the gap as factors, 3 x 1.38 = 4.14x. Added into
    one relative margin (2 x (0.33 + 0.19) = 104%) it asked for more than the whole bar, so a config 55
    times slower completed; the drift evaluation's speed gate had no floor either."""
    from autotune.tuning.pruners import GATE_SHARE

    study = study_with(completed(4000.0, ci_rel=0.19))
    assert screened(study, 73.0, ci_rel=None) is True  # 55x slower
    assert screened(study, 900.0, ci_rel=None) is True and screened(study, 1000.0, ci_rel=None) is False
    assert screened(study, 2500.0, ci_rel=0.02) is True and screened(study, 3000.0, ci_rel=0.02) is False
    gate = SpeedPruner().drift_gate(study, batch_size=4, instances=2)
    assert gate is not None and gate.min_samples_per_s == pytest.approx(4000.0 / (3 * 1.38) * GATE_SHARE / 2)


def test_noisy_best_does_not_set_the_bar_and_the_baseline_is_never_pruned():
    study = study_with(completed(10.0), completed(100.0, valid=False))
    assert screened(study, 9.0) is False  # the 100 was flagged noisy; 9 vs the clean 10 is within the margin
    assert screened(study, 2.0, baseline=True) is False


def test_latency_objective_prunes_slower_calls():
    study = study_with(completed(10.0), direction="minimize")
    assert screened(study, 15.0) is True and screened(study, 10.5) is False


def test_drift_pruner_still_decides_first():
    study = study_with(completed(10.0))
    trial = study.ask()
    trial.set_user_attr("drift", Drift(relative_l2=0.5, cosine_similarity=0.9, top1_agreement=0.8, samples=8).to_json())
    assert trial.should_prune() is True  # before any screening value exists


def test_a_noisy_measurement_never_wins():
    study = study_with(completed(50.0, valid=False, config=OPENVINO), completed(20.0, config=EAGER))
    winner, record, why = choose_winner(study)
    assert winner.value == 20.0 and record is None and "clean" in why


def test_clear_win_goes_to_the_fastest():
    candidates = [
        {"trial": 1, "config": EAGER, "summary": summarize_runs([20.0, 20.2, 19.9], [0.01])},
        {"trial": 2, "config": OPENVINO, "summary": summarize_runs([30.0, 30.5, 29.8], [0.01])},
    ]
    index, why = select_winner(candidates, maximize=True)
    assert candidates[index]["trial"] == 2 and why.startswith("beats the runner-up by")


def test_tie_within_noise_goes_to_the_simpler_config():
    candidates = [
        {"trial": 1, "config": OPENVINO, "summary": summarize_runs([30.0, 33.0, 27.0], [0.02])},  # +-10% spread
        {"trial": 2, "config": INDUCTOR, "summary": summarize_runs([29.0, 29.5, 28.5], [0.02])},
    ]
    index, why = select_winner(candidates, maximize=True)
    assert candidates[index]["trial"] == 2 and "simpler config wins" in why
    assert complexity(INDUCTOR) < complexity(OPENVINO) and complexity(EAGER) < complexity(INDUCTOR)


def test_latency_finalists_pick_the_lowest_median():
    candidates = [
        {"trial": 1, "config": EAGER, "summary": summarize_runs([12.0, 12.1, 11.9], [0.01])},
        {"trial": 2, "config": OPENVINO, "summary": summarize_runs([6.0, 6.1, 5.9], [0.01])},
    ]
    assert select_winner(candidates, maximize=False)[0] == 1


def test_no_clean_finalist_is_an_error():
    with pytest.raises(ValueError):
        select_winner([{"trial": 1, "config": EAGER, "summary": summarize_runs([], [])}], maximize=True)


def test_a_noisy_runner_up_does_not_tie_when_every_run_of_the_best_beat_it():
    candidates = [
        {"trial": 37, "config": OPENVINO, "summary": summarize_runs([93.4, 92.0, 91.7], [0.01])},
        {
            "trial": 8,
            "config": INDUCTOR,
            "summary": summarize_runs([88.0, 85.2, 69.9], [0.01]),
        },  # one slow run: 10% noise
    ]
    index, why = select_winner(candidates, maximize=True)
    assert candidates[index]["trial"] == 37 and why.startswith("beats the runner-up")


def test_best_json_says_whether_the_winner_meets_the_bound_instead_of_assuming_it():
    from autotune.results.best_json import build_best

    beyond = Drift(relative_l2=0.3, cosine_similarity=0.9, top1_agreement=0.5, samples=8).to_json()
    for drift, meets in ((WITHIN_BOUND, True), (beyond, False), (None, False)):
        attrs = {"config": EAGER} | ({"drift": drift} if drift else {})
        trial = optuna.trial.create_trial(value=10.0, user_attrs={**full_metrics(10.0), **attrs})
        study = study_with(trial)
        study.set_user_attr("spec", {"drift_metric": "relative_l2", "max_drift": 0.05})
        assert build_best(study, Path("best.json")).meets_drift is meets


def test_a_finalist_with_one_clean_run_of_three_cannot_win():
    from autotune.results.selection import decide

    def run(value: float, valid: bool = True) -> dict:
        return {"value": value, "valid": valid, "ci_rel": 0.01, "noise_flags": [] if valid else ["spread"]}

    record = {
        "repeats": 3,
        "candidates": [
            {
                "trial": 1,
                "config": OPENVINO,
                "candidate": True,
                "runs": [run(90.0), run(50.0, False), run(40.0, False)],
            },
            {"trial": 2, "config": INDUCTOR, "candidate": True, "runs": [run(60.0), run(61.0), run(59.0)]},
        ],
    }
    decided = decide(record, maximize=True)
    assert decided["winner_trial"] == 2  # 90 from one clean run proves nothing
    assert decided["candidates"][0]["summary"]["eligible"] is False


def test_a_config_that_won_every_interleaved_round_beyond_the_paired_noise_is_not_a_tie():
    """The finalist runs of a 20-minute mobilenet_v3_large search on a shared AVX2 EPYC (study m20b):
    the first round ran slow for everyone (the baseline too: 50.3 against 76.3 and 67.8), so each
    candidate's own spread (12-14%) hid an 8% gap; two one-thread instances won every round (by 17.5%,
    2.2% and 8.1%), and side by side they were 8-10% faster than the simpler one-instance config."""
    from autotune.results.selection import decide

    def run(value: float, ci_rel: float) -> dict:
        return {"value": value, "valid": True, "ci_rel": ci_rel, "noise_flags": []}

    two_by_one = OPENVINO | {"backend": "onnxruntime", "precision": "fp32", "allocator": "glibc"}
    one_by_two = two_by_one | {"instances": 1}
    record = {
        "repeats": 3,
        "candidates": [
            {
                "trial": 55,
                "config": two_by_one,
                "candidate": True,
                "runs": [run(v, 0.02) for v in (230.8, 270.2, 265.5)],
            },
            {
                "trial": 5,
                "config": one_by_two,
                "candidate": True,
                "runs": [run(v, 0.02) for v in (196.5, 264.3, 245.7)],
            },
            {
                "trial": 0,
                "config": EAGER,
                "candidate": False,
                "baseline": True,
                "runs": [run(v, 0.05) for v in (50.3, 76.3, 67.8)],
            },
        ],
    }
    decided = decide(record, maximize=True)
    assert decided["winner_trial"] == 55, decided["selection"]
    assert "each of 3 interleaved rounds" in decided["selection"]
    assert decided["candidates"][1]["summary"]["rounds"] == [196.5, 264.3, 245.7]

    # The same medians, but the simpler config won one round: a tie, and the simpler config wins it.
    record["candidates"][1]["runs"] = [run(v, 0.02) for v in (196.5, 272.0, 245.7)]
    assert decide(record, maximize=True)["winner_trial"] == 5
    # Won every round, but by gains that spread wider than their median: still a tie.
    record["candidates"][1]["runs"] = [run(v, 0.02) for v in (150.0, 268.0, 245.7)]
    assert decide(record, maximize=True)["winner_trial"] == 5


def test_paired_rounds_skip_a_round_either_side_lost_and_follow_the_direction():
    from autotune.results.selection import paired_ratios, paired_win

    fast = summarize_runs([10.0, 11.0, 10.5], [0.01], rounds=[10.0, None, 11.0, 10.5])
    slow = summarize_runs([12.0, 11.0, 12.0], [0.01], rounds=[12.0, 12.5, None, 12.0])  # latency, ms
    assert paired_ratios(fast, slow, maximize=False) == [1.2, 12.0 / 10.5]  # two shared rounds only
    assert paired_win(fast, slow, maximize=False) is None  # fewer than three rounds prove nothing
    fast["rounds"].append(10.0)
    slow["rounds"].append(11.5)
    gain, noise = paired_win(fast, slow, maximize=False) or (0.0, 0.0)
    assert gain > noise > 0.0


def test_each_finalist_round_starts_one_entry_later_and_run_k_is_round_k():
    """The paired comparison reads run k of every entry as round k; a fixed order would hand one entry
    the same place (say, right after the baseline) in every round and call that effect a win."""
    from autotune.results.selection import interleaved_schedule

    schedule = interleaved_schedule(["A", "B", "C"], 3)
    assert [entry for _, entry in schedule] == list("ABCBCACAB")
    for entry in "ABC":
        rounds = [r for r, e in schedule if e == entry]
        assert rounds == [0, 1, 2]  # one run per round, in round order
        assert len({[e for r2, e in schedule if r2 == r].index(entry) for r in rounds}) == 3  # three places


def test_a_finalist_run_may_take_a_few_times_its_trial_but_not_the_rest_of_the_budget():
    from autotune.tuning.finalists import finalist_timeout

    assert 40.0 * 2 < finalist_timeout(40.0, 600.0) <= 150.0  # a slow round passes, a hang ends early
    assert finalist_timeout(400.0, 600.0) == 600.0  # never beyond the trial timeout
    assert finalist_timeout(5.0, 600.0) >= 30.0  # a short trial still gets time to start


def test_ipex_has_its_place_in_the_simplicity_order():
    ipex = {**INDUCTOR, "backend": "ipex"}
    assert complexity(INDUCTOR) < complexity(ipex) < complexity({**INDUCTOR, "backend": "onnxruntime"})


def test_verify_and_bench_medians_leave_noisy_runs_out():
    from autotune.remeasure.bench import BenchRun, median_throughput
    from autotune.remeasure.verify import judge

    assert median_throughput([BenchRun(100.0), BenchRun(10.0, valid=False), BenchRun(102.0)]) == 101.0
    assert median_throughput([BenchRun(10.0, valid=False)]) is None
    clean, noisy = TrialMetrics.from_json(full_metrics(100.0)), TrialMetrics.from_json(full_metrics(10.0))
    noisy = noisy.with_changes(valid=False)
    verdict, here, _ = judge(100.0, [clean, noisy, noisy], recorded_ci=0.01)
    assert verdict == "matches" and here == 100.0
    assert judge(100.0, [noisy], recorded_ci=0.01)[:2] == ("no verdict", None)


def test_a_noisy_trial_ahead_of_the_best_clean_one_gets_a_place_in_the_finalist_round():
    from autotune.tuning.finalists import pick_candidates

    fast_but_flagged = completed(150.0, valid=False, config_summary="openvino int8")
    study = study_with(completed(100.0, config_summary="eager"), fast_but_flagged, completed(90.0, valid=False))
    picked = [t.value for t in pick_candidates(study, count=3)]
    assert picked == [100.0, 150.0]  # the flagged 90 is behind the best clean trial: no second chance
    study.add_trial(completed(95.0, config_summary="inductor"))
    # right after the best clean one: a round too short for every candidate keeps those first
    assert [t.value for t in pick_candidates(study, count=3)] == [100.0, 150.0, 95.0]


def test_the_finalist_round_takes_only_the_candidates_whose_every_round_fits_the_time_left():
    """vit_b_16 on 2 cores: runs of 40-50 s and a 60-s baseline, 3 rounds, 300 s left. Three candidates
    would need 3 x 197 s; cut after two rounds, their 5% gap is within the noise and the simpler config
    wins the tie. One candidate and the baseline fit all three rounds."""
    from autotune.tuning.finalists import candidates_that_fit

    assert candidates_that_fit([40.0, 47.0, 50.0], 60.0, 3, 300.0) == 1
    assert candidates_that_fit([40.0, 47.0, 50.0], 60.0, 3, 450.0) == 2
    assert candidates_that_fit([40.0, 47.0, 50.0], 60.0, 3, 600.0) == 3
    assert candidates_that_fit([40.0, 47.0, 50.0], 0.0, 3, 270.0) == 2  # no baseline in the study
    # never none: the best one is re-measured for as many rounds as the budget allows
    assert candidates_that_fit([40.0, 47.0], 60.0, 3, 10.0) == 1
    assert candidates_that_fit([], 60.0, 3, 10.0) == 0


def test_the_decision_says_which_candidates_the_round_left_out():
    """vit20b on the AVX2 EPYC: one candidate fit its three rounds; the reason must not read as if the
    others had been measured and flagged."""
    from autotune.results.selection import decide

    runs = [{"value": v, "valid": True, "ci_rel": 0.02} for v in (5.77, 5.2, 5.6)]
    record = {
        "left_out": [3, 1],
        "candidates": [
            {"trial": 2, "config": OPENVINO, "candidate": True, "baseline": False, "search_value": 6.0, "runs": runs}
        ],
    }
    decided = decide(record, maximize=True)
    assert decided["winner_trial"] == 2
    assert decided["selection"] == (
        "the only candidate re-measured; left out, their rounds would not fit the time left: #3, #1"
    )


def test_a_finalist_run_is_estimated_without_the_drift_evaluation_and_the_preparation_it_reuses():
    """vit20's ONNX Runtime int8 trial #1: 104 s in the search, 54 s of it quantizing and 11 s starting
    with its drift evaluation; its finalist runs took about 40 s. Built on another host of a fleet, the
    artifact may be missing here, so the preparation counts again."""
    import socket

    from autotune.tuning.finalists import START_S, finalist_run_s

    budget = {"total_s": 104.4, "preparing_s": 54.2, "starting_s": 11.0, "loading_s": 2.7, "warmup_s": 11.8}
    here = completed(4.6, budget={**budget, "screening_s": 3.6, "measuring_s": 21.0}, host=socket.gethostname())
    assert finalist_run_s(here) == pytest.approx(104.4 - 54.2 - 11.0 + START_S)
    elsewhere = completed(4.6, budget=here.user_attrs["budget"], host="another-host")
    assert finalist_run_s(elsewhere) == pytest.approx(104.4 - 11.0 + START_S)


def test_a_run_of_the_round_goes_ahead_when_the_estimate_the_round_was_sized_with_fits():
    """vit20's trial #1 again, 104 s in the search of which 54 s preparing and 11 s starting with its drift
    evaluation: its run is estimated at 44 s. With 47 s left it runs; the trial's 50 s of wall time without
    the preparation would have stopped the round before it, on fewer runs than the round was sized for."""
    import datetime
    import socket

    from autotune.tuning.finalists import finalist_run_s, run_fits

    budget = {"total_s": 104.4, "preparing_s": 54.2, "starting_s": 11.0, "loading_s": 2.7, "warmup_s": 11.8}
    trial = completed(4.6, budget=budget, host=socket.gethostname(), prepare_s=54.2)
    trial.datetime_start = datetime.datetime(2026, 11, 26, 3, 8, 0)
    trial.datetime_complete = trial.datetime_start + datetime.timedelta(seconds=104.4)
    assert finalist_run_s(trial) == pytest.approx(44.2)
    assert run_fits(trial, 47.0) and run_fits(trial, 44.2)
    assert not run_fits(trial, 44.0)


def test_the_baseline_runs_every_finalist_round_and_is_never_left_out():
    """When the baseline is itself among the top clean trials, it runs in every round anyway (for the
    speedup): it keeps its place, takes no other candidate's and is never named as left out."""
    from autotune.tuning.finalists import fit_round, pick_candidates

    def run_of(seconds: float) -> dict:
        return {"total_s": seconds, "preparing_s": 0.0, "starting_s": 5.0}

    best = completed(120.0, config_summary="ov", budget=run_of(40.0))
    baseline = completed(100.0, config_summary="eager", baseline=True, budget=run_of(60.0))
    third = completed(99.0, config_summary="ort", budget=run_of(50.0))
    study = study_with(best, baseline, third)
    picked = pick_candidates(study, count=3)
    assert [t.value for t in picked] == [120.0, 100.0, 99.0]
    baseline_trial = study.trials[1]
    kept, left_out = fit_round(picked, baseline_trial, 3, 300.0)  # 3 x (40 + 60) fits; 3 x (90 + 60) not
    assert [t.value for t in kept] == [120.0, 100.0] and [t.value for t in left_out] == [99.0]
    kept, left_out = fit_round(picked, baseline_trial, 3, 450.0)
    assert [t.value for t in kept] == [120.0, 100.0, 99.0] and left_out == []


def test_the_first_thing_read_is_the_revalidated_winner_not_its_single_measurement():
    from autotune.results.leaderboard import winner_lines
    from autotune.results.selection import decide

    study = study_with(completed(204.7, config_summary="openvino int8"), completed(22.0, baseline=True))
    runs = [{"value": v, "valid": True, "ci_rel": 0.01} for v in (189.8, 187.0, 191.5)]
    base_runs = [{"value": v, "valid": True, "ci_rel": 0.01} for v in (22.0, 22.3, 21.8)]
    record = {
        "repeats": 3,
        "last_trial": 1,
        "candidates": [
            {"trial": 0, "config": OPENVINO, "candidate": True, "baseline": False, "search_value": 204.7, "runs": runs},
            {
                "trial": 1,
                "config": EAGER,
                "candidate": False,
                "baseline": True,
                "search_value": 22.0,
                "runs": base_runs,
            },
        ],
    }
    study.set_user_attr("finalists", decide(record, maximize=True))
    first = winner_lines(study)[0]
    assert first.startswith("winner: trial 0 openvino int8: 189.8 samples/s re-measured (median of 3 clean runs of 3")
    assert "8.63x the baseline re-measured alike" in first and "search measurement was 204.7" in first


def launched(
    state: str, backend: str, precision: str, instances: int = 1, threads: int = 2, **attrs
) -> optuna.trial.FrozenTrial:
    """A finished trial the orchestrator launched (it split the trial's time: `budget`)."""
    config = {"backend": backend, "precision": precision, "batch_size": 8, "instances": instances}
    attrs = {"fallback_key": "static", "drift_reference": "ref", "host": "here", **attrs}
    return optuna.trial.create_trial(
        state=getattr(optuna.trial.TrialState, state),
        value=1.0 if state == "COMPLETE" else None,
        user_attrs={"config": {**config, "threads_per_instance": threads}, "budget": {"total_s": 60.0}, **attrs},
    )


def gated(pace: float, floor: float = 0.8) -> dict:
    gate = {"min_samples_per_s": floor, "after_s": 10.0, "basis": "test"}
    return {"too_slow": {"samples": 8, "seconds": 12.0, "samples_per_s": pace, "gate": gate}}


def drifted(relative_l2: float, **attrs) -> dict:
    drift = Drift(relative_l2=relative_l2, cosine_similarity=0.9, top1_agreement=0.9, samples=8).to_json()
    return {"drift": drift, "prune_reason": f"drift: relative_l2 drop {relative_l2} > max 0.05", **attrs}


def test_a_family_whose_every_launched_trial_lost_by_far_is_not_launched_again():
    """vit_b_16 on an AVX2-only EPYC, best 5.66 samples/s as 2 x 1 (2.83 per core): inductor bf16 stopped
    by the speed gate at 0.428 as 1 x 2 (0.214 per core; its floor was 0.86: the gate's floor alone only
    says slower), torchao int8 pruned at five times the drift bound. A narrow loss, a loss on fewer cores
    that per core is not one, a drift of other numerics or against another reference, a completed or
    failed trial, another family's, a later trial's or another host's outcome, or none at all leave the
    family to the sampler."""
    from autotune.tuning.hopeless import Proposal, hopeless_family

    bound = DriftCriterion()
    config = {"backend": "onnxruntime", "precision": "int8", "batch_size": 4, "instances": 2, "threads_per_instance": 1}
    best = completed(5.66, config=config)
    bf16 = Proposal("inductor", "bf16", "static", "ref")

    def verdict(*trials, before: int = 99, objective: str = "throughput", proposal=bf16, host=None) -> str | None:
        return hopeless_family(study_with(best, *trials), proposal, bound, objective, before, host)

    lost = verdict(launched("PRUNED", "inductor", "bf16", **gated(0.428, 0.86)))
    assert (
        lost is not None and "#1 ran 0.214 samples/s per core in its drift evaluation against the best's 2.83" in lost
    )
    # one thread at 0.8 is 0.8 per core (28% of the best's): not lost by far, though 14% of its 5.66
    assert verdict(launched("PRUNED", "inductor", "bf16", threads=1, **gated(0.8))) is None
    assert verdict(launched("PRUNED", "inductor", "bf16", **gated(1.5, 2.2))) is None  # under the floor, not far
    assert verdict(launched("PRUNED", "inductor", "bf16", **gated(0.43)), objective="server") is None
    assert verdict(launched("PRUNED", "inductor", "bf16", **gated(0.43)), host="here") is not None
    assert verdict(launched("PRUNED", "inductor", "bf16", **gated(0.43)), host="elsewhere") is None
    assert verdict(launched("PRUNED", "inductor", "bf16", **gated(0.4)), before=1) is None
    assert (
        verdict(launched("PRUNED", "inductor", "bf16", **gated(0.4)), launched("COMPLETE", "inductor", "bf16")) is None
    )
    assert verdict(launched("PRUNED", "inductor", "bf16", **gated(0.4)), launched("FAIL", "inductor", "bf16")) is None
    # the whole trial timeout spent before anything was timed is lost by far; a budget running out is not
    timed_out = launched("FAIL", "inductor", "bf16", fail_cause="timed out after 600s while preparing")
    assert "#1 timed out after 600s while preparing" in (verdict(timed_out) or "")
    cut_short = launched("FAIL", "inductor", "bf16", fail_cause="budget ran out: timed out after 377s while preparing")
    assert verdict(cut_short) is None
    baseline = launched("FAIL", "inductor", "bf16", fail_cause="timed out after 600s while preparing", baseline=True)
    assert verdict(baseline) is None  # the baseline's untuned settings are not the family's
    assert verdict(launched("PRUNED", "inductor", "fp32", **gated(0.4))) is None
    unlaunched = optuna.trial.create_trial(
        state=optuna.trial.TrialState.PRUNED, user_attrs={"config": {"backend": "inductor", "precision": "bf16"}}
    )
    assert verdict(unlaunched) is None
    # drift: the same numerics (fallback key) against the same reference only
    both = verdict(
        launched("PRUNED", "inductor", "bf16", **drifted(0.242)), launched("PRUNED", "inductor", "bf16", **gated(0.4))
    )
    assert both is not None and "#1 drifted 0.242 relative_l2 against the bound 0.05" in both
    assert verdict(launched("PRUNED", "inductor", "bf16", **drifted(0.08))) is None  # under twice the bound
    dynamic = Proposal("inductor", "bf16", "dynamic", "ref")
    assert verdict(launched("PRUNED", "inductor", "bf16", **drifted(0.242)), proposal=dynamic) is None
    assert verdict(launched("PRUNED", "inductor", "bf16", **drifted(0.242, drift_reference="older"))) is None


def test_a_weight_only_family_lost_by_far_with_fp32_activations_is_still_launched_with_bf16_ones():
    """fp32 activations take torchao's CPU int4 kernel's slow path (35x fewer tokens/s than bf16 ones on a
    Xeon with AMX): an eager int4 trial that ran out its trial timeout with them says nothing of a proposal
    with bf16 ones, and a recorded config without the option ran fp32 (before it was one)."""
    from autotune.tuning.hopeless import Proposal, hopeless_family, precision_variant_of

    def int4(activations: str | None) -> optuna.trial.FrozenTrial:
        trial = launched("FAIL", "eager", "woq_int4", fail_cause="timed out after 600s while preparing")
        options = {"group_size": 128} | ({"activations": activations} if activations else {})
        config = {**trial.user_attrs["config"], "options": options}
        return optuna.trial.create_trial(state=trial.state, user_attrs={**trial.user_attrs, "config": config})

    best = completed(300.0, config={"backend": "inductor", "precision": "bf16", "batch_size": 8, "instances": 2})
    for recorded in (int4("fp32"), int4(None)):
        assert precision_variant_of(recorded.user_attrs["config"]) == "woq_int4/fp32"
        study = study_with(best, recorded)
        bf16 = Proposal("eager", "woq_int4/bf16", "static", "ref")
        assert hopeless_family(study, bf16, DriftCriterion(), "throughput", 99) is None
        fp32 = Proposal("eager", "woq_int4/fp32", "static", "ref")
        assert "every eager woq_int4/fp32 trial so far lost by far" in (
            hopeless_family(study, fp32, DriftCriterion(), "throughput", 99) or ""
        )


def test_lost_by_far_minimising_latency_compares_the_work_per_core():
    """The latency objective's value is ms per call: 8 samples a call at 0.43 samples/s on 2 threads is
    0.215 samples/s per core, lost by far against a best of 5.66 ms per call of 4 samples on 2 threads
    (353 per core), not against one of 5 s (0.4 per core)."""
    from autotune.tuning.hopeless import Proposal, hopeless_family

    config = {"backend": "onnxruntime", "precision": "int8", "batch_size": 4, "instances": 1, "threads_per_instance": 2}
    slow = launched("PRUNED", "inductor", "bf16", **gated(0.43))
    proposal = Proposal("inductor", "bf16", "static", "ref")
    for best_ms, lost in ((5.66, True), (5000.0, False)):
        study = study_with(completed(best_ms, config=config), slow, direction="minimize")
        assert (hopeless_family(study, proposal, DriftCriterion(), "latency", 99) is not None) is lost, best_ms


def test_a_prior_studys_baseline_says_nothing_of_its_family_only_its_other_trials_do():
    """read_prior ranks each family by its best clean trial against the earlier study's baseline; the
    baseline itself is 1.00x by definition and would put eager fp32 ahead of every ISA tier (tier -1,
    "beat its baseline"), so it is left out: eager fp32 counts only through its other trials."""
    from autotune.tuning.priors import read_prior

    hardware = {"model_name": "a CPU", "physical_cores": 2}
    storage = optuna.storages.InMemoryStorage()
    earlier = optuna.create_study(study_name="earlier", storage=storage, direction="maximize")
    earlier.set_user_attr("fingerprint", {"hardware": hardware})
    earlier.set_user_attr("spec", {"task": "classify", "objective": "throughput"})

    def trial(value: float, config: dict, **attrs) -> optuna.trial.FrozenTrial:
        return completed(value, **full_metrics(value), config=config, **attrs)

    earlier.add_trial(trial(10.0, EAGER, baseline=True))
    earlier.add_trial(trial(30.0, OPENVINO))
    prior = read_prior([storage], "later", hardware, "classify")
    assert prior.family_speedups == {("openvino", "int8"): (3.0, "earlier")}
    earlier.add_trial(trial(12.0, {**EAGER, "batch_size": 4}))
    assert read_prior([storage], "later", hardware, "classify").family_speedups[("eager", "fp32")] == (1.2, "earlier")


def test_a_prior_winner_with_weight_only_int8_is_enqueued_with_the_activations_it_ran():
    """A language model's weight-only winner from before `activations` was an option ran fp32 activations:
    it is enqueued with them (Optuna would sample the missing value, and bf16 ones run other kernels),
    and its speed does not rank the family, whose coverage trial now runs another kernel path."""
    from autotune.tuning.priors import read_prior

    hardware = {"model_name": "a CPU", "physical_cores": 2}
    storage = optuna.storages.InMemoryStorage()
    earlier = optuna.create_study(study_name="earlier", storage=storage, direction="maximize")
    earlier.set_user_attr("fingerprint", {"hardware": hardware})
    earlier.set_user_attr("spec", {"task": "generate", "objective": "throughput"})
    base = {"backend": "eager", "precision": "fp32", "batch_size": 1, "instances": 1, "threads_per_instance": 2}
    earlier.add_trial(completed(10.0, **full_metrics(10.0), config=base, baseline=True))
    winner = {**base, "backend": "inductor", "precision": "woq_int8", "options": {"freezing": True}}
    params = {"backend": "inductor", "inductor.precision": "woq_int8", "inductor.freezing": True}
    distributions = {
        "backend": optuna.distributions.CategoricalDistribution(["eager", "inductor"]),
        "inductor.precision": optuna.distributions.CategoricalDistribution(["woq_int8", "bf16"]),
        "inductor.freezing": optuna.distributions.CategoricalDistribution([True, False]),
    }
    earlier.add_trial(
        optuna.trial.create_trial(
            value=20.0,
            params=params,
            distributions=distributions,
            user_attrs={
                "valid": True,
                "measurement": {"throughput_ci_rel": 0.01},
                "config": winner,
                **full_metrics(20.0),
            },
        )
    )
    prior = read_prior([storage], "later", hardware, "generate")
    assert prior.winners and prior.winners[0][0] == {**params, "inductor.activations": "fp32"}
    assert ("inductor", "woq_int8") not in prior.family_speedups


def generation_study(*trials) -> optuna.study.Study:
    study = study_with(*trials)
    study.set_user_attr("spec", {"task": "generate", "objective": "throughput", "generation": {"sequences": "total"}})
    return study


def at(total: int, instances: int, value: float, **attrs) -> optuna.trial.FrozenTrial:
    """A completed generation trial of `total` sequences in all, as `instances` instances."""
    config = {**EAGER, "batch_size": total // instances, "instances": instances, "threads_per_instance": 1}
    return completed(value, config=config, config_summary=f"{total} as {instances}", **attrs)


def test_a_generation_trial_is_pruned_against_the_best_of_its_own_total_sequences():
    """More sequences make more tokens/s: a trial of one sequence is another workload than one of eight, and
    is compared with the best trial of one sequence (on the old rule, the best of all: pruned by 5x)."""
    from autotune.results.selection import best_by_total, clean_trials

    study = generation_study(at(8, 1, 500.0), at(1, 1, 100.0), at(8, 2, 450.0))
    config = {**EAGER, "batch_size": 1, "instances": 1, "threads_per_instance": 1}
    assert not screened(study, 95.0, config=config)  # close to the best at one sequence
    assert screened(study, 60.0, config=config)  # clearly slower than it
    assert [t.value for t in clean_trials(study, total=8)] == [500.0, 450.0]
    assert {total: t.value for total, t in best_by_total(study).items()} == {1: 100.0, 8: 500.0}
    classify = study_with(completed(500.0, config=EAGER), completed(100.0, config={**EAGER, "batch_size": 1}))
    assert screened(classify, 95.0, config={**EAGER, "batch_size": 1})  # a classifier's batches all compare


def test_a_generation_studys_finalists_run_the_leading_total_only():
    """The finalist round compares like for like: the leader's total sequences, whatever split."""
    from autotune.tuning.finalists import pick_candidates

    study = generation_study(at(8, 1, 500.0), at(1, 1, 490.0), at(8, 2, 450.0), at(4, 2, 480.0))
    assert [t.value for t in pick_candidates(study, count=3)] == [500.0, 450.0]


def test_a_prior_generation_winner_is_enqueued_at_the_total_it_ran():
    """A study stored when sequences counted per instance held 4 for 2 x 4: enqueued as 8 in all."""
    from autotune.records.config import TrialConfig
    from autotune.tuning.priors import as_measured

    config = TrialConfig.from_json({**EAGER, "batch_size": 4, "instances": 2, "threads_per_instance": 1})
    params = {"backend": "eager", "eager.precision": "fp32", "sequences": 4, "instances": 2}
    assert as_measured(dict(params), config)["sequences"] == 8

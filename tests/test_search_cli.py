"""The real CLI end to end: studies in SQLite, resume, drift pruning, failures, export, bad input."""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from conftest import (
    AUTOTUNE,
    NOISY_REFUSAL,
    assert_trials_ran,
    load_study,
    require,
    states,
    tiny,
    write_space,
)

from autotune.records.config import TrialConfig
from autotune.results.selection import clean_trials


def test_search_completes_trials_and_exports_best_json(searcher, workdir):
    space = write_space(workdir / "space.yaml", allocator=["glibc", "jemalloc"], batch_size=[2, 4, 8])
    result = searcher.search("--finalists", "2", "--finalist-repeats", "2", "--no-speed-pruning", space=space, trials=4)
    assert result.returncode == 0, result.stderr
    assert "RANDOM INIT" in result.stdout and "wrote" in result.stdout
    study = load_study(workdir, "s")
    assert states(study).count("COMPLETE") == 4
    pids = [pid for t in study.trials for pid in t.user_attrs["pids"]]
    assert len(set(pids)) == 4 and os.getpid() not in pids  # each trial in its own fresh process
    for trial in study.trials:
        for key in ("throughput_sps", "latency_ms", "drift", "peak_rss_mib", "load_s", "first_call_s", "config"):
            assert key in trial.user_attrs, key
    assert study.trials[0].user_attrs["baseline"] is True and study.trials[0].params["backend"] == "eager"
    # Where each trial's time went, on the orchestrator's clock: the parts add up to the trial's time.
    for trial in study.trials:
        budget = trial.user_attrs["budget"]
        parts = sum(v for k, v in budget.items() if k != "total_s")
        assert budget["measuring_s"] > 0 and budget["loading_s"] > 0 and budget["screening_s"] == 0  # no screening
        assert parts == pytest.approx(budget["total_s"], rel=1e-6)
        wall = (trial.datetime_complete - trial.datetime_start).total_seconds()
        assert budget["total_s"] <= wall
    assert study.trials[1].user_attrs["order"].startswith("sampled by")  # no coverage round: one backend
    shown = searcher("show", "--study", "s")
    assert "where the time went" in shown.stdout and "measuring" in shown.stdout and "finalists" in shown.stdout

    best = json.loads((workdir / "studies" / "s" / "best.json").read_text())
    assert best["schema"] == "autotune.best/2"
    # The winner comes from the finalist round: the top 2 clean configs (and the baseline) re-measured twice each.
    finalists = best["finalists"]
    candidates = [c for c in finalists["candidates"] if c["candidate"]]
    assert len(candidates) == 2 and finalists["repeats"] == 2 and any(c["baseline"] for c in finalists["candidates"])
    for c in finalists["candidates"]:  # each summary is computed from the clean runs it lists
        clean = [r["value"] for r in c["runs"] if r["valid"]]
        assert len(c["runs"]) == 2 and c["clean_runs"] == len(clean)
        assert c["median"] == (statistics.median(clean) if clean else None)
    (winner,) = [c for c in candidates if c["winner"]]
    assert winner["trial"] == best["study"]["trial"] and best["selection"].startswith("finalists: ")
    assert best["objective"]["revalidated_median"] == winner["median"]
    (baseline,) = [c for c in finalists["candidates"] if c["baseline"]]
    assert best["speedup_vs_baseline"] == pytest.approx(winner["median"] / baseline["median"])
    assert "interleaved" in best["speedup_source"]
    assert best["fingerprint"]["hardware"]["physical_cores"] >= 1
    measurement = best["metrics"]["measurement"]
    assert measurement["calls"] >= 3 and measurement["throughput_ci_rel"] is not None and "noise_flags" in measurement
    assert best["environment"]["OMP_NUM_THREADS"] == str(best["config"]["threads_per_instance"])
    assert best["drift"]["samples"] == 8 and best["drift"]["max_drift"] == 0.05
    assert best["drift"]["metric"] == "relative_l2"  # a classifier's default

    # The exported command reproduces the winner in a fresh process.
    replay = subprocess.run(
        best["launch"]["commands"][0], shell=True, capture_output=True, text=True, timeout=120, cwd=workdir
    )
    assert replay.returncode == 0, replay.stderr
    measured = json.loads(replay.stdout)
    assert measured["allocator"]["asked"] == best["config"]["allocator"] and measured["allocator"]["verified"]
    assert measured["samples_per_call"] == best["config"]["batch_size"] and measured["iterations"] >= 5
    assert measured["threads"]["torch"] == best["config"]["threads_per_instance"]
    recorded = best["metrics"]["throughput_sps"] / best["config"]["instances"]
    assert recorded / 3 < measured["throughput_sps"] < recorded * 3  # the same config, not another one

    exported = searcher("export", "--study", "s", "-o", str(workdir / "out.json"))
    assert exported.returncode == 0, exported.stderr
    assert json.loads((workdir / "out.json").read_text())["config"] == best["config"]

    # Side by side: baseline and winner through autotune's protocol, and the winner under a plain timing loop.
    compared = searcher("compare", "--study", "s", "--repeats", "1", "--independent", "2s")
    assert compared.returncode == 0, compared.stderr
    rows = {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
        for line in compared.stdout.splitlines()
        if line.startswith("│ baseline") or line.startswith("│ winner")
    }
    assert set(rows) == {"baseline", "winner", "winner, independent"} and rows["baseline"][-1] == "1.00x"
    ours, independent = float(rows["winner"][0]), float(rows["winner, independent"][0])
    assert 0.5 < independent / ours < 2.0  # two stopwatches, same config: the same order of magnitude

    # The search's own benchmarks read the study: its best so far against the clock, and replays.
    docs = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"

    def budget_curve() -> subprocess.CompletedProcess:
        command = [sys.executable, str(docs / "search_budget.py"), "--study", "s", "--reference", "s"]
        command += ["--out", str(workdir / "budget.json")]  # a results file, kept out of docs/results
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=workdir)

    clock = budget_curve()
    assert clock.returncode == 0, clock.stderr
    numbers = [line.split("│")[3].strip() for line in clock.stdout.splitlines() if line.startswith("│")]
    assert [int(n) for n in numbers if n] == [t.number for t in study.trials]  # each finished trial, in order
    assert "reference s (" in clock.stdout and "s reached 95% of " in clock.stdout
    assert "best re-measured: #" in clock.stdout  # this study ran a finalist round: its median is a target too
    # A reference with a finalist round is also judged against its fastest finalist's median (here one that
    # no trial reaches, so the second verdict must differ from the first).
    fastest = max(t.values[0] for t in study.trials if t.values)
    candidate = {"trial": 0, "candidate": True, "summary": {"median": fastest * 10, "runs": 3}}
    load_study(workdir, "s").set_user_attr("finalists", {"candidates": [candidate]})
    clock = budget_curve()
    assert clock.returncode == 0, clock.stderr
    assert f"best re-measured: #0, median {fastest * 10:.2f} of 3" in clock.stdout
    curve = json.loads((workdir / "budget.json").read_text())  # the summary page's best-so-far chart
    assert [row["value"] for row in curve["rows"]][3] == fastest * 10 and len(curve["best_so_far"]["points"]) >= 1
    assert "s reached 95% of " in clock.stdout and f"s never reached 95% of {fastest * 10:.2f}" in clock.stdout
    replayed = subprocess.run(
        [sys.executable, str(docs / "sampler_replay.py"), "--study", "s", "--runs", "3", "--budget-min", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=workdir,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert all(f"│ {strategy} " in replayed.stdout for strategy in ("default", "random", "tpe"))
    # Two searches' answers compared by re-measuring their winners side by side, with the baseline.
    winners = subprocess.run(
        [
            sys.executable,
            str(docs / "winners_side_by_side.py"),
            "--best",
            "s=studies/s/best.json",
            "--baseline",
            "--rounds",
            "2",
            "--out",
            str(workdir / "winners.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=workdir,
        env={**os.environ, "COLUMNS": "200"},  # one line a row
    )
    assert winners.returncode == 0, winners.stderr
    rows = {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.split("│")[1:-1]] for line in winners.stdout.splitlines())
        if cells and cells[0] in ("s", "baseline")
    }
    assert set(rows) == {"s", "baseline"}, winners.stdout
    assert float(rows["s"][0]) > 0 and float(rows["s"][-1].rstrip("x")) > 0  # its median, and over the baseline's
    assert f"  s: {TrialConfig.from_json(best['config']).summary()}" in winners.stdout
    assert winners.stdout.count("repeat 2/2 ") == 2  # both measured in the second round too
    written = json.loads((workdir / "winners.json").read_text())
    assert [len(row["runs"]) for row in written["rows"]] == [2, 2] and written["rows"][1]["vs_baseline"] == 1.0
    refused = subprocess.run(
        [sys.executable, str(docs / "winners_side_by_side.py"), "--best", "studies/s/best.json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=workdir,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "LABEL=PATH" in refused.stderr


def test_drift_pruner_discards_configs_beyond_the_threshold(searcher, workdir):
    space = write_space(
        workdir / "space.yaml", backends={"eager": {"precision": ["bf16"], "memory_format": ["contiguous"]}}
    )
    result = searcher.search("--trials", "3", "--max-drift", "1e-4", space=space)
    assert result.returncode == 0, result.stderr
    study = load_study(workdir, "s")
    # The space has no fp32: no baseline, and every bf16 trial drifts ~1e-3 > 1e-4.
    assert states(study) == ["PRUNED"] * 3
    for trial in study.trials:
        assert trial.user_attrs["drift"]["relative_l2"] > 1e-4
        assert "throughput_sps" not in trial.user_attrs  # never timed
    assert "no trial met the drift bound" in result.stdout  # the closest is exported, marked (tests/test_faults.py)


def test_rerun_resumes_and_refuses_changed_settings(searcher, workdir):
    assert searcher.search("--trials", "2").returncode == 0
    again = searcher.search("--trials", "2")
    assert again.returncode == 0 and "resuming study 's'" in again.stdout
    assert len(load_study(workdir, "s").trials) == 4
    changed = searcher.search("--trials", "1", "--max-drift", "0.2")
    assert changed.returncode == 2 and "different settings" in changed.stderr and "max_drift" in changed.stderr
    assert "Traceback" not in changed.stderr and len(changed.stderr.strip().splitlines()) == 1


def test_a_new_study_tries_the_winner_of_an_earlier_study_on_this_machine_first(searcher, workdir):
    """Studies in the same storage on the same hardware are a prior: the earlier winner (batch 4) is the
    new study's first trial after its baseline (batch 2), and says why."""
    earlier = write_space(workdir / "earlier.yaml", batch_size=[4])
    for _ in range(3):  # a busy machine may flag every trial noisy (none may win): resume with more
        done = searcher.search("--trials", "2", "--no-speed-pruning", space=earlier, study="earlier")
        if done.returncode == 0 or NOISY_REFUSAL not in done.stderr:
            break
    assert done.returncode == 0, done.stderr
    won = clean_trials(load_study(workdir, "earlier"))[0].params
    space = write_space(workdir / "space.yaml", batch_size=[2, 4])
    result = searcher.search("--trials", "2", "--no-speed-pruning", space=space, study="later")
    assert_trials_ran(result)
    assert "1 winner(s) of earlier studies on this machine tried first" in result.stdout
    later = load_study(workdir, "later")
    assert later.trials[0].user_attrs["baseline"] and later.trials[0].params["batch_size"] == 2
    assert later.trials[1].params == won and later.trials[1].user_attrs["prior"] is True
    assert later.trials[1].user_attrs["order"].startswith("prior: the winner of study earlier on this machine")


def test_an_earlier_winner_outside_a_narrower_space_is_narrowed_or_left_out(searcher, workdir):
    """Studies in one studies folder, the new one with a narrower space: an earlier winner at batch 4 is
    enqueued without the value the new space lacks (sampled instead; Optuna raised on it before), and a
    winner whose backend the new space does not offer (openvino) is left out with a note. The earlier
    studies' winners are its real trial, recorded clean (a loaded machine may flag the real one noisy)."""
    earlier = write_space(workdir / "earlier.yaml", batch_size=[4])
    assert_trials_ran(searcher.search("--trials", "1", "--no-speed-pruning", space=earlier, study="earlier"))
    ran = load_study(workdir, "earlier")
    first = ran.trials[0]
    for name, params in (
        ("eager4", first.params),
        ("other", {"backend": "openvino", "openvino.precision": "int8", "batch_size": 4}),
    ):
        (workdir / "studies" / name).mkdir()
        study = optuna.create_study(
            study_name=name, storage=f"sqlite:///{workdir / 'studies' / name / 'study.db'}", direction="maximize"
        )
        for key in ("fingerprint", "spec"):
            study.set_user_attr(key, ran.user_attrs[key])
        choices = {key: optuna.distributions.CategoricalDistribution([value]) for key, value in params.items()}
        attrs = {**first.user_attrs, "baseline": False, "valid": True}
        study.add_trial(
            optuna.trial.create_trial(value=first.value, params=params, distributions=choices, user_attrs=attrs)
        )
    narrower = write_space(workdir / "narrower.yaml", batch_size=[2, 8])
    result = searcher.search("--trials", "2", "--no-speed-pruning", space=narrower, study="later")
    assert_trials_ran(result)
    assert "Traceback" not in result.stderr
    assert "the winner of study other on this machine" in result.stdout
    assert "runs openvino, which this space does not offer" in result.stdout
    assert "1 winner(s) of earlier studies on this machine tried first" in result.stdout
    later = load_study(workdir, "later")
    assert states(later) == ["COMPLETE", "COMPLETE"]
    prior = later.trials[1]
    assert prior.user_attrs["prior"] is True and "sampled here: batch_size=4" in prior.user_attrs["order"]
    assert prior.params["backend"] == "eager" and prior.params["batch_size"] in (2, 8)


def test_once_the_enqueued_trials_ran_the_leader_runs_as_one_instance_per_core(searcher, workdir):
    """The layout round in a real search: the baseline (one instance on all cores) leads, the next trial is
    the same configuration split into one-thread instances, saying why (before, the sampler took it from
    there), and eager bf16's coverage trial runs after the round where bf16 is emulated (tier 3, expected
    to lose), before it where the CPU has bf16 instructions."""
    from autotune.machine.probe import probe_machine
    from autotune.tuning.payoff import LATE_TIER, expected_payoff

    machine = probe_machine()
    cores = machine.physical_cores
    require(cores >= 2, "two physical cores")
    space = write_space(
        workdir / "space.yaml",
        instances=[1, cores],
        backends={"eager": {"precision": ["fp32", "bf16"], "memory_format": ["contiguous"]}},
    )
    result = searcher.search("--trials", "3", "--no-speed-pruning", space=space)
    assert_trials_ran(result)
    trials = load_study(workdir, "s").trials
    assert trials[0].user_attrs["baseline"] and trials[0].params["instances"] == 1
    bf16_is_late = expected_payoff("eager", "bf16", machine.isa).tier >= LATE_TIER
    split, bf16 = (trials[1], trials[2]) if bf16_is_late else (trials[2], trials[1])
    assert bf16.params["eager.precision"] == "bf16" and bf16.user_attrs["coverage"]
    assert bf16.user_attrs["order"].endswith("(after the layout round)") == bf16_is_late, bf16.user_attrs["order"]
    assert split.user_attrs["order"].startswith("layout round: the leader #"), split.user_attrs["order"]
    leader = trials[int(split.user_attrs["order"].split("#")[1].split(" ")[0])]
    assert leader.number < split.number and leader.state == optuna.trial.TrialState.COMPLETE
    assert split.user_attrs["config"]["instances"] == cores and split.user_attrs["config"]["threads_per_instance"] == 1
    assert {k: v for k, v in split.params.items() if k not in ("instances", "threads_per_instance")} == {
        k: v for k, v in leader.params.items() if k not in ("instances", "threads_per_instance")
    }
    assert split.state == optuna.trial.TrialState.COMPLETE, split.user_attrs.get("fail_cause")


@pytest.mark.parametrize(("model", "attention"), [("tiny_vit", 2), ("tiny_cnn", 0)])
def test_the_int8_coverage_starts_with_the_backend_suited_to_the_model_and_the_cpu(searcher, workdir, model, attention):
    """The reference process counts the model's attention layers, and the coverage round starts its int8
    with OpenVINO's, except for a model with attention layers on a CPU without int8 dot products: there
    ONNX Runtime's dynamic int8 first (on an AVX2-only EPYC it ran vit_b_16 faster than NNCF's
    transformer scheme, both with 7-bit weights). It also measures how deep the model's layers reduce:
    both tiny models reduce shallowly, so without int8 dot products their int8 is expected to lose."""
    import tiny_models
    import torch

    from autotune.backends.torch_common import with_reduction_depth
    from autotune.common.cpuinfo import int8_dot_products
    from autotune.tuning.payoff import SHALLOW_REDUCTION

    backends = {
        "eager": {"precision": ["fp32"], "memory_format": ["contiguous"]},
        "onnxruntime": {"precision": ["int8"]},
        "openvino": {"precision": ["int8"]},
    }
    space = write_space(workdir / "space.yaml", batch_size=[4], backends=backends)
    result = searcher.search(model=tiny(model), input_shape="3x32x32", space=space, trials=1)
    assert result.returncode == 0, result.stderr
    meta = json.loads((workdir / "studies" / "s" / "reference" / "meta.json").read_text())
    assert meta["result"]["attention_layers"] == attention
    study = load_study(workdir, "s")
    assert study.user_attrs["attention_layers"] == attention
    built = getattr(tiny_models, model)().eval()
    with torch.inference_mode():
        _, depth = with_reduction_depth(built, lambda: built(torch.randn(1, 3, 32, 32)))
    assert depth is not None and depth < SHALLOW_REDUCTION
    assert meta["result"]["reduction_depth"] == pytest.approx(depth) == study.user_attrs["reduction_depth"]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    enqueued = [t.system_attrs["fixed_params"] for t in waiting]  # Optuna keeps an enqueued trial's params there
    assert all(params[f"{params['backend']}.precision"] == "int8" for params in enqueued), enqueued
    expected = "onnxruntime" if attention and not int8_dot_products() else "openvino"
    assert [params["backend"] for params in enqueued] == [expected, *{"onnxruntime", "openvino"} - {expected}]
    assert "first of its tier" in waiting[0].user_attrs["order"], waiting[0].user_attrs["order"]
    late = not int8_dot_products()  # shallow: int8 without dot products is expected to lose
    assert all(("tier 3: int8 expected to lose" in t.user_attrs["order"]) == late for t in waiting), waiting


def test_crashing_trials_never_kill_the_study(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[4])
    result = searcher.search("--trials", "2", model=tiny("crashing"), space=space)
    assert result.returncode == 0, result.stderr
    study = load_study(workdir, "s")
    assert states(study) == ["FAIL", "FAIL"]
    assert all("SIGABRT" in t.user_attrs["fail_cause"] for t in study.trials)
    assert all("stderr_tail" in t.user_attrs for t in study.trials)


def test_budget_is_wall_clock(searcher, workdir):
    started = time.monotonic()
    result = searcher.search("--no-speed-pruning", budget="25s")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    study = load_study(workdir, "s")
    assert states(study).count("COMPLETE") >= 2
    assert elapsed < 25 + 15  # interpreter start-up and export on top of the budget


def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[4])
    proc = subprocess.Popen(
        [*AUTOTUNE, *searcher.search_args("--trial-timeout", "2m", model=tiny("hanging"), space=space, budget="5m")],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # a command in a terminal hears Ctrl-C even when the suite was started in the background, where a
        # shell ignores SIGINT for its children (and Python then never raises KeyboardInterrupt)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    trial_dir = workdir / "studies" / "s" / "trials" / "00000"
    deadline = time.monotonic() + 60
    while not (trial_dir / "stderr-0.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume" in out + err and "Traceback" not in err
    trial = load_study(workdir, "s").trials[0]
    assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs["fail_cause"] == "interrupted (Ctrl-C)"
    from test_trials_subprocess import leftover_processes

    assert leftover_processes(str(trial_dir)) == []
    again = searcher.search("--trials", "1", "--trial-timeout", "5s", model=tiny("hanging"), space=space, budget="5m")
    assert again.returncode == 0 and "resuming study 's'" in again.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["search", "--model", "resnet5O"],
            "unknown model 'resnet5O': not a torchvision classification model. Did you mean resnet50",
        ),
        (["search", "--model", "resnet18", "--memory-limit", "lots"], "--memory-limit: cannot read size 'lots'"),
        (["search", "--model", "resnet18", "--cache-size", "50%"], "--cache-size: cannot read size '50%'"),
        (["search", "--model", "resnet18", "--data", "no-such-folder"], "--data 'no-such-folder' does not exist"),
        (
            ["search", "--model", "resnet18", "--storage", "postgresql://tuner:s3cret@127.0.0.1:1/studies"],
            "cannot open storage postgresql://tuner:***@",
        ),
        (["search", "--model", "resnet18", "--budget", "soon"], "cannot read duration 'soon'"),
        (["search", "--model", "resnet18", "--measure-seconds", "2s-1s"], "the longest window must not be shorter"),
        (["search", "--model", "resnet18", "--input-shape", "3xax4"], "cannot read input shape"),
        (["search", "--model", "resnet18", "--study", "../escape"], "study name '../escape' is not allowed"),
        (["search", "--model", "resnet18", "--space", "missing.yaml"], "does not exist"),
        (["search", "--model", "resnet18", "--weights", "nope.pt"], "weights file 'nope.pt' does not exist"),
        (["search", "--model", "resnet18", "--storage", "nodb://x"], "cannot open storage"),
        (["export", "--study", "nothing"], "no study 'nothing'"),
        (["search"], "--model"),
        (["search", "--model", ":make"], "give the name of a function"),
        (["compare"], "compare needs --study NAME or --best FILE"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    result = cli(*args, timeout=120)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "s3cret" not in result.stderr + result.stdout  # a storage password is never printed


@pytest.mark.parametrize(
    "files,args,message",
    [
        (
            {"w.pt": b"not a state dict"},
            ["--weights", "w.pt"],
            "weights file 'w.pt' is not a file saved with torch.save",
        ),
        ({"s.yaml": b"batch: [1]\n"}, ["--space", "s.yaml"], "unknown key 'batch'"),
        ({"s.yaml": b"batch_size: [big]\n"}, ["--space", "s.yaml"], "batch_size must be a list of int"),
        (
            {"s.yaml": b"threads_per_instance: [64]\n"},
            ["--space", "s.yaml"],
            "threads_per_instance values [64] must lie between 1 and the",
        ),
        ({"s.yaml": b"instances: [64]\n"}, ["--space", "s.yaml"], "instances values [64] must lie between 1 and the"),
        (
            {"s.yaml": b"backends: {eager: {precision: [fp64]}}\n"},
            ["--space", "s.yaml"],
            "backends.eager.precision value 'fp64' is not supported",
        ),
        (  # an option's values come from the backend's options record
            {"s.yaml": b"backends: {openvino: {streams: [3]}}\n"},
            ["--space", "s.yaml"],
            "backends.openvino.streams value 3 is not supported; choose from ['auto', 1, 2, 4, 8]",
        ),
        (
            {"s.yaml": b"backends: {inductor: {streamz: [1]}}\n"},
            ["--space", "s.yaml"],
            "backend 'inductor' has no option 'streamz'; it has precision, memory_format, freezing",
        ),
        ({"s.yaml": b"backends: [eager\n"}, ["--space", "s.yaml"], "is not valid YAML"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(cli, workdir, files, args, message):
    for name, content in files.items():
        (workdir / name).write_bytes(content)
    result = cli("search", "--model", "resnet18", *args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_latency_objective_minimises_median_latency(searcher):
    result = searcher.search("--objective", "latency", space=searcher.space(batch_size=[1, 8]), trials=3)
    assert result.returncode == 0, result.stderr
    study = searcher.study()
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    best = searcher.best()
    assert best["objective"]["value"] == min(
        t.value for t in study.trials if t.value is not None and t.user_attrs.get("valid")
    )
    assert best["objective"]["value"] == best["metrics"]["latency_ms"]["p50"]


def test_speed_pruner_stops_a_clearly_slower_config_after_screening(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[2, 4])
    model = tiny("slow_at_bad_batch")
    assert searcher.search("--trials", "1", model=model, space=space).returncode == 0  # the baseline, batch 2
    study = load_study(workdir, "s")
    study.enqueue_trial({**study.trials[0].params, "batch_size": 4})  # same config, but the batch the model is slow at
    result = searcher.search("--trials", "1", model=model, space=space)
    assert result.returncode == 0, result.stderr
    trial = load_study(workdir, "s").trials[1]
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.params["batch_size"] == 4
    assert (
        "screening" in trial.user_attrs["prune_reason"]
        and trial.intermediate_values[0] < trial.user_attrs["screening"]["throughput_sps"] + 1
    )
    assert "throughput_sps" not in trial.user_attrs  # the full measurement never ran
    assert (workdir / "studies" / "s" / "trials" / "00001" / "screen-0.npy").exists()
    # Where its time went, split by what its workers said at the ready barrier (not all "starting").
    budget = trial.user_attrs["budget"]
    assert budget["loading_s"] > 0 and budget["warmup_s"] > 0 and budget["screening_s"] > 0, budget


def eager_fp32_and_bf16_space(workdir: Path, **extra: Any) -> Path:
    """The speed gate's tests: an fp32 baseline and a bf16 configuration at batch 4 or 8."""
    return write_space(
        workdir / "space.yaml",
        batch_size=[4, 8],
        backends={"eager": {"precision": ["fp32", "bf16"], "memory_format": ["contiguous"]}},
        **extra,
    )


def test_a_config_far_slower_than_the_best_stops_its_drift_evaluation_at_the_speed_gate(searcher, workdir):
    """64 evaluation samples at batch 4, one second a call in bf16: a 16 s drift evaluation, hundreds of
    times slower than the baseline. The gate stops it after about 10 s, before drift is judged or anything
    is timed (without the gate it ran to its end and screening pruned it). A family that lost by that
    much is not launched again when the sampler proposes it at another batch size."""
    from autotune.tuning.pruners import GATE_AFTER_S

    space = eager_fp32_and_bf16_space(workdir)
    model = tiny("crawls_in_bf16")
    samples = ("--eval-samples", "64")
    # the baseline, then the coverage round's bf16 trial
    assert searcher.search("--trials", "2", *samples, model=model, space=space).returncode == 0
    study = load_study(workdir, "s")
    trial = study.trials[1]
    assert trial.state == optuna.trial.TrialState.PRUNED, trial.user_attrs
    assert trial.user_attrs["config"]["precision"] == "bf16" and trial.user_attrs["config"]["batch_size"] == 4
    assert "speed_gate" in trial.user_attrs, "no gate was set: was the baseline clean? " + str(trial.user_attrs)
    assert "too slow to be worth its drift evaluation" in trial.user_attrs["prune_reason"]
    assert trial.intermediate_values[0] < 8  # its pace told the sampler (1 s a call at batch 4)
    too_slow = trial.user_attrs["too_slow"]
    assert GATE_AFTER_S <= too_slow["seconds"] < GATE_AFTER_S + 3 and too_slow["samples"] < 64, too_slow
    assert too_slow["samples_per_s"] < too_slow["gate"]["min_samples_per_s"]
    assert "drift" not in trial.user_attrs and "screening" not in trial.user_attrs  # nothing past the gate ran
    assert trial.user_attrs["speed_gate"] == too_slow["gate"]  # the gate the search set is the one that tripped
    # The sampler's proposal (enqueued without an `order`, as a sampled trial has none): bf16 at batch 8.
    study.enqueue_trial({**trial.params, "batch_size": 8})
    assert searcher.search("--trials", "1", *samples, model=model, space=space).returncode == 0
    again = load_study(workdir, "s").trials[2]
    assert again.state == optuna.trial.TrialState.PRUNED and again.user_attrs["config"]["batch_size"] == 8
    assert again.user_attrs["prune_reason"].startswith("not launched: every eager bf16 trial so far lost by far")
    # about 4 samples/s (a second a call at batch 4) against the baseline's thousands
    assert re.search(
        r"#1 ran [\d.]+ samples/s per core in its drift evaluation against the best's", again.user_attrs["prune_reason"]
    )
    assert not (workdir / "studies" / "s" / "trials" / f"{again.number:05d}").exists(), "it was launched"
    # What the search enqueues itself (coverage, layout rounds, priors) says why it runs, and always runs.
    study.enqueue_trial({**trial.params, "batch_size": 8}, user_attrs={"order": "enqueued by the search"})
    assert searcher.search("--trials", "1", *samples, model=model, space=space).returncode == 0
    enqueued = load_study(workdir, "s").trials[3]
    assert (workdir / "studies" / "s" / "trials" / f"{enqueued.number:05d}").exists(), "it was not launched"
    assert "budget" in enqueued.user_attrs, enqueued.user_attrs  # the orchestrator split its time: it ran
    assert not enqueued.user_attrs.get("prune_reason", "").startswith("not launched"), enqueued.user_attrs


def test_a_config_whose_drift_is_known_is_held_to_the_speed_gate_through_its_warm_up(searcher, workdir):
    """A drift evaluation of one call (4 samples at batch 4) ends before the gate judges anything, and a
    trial whose drift an earlier one measured has none at all: the gate then watches the warm-up. Six
    seconds a call in bf16: stopped after its second warm-up call (12 s, past the gate's 10), not after the
    three the warm-up makes at least, its screening and its window. The drift it measured is kept, and the
    next trial of the same numerics reuses it; run as two instances, each is stopped in its warm-up (the
    ready barrier waits for both: one left unwatched would warm up to its end)."""
    from autotune.tuning.pruners import GATE_AFTER_S

    space = eager_fp32_and_bf16_space(workdir, instances=[1, 2])
    model = tiny("crawls_6s_in_bf16")
    samples = ("--eval-samples", "4")
    assert searcher.search("--trials", "3", *samples, model=model, space=space).returncode == 0
    study = load_study(workdir, "s")
    trial = next(t for t in study.trials if t.user_attrs.get("config", {}).get("precision") == "bf16")
    assert trial.state == optuna.trial.TrialState.PRUNED, trial.user_attrs
    assert trial.user_attrs["config"]["batch_size"] == 4 and trial.user_attrs["config"]["instances"] == 1
    assert "speed_gate" in trial.user_attrs, "no gate was set: was the baseline clean? " + str(trial.user_attrs)
    too_slow = trial.user_attrs["too_slow"]
    assert too_slow["stage"] == "warm-up", too_slow
    assert "too slow to be worth its warm-up" in trial.user_attrs["prune_reason"]
    assert too_slow["samples"] == 8 and GATE_AFTER_S <= too_slow["seconds"] < GATE_AFTER_S + 4, too_slow
    assert trial.user_attrs["speed_gate"] == too_slow["gate"]
    assert trial.user_attrs["drift"]["reused_from"] is None  # measured before the warm-up, and kept
    assert "screening" not in trial.user_attrs
    assert trial.user_attrs["budget"]["warmup_s"] == pytest.approx(too_slow["seconds"], abs=0.5)
    # The same numerics at batch 8 as two instances, as the search enqueues it (so it runs): drift reused.
    layout = {"batch_size": 8, "instances": 2, "threads_per_instance": 1}
    study.enqueue_trial({**trial.params, **layout}, user_attrs={"order": "enqueued by the search"})
    assert searcher.search("--trials", "1", *samples, model=model, space=space).returncode == 0
    again = load_study(workdir, "s").trials[-1]
    assert again.state == optuna.trial.TrialState.PRUNED, again.user_attrs
    assert again.user_attrs["config"]["instances"] == 2 and again.user_attrs["config"]["batch_size"] == 8
    assert again.user_attrs["drift"]["reused_from"] == trial.number
    assert again.user_attrs["too_slow"]["stage"] == "warm-up", again.user_attrs
    assert again.user_attrs["too_slow"]["samples"] == 16  # two calls at batch 8
    assert "screening" not in again.user_attrs
    # Both instances stopped after two calls: the warm-up the barrier waited for was not three calls (18 s).
    assert again.user_attrs["budget"]["warmup_s"] < GATE_AFTER_S + 4, again.user_attrs["budget"]


def test_the_speed_gate_waits_its_time_then_judges_the_pace():
    """Pure: counted from the end of the first batch (its one-time costs left out), nothing before after_s
    however slow; after it, below the floor trips and above does not, unless the latest batch kept it."""
    from autotune.measure.speed_gate import GateTripped, GateWatch, SpeedGate

    now = [100.0]
    gate = SpeedGate(min_samples_per_s=10.0, after_s=5.0, basis="test")
    watch = GateWatch(gate, clock=lambda: now[0])
    watch(8)  # the first batch took 100 s: not judged, the clock starts here
    now[0] = 104.9
    watch(9)  # 0.2 samples/s since, but too early to judge
    now[0] = 106.0
    watch(8 + 61)  # 10.2 samples/s: keeps going
    now[0] = 108.0
    with pytest.raises(GateTripped) as tripped:
        watch(8 + 70)  # 8.75 samples/s
    assert tripped.value.verdict.samples == 70 and tripped.value.verdict.samples_per_s == pytest.approx(8.75)
    assert "below the gate's 10" in tripped.value.verdict.reason()
    # A warm-up's first call with a one-time cost: the pace since the start is below the floor, but the
    # latest call is fast, so it goes on; once the latest is slow as well, it stops.
    now[0] = 0.0
    gate = SpeedGate(min_samples_per_s=10.0, after_s=10.0, basis="test")
    warming = GateWatch(gate, clock=lambda: now[0], stage="warm-up", instance=1)
    warming(0)  # the warm-up starts
    now[0] = 8.0
    warming(8)  # an 8 s first call: too early to judge
    now[0] = 10.5
    warming(40)  # 3.8 samples/s since the start, but this call ran 12.8
    now[0] = 20.0
    with pytest.raises(GateTripped) as tripped:
        warming(50)  # 2.5 since the start, and this call 1.05
    assert tripped.value.verdict.instance == 1 and "in instance 1 over 20.0 s of its warm-up" in str(tripped.value)
    # A first warm-up call that alone outlasts after_s (IPEX fusing for 12 s) is not judged alone; the next,
    # fast, call keeps it going.
    now[0] = 0.0
    slow_start = GateWatch(gate, clock=lambda: now[0], stage="warm-up", min_calls=2)
    slow_start(0)
    now[0] = 12.0
    slow_start(8)  # 0.67 samples/s, past after_s: the first call, not judged
    now[0] = 12.5
    slow_start(16)  # 1.28 since the start, but this call ran 16
    now[0] = 30.0
    with pytest.raises(GateTripped):
        slow_start(24)  # and once a call is slow as well, it stops


def test_the_ready_barrier_stops_a_trial_on_any_instances_gate_verdict():
    """Every instance's warm-up is watched: instance 1 stopped while instance 0 warmed up to its end still
    prunes the trial (instance 1 would otherwise wait for a stop that never comes, then fail), and of two
    verdicts the lowest-numbered instance's is the one recorded."""
    from autotune.tuning.study import first_too_slow

    ready = {"pid": 1, "drift": None, "load_s": 1.0, "first_call_s": 0.1, "warmup_s": 3.0}
    verdict = {"samples": 8, "seconds": 12.0, "samples_per_s": 0.67, "stage": "warm-up", "instance": 1}
    assert first_too_slow([ready, {**ready, "too_slow": verdict}]) == verdict
    assert (
        first_too_slow([{**ready, "too_slow": {**verdict, "instance": 0}}, {**ready, "too_slow": verdict}])["instance"]
        == 0
    )
    assert first_too_slow([ready, ready]) is None


def load_bench_replay() -> Any:
    """docs/benchmarks/sampler_replay.py as a module, registered so its dataclasses find it."""
    from conftest import benchmark_script

    return benchmark_script("sampler_replay", "bench_replay")


def test_the_replay_values_a_configuration_by_the_median_of_its_measurements():
    """A configuration measured 100 and 140 is worth 120, so the target is not the luckiest draw; the p90 of
    two times is the larger (nearest rank), not the smaller."""
    replay = load_bench_replay()
    a, b = {"backend": "openvino", "batch_size": 16}, {"backend": "openvino", "batch_size": 32}
    rows = [
        replay.Row(a, 100.0, 0.01, 10.0, True, False),
        replay.Row(b, 115.0, 0.02, 20.0, False, False),
        replay.Row(a, 140.0, 0.03, 30.0, False, False),
        replay.Row(a, None, 0.5, 5.0, False, False),  # pruned once: costs, counts for no value
    ]
    merged = replay.merge_repeats(rows)
    assert [r.params for r in merged] == [a, b]
    assert merged[0].value == 120.0 and merged[0].noise_rel == 0.02 and merged[0].cost_s == 10.0
    assert merged[0].coverage and max(r.value for r in merged) == 120.0  # the target: not 140
    assert replay.nearest_rank([16.2, 1.2], 0.9) == 16.2 and replay.nearest_rank([3.0], 0.9) == 3.0


def recorded_batches(*rows: tuple[int, float, float]) -> optuna.study.Study:
    """A recorded study of eager at each (batch size, value, throughput interval): 1 s a trial, the first
    one the baseline."""
    batches = [batch_size for batch_size, _, _ in rows]
    distributions = {
        "backend": optuna.distributions.CategoricalDistribution(["eager"]),
        "batch_size": optuna.distributions.CategoricalDistribution(batches),
    }
    recorded = optuna.create_study(direction="maximize")
    recorded.set_user_attr("spec", {"objective": "throughput"})
    for batch_size, value, noise in rows:
        attrs = {"budget": {"total_s": 1.0}, "measurement": {"throughput_ci_rel": noise}}
        if batch_size == batches[0]:
            attrs["baseline"] = True
        params = {"backend": "eager", "batch_size": batch_size}
        recorded.add_trial(
            optuna.trial.create_trial(params=params, distributions=distributions, value=value, user_attrs=attrs)
        )
    return recorded


def test_the_replays_curve_is_what_its_answer_is_worth_not_its_luckiest_draw():
    """Batch 8 is worth 100 with a noise of 50%, batch 16 worth 104 measured almost exactly: the old curve
    was the best draw so far, which is neither. The curve is what the answer is worth, the value the table
    records for a configuration: batch 8's from the first trial, the baseline, then 104 once batch 16 is
    measured (the two both fit the finalist round)."""
    replay = load_bench_replay()
    recorded = recorded_batches((8, 100.0, 0.5), (16, 104.0, 1e-9))
    rows = replay.merge_repeats(replay.read_table(recorded))
    curve = replay.replay("random", recorded, rows, 40.0, {}, 0)
    assert len(curve) == 40
    assert {worth for _, worth in curve} <= {100.0, 104.0}, curve
    assert curve[-1][1] == 104.0
    default = replay.replay("default", recorded, rows, 5.0, {}, 0)
    assert default[0][1] == 100.0, default  # the baseline first: what batch 8 is worth, not its draw


def test_the_replay_caps_a_configurations_launches_only_in_its_capping_strategy():
    """One configuration in the table: the default launches it every time it is proposed; the capping
    strategy launches it REPEATS_CAP times (the baseline included), then prunes each proposal unlaunched."""
    replay = load_bench_replay()
    recorded = recorded_batches((8, 100.0, 0.02))
    rows = replay.merge_repeats(replay.read_table(recorded))
    for strategy, launched in (("default", 10), ("default-capping-repeats", replay.REPEATS_CAP)):
        curve = replay.replay(strategy, recorded, rows, 10.0, {}, 0)
        steps = [later - earlier for (earlier, _), (later, _) in zip([(0.0, 0.0), *curve], curve)]
        assert steps.count(1.0) == launched and all(step == replay.UNLAUNCHED_S for step in steps[launched:]), steps


def test_the_replay_runs_the_layout_round_on_what_the_recorded_study_measured():
    """The default replay runs the leader's layout variant right after the enqueued rounds; a variant the
    recorded study measured is answered by that measurement, one it never measured is pruned at the
    leader's cost (the closest recorded row, here batch 16 at 900, would credit the round with a guess)."""
    replay = load_bench_replay()
    distributions = {
        "backend": optuna.distributions.CategoricalDistribution(["eager"]),
        "batch_size": optuna.distributions.CategoricalDistribution([8, 16]),
        "instances": optuna.distributions.CategoricalDistribution([1, 2]),
        "threads_per_instance": optuna.distributions.IntDistribution(1, 2),
    }
    base = {"backend": "eager", "batch_size": 8, "instances": 1, "threads_per_instance": 2}
    split = {**base, "instances": 2, "threads_per_instance": 1}
    for measured, expected in ((True, 180.0), (False, 100.0)):
        recorded = optuna.create_study(direction="maximize")
        recorded.set_user_attr("spec", {"objective": "throughput"})
        recorded.set_user_attr("fingerprint", {"hardware": {"physical_cores": 2}})
        other = {**split, "batch_size": 16, "threads_per_instance": 1}
        for params, value, attrs in ((base, 100.0, {"baseline": True}), (split if measured else other, 180.0, {})):
            attrs = {**attrs, "budget": {"total_s": 10.0}, "measurement": {"throughput_ci_rel": 0.0}}
            recorded.add_trial(
                optuna.trial.create_trial(params=params, distributions=distributions, value=value, user_attrs=attrs)
            )
        rows = replay.merge_repeats(replay.read_table(recorded))
        tally = replay.LayoutTally()
        curve = replay.replay("default", recorded, rows, 20.0, {}, 0, tally)
        # the baseline, then its split, nothing else within the budget: what each is worth, not its draw
        assert [worth for _, worth in curve] == [100.0, expected]
        assert (tally.exact, tally.unrecorded) == ((1, 0) if measured else (0, 1))
        without = replay.replay("default-without-layout-round", recorded, rows, 20.0, {}, 0, replay.LayoutTally())
        assert without[0][1] == 100.0 and len(without) == 2


def test_the_replay_asks_what_the_search_asks_so_a_measured_variant_matches_among_several_backends():
    """With two backends recorded, each with its own options, a replayed trial asks only its backend's
    options (as the search's define-by-run space does): the leader's split that the recorded study
    measured is answered by that measurement. Asking every recorded distribution also drew the other
    backend's option, so no recorded row ever matched and every variant counted as pruned."""
    replay = load_bench_replay()
    categorical = optuna.distributions.CategoricalDistribution
    shared = {
        "batch_size": categorical([8]),
        "instances": categorical([1, 2]),
        "threads_per_instance": categorical([1, 2]),
    }
    openvino = {"backend": categorical(["openvino", "onnxruntime"]), "openvino.precision": categorical(["int8"])}
    onnxruntime = {
        "backend": categorical(["openvino", "onnxruntime"]),
        "onnxruntime.precision": categorical(["fp32"]),
        "onnxruntime.execution_mode": categorical(["sequential", "parallel"]),
    }
    leader = {"backend": "openvino", "openvino.precision": "int8", "batch_size": 8, "instances": 1}
    recorded = optuna.create_study(direction="maximize")
    recorded.set_user_attr("spec", {"objective": "throughput"})
    recorded.set_user_attr("fingerprint", {"hardware": {"physical_cores": 2}})
    for params, dists, value, attrs in (
        ({**leader, "threads_per_instance": 2}, openvino, 100.0, {"baseline": True}),
        ({**leader, "instances": 2, "threads_per_instance": 1}, openvino, 180.0, {}),
        (
            {"backend": "onnxruntime", "onnxruntime.precision": "fp32", "onnxruntime.execution_mode": "parallel"}
            | {"batch_size": 8, "instances": 1, "threads_per_instance": 2},
            onnxruntime,
            50.0,
            {},
        ),
    ):
        attrs = {**attrs, "budget": {"total_s": 10.0}, "measurement": {"throughput_ci_rel": 0.0}}
        recorded.add_trial(
            optuna.trial.create_trial(params=params, distributions={**shared, **dists}, value=value, user_attrs=attrs)
        )
    rows = replay.merge_repeats(replay.read_table(recorded))
    tally = replay.LayoutTally()
    curve = replay.replay("default", recorded, rows, 20.0, {}, 0, tally)
    assert (tally.exact, tally.unrecorded) == (1, 0)
    assert [worth for _, worth in curve] == [100.0, 180.0]


def test_the_replay_measures_a_language_models_split_before_its_quantized_families_without_int8_dot_products():
    """A generation table from a CPU without int8 dot products: the default replays the baseline's split
    before inductor's int8 activations (expected to lose there), while `quantized-first` (ordered as on a
    CPU with int8 dot products, where they go first) spends 100 s on them first and has not reached the
    split when the 30 s budget ends."""
    replay = load_bench_replay()
    categorical = optuna.distributions.CategoricalDistribution
    distributions = {
        "backend": categorical(["eager", "inductor"]),
        "eager.precision": categorical(["fp32"]),
        "inductor.precision": categorical(["da8w8"]),
        "sequences": categorical([1]),
        "instances": categorical([1, 2]),
        "threads_per_instance": categorical([1, 2]),
    }
    base = {"backend": "eager", "eager.precision": "fp32", "sequences": 1, "instances": 1, "threads_per_instance": 2}
    recorded = optuna.create_study(direction="maximize")
    recorded.set_user_attr("spec", {"objective": "throughput", "task": "generate"})
    recorded.set_user_attr("fingerprint", {"hardware": {"physical_cores": 2}})
    for params, value, cost, attrs in (
        (base, 100.0, 10.0, {"baseline": True}),
        (
            {"backend": "inductor", "inductor.precision": "da8w8", **{k: base[k] for k in list(base)[2:]}},
            40.0,
            100.0,
            {"coverage": True},
        ),
        ({**base, "instances": 2, "threads_per_instance": 1}, 180.0, 10.0, {}),
    ):
        attrs = {**attrs, "budget": {"total_s": cost}, "measurement": {"throughput_ci_rel": 0.01}}
        recorded.add_trial(
            optuna.trial.create_trial(
                params=params, distributions={k: distributions[k] for k in params}, value=value, user_attrs=attrs
            )
        )
    rows = replay.merge_repeats(replay.read_table(recorded))

    def best_by(strategy: str, seconds: float) -> float:
        curve = replay.replay(strategy, recorded, rows, 30.0, {"avx2": True}, 0, replay.LayoutTally())
        return max(best for clock, best in curve if clock <= seconds)

    assert best_by("default", 30.0) == pytest.approx(180.0, rel=0.05)
    assert best_by("quantized-first", 30.0) == pytest.approx(100.0, rel=0.05)


def test_measure_seconds_takes_a_longest_window_too():
    """--measure-seconds MIN-MAX: the window's cap is the user's MAX; MIN alone keeps 4x (at least +10 s)."""
    from autotune.api import measure_settings, measure_window

    assert measure_window("0.3s-2s") == (0.3, 2.0)
    assert measure_window("5s") == (5.0, None)
    assert measure_settings(*measure_window("0.3s-2s")[:1], max_s=2.0).window_max_s == 2.0
    assert measure_settings(5.0).window_max_s == 20.0 and measure_settings(0.3).window_max_s == 10.3


def test_every_command_prints_its_help(capsys):
    """A help text is formatted by argparse (% is its escape): one unescaped % broke `search --help`."""
    import argparse

    from autotune.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert "search" in commands
    for name in commands:
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([name, "--help"])
        assert exited.value.code == 0, name
        assert f"usage: autotune {name}" in capsys.readouterr().out.replace("\n", " ")

"""What a user sees and takes away: the leaderboard, the launch script, autotune.load, verify."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import FAST, closest_candidate, rerun_while_noisy, run_autotune, tiny


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, end_to_end):
    """A finished study: eager fp32, two instances of one core, jemalloc; best.json and launch.sh exported."""
    searcher = end_to_end(tmp_path_factory.mktemp("tuned"))
    space = searcher.space(batch_size=[4], instances=[2], threads_per_instance=[1], allocator=["jemalloc"])
    # a trial flagged noisy (another process on its cores) never wins: resume, one more trial
    result = rerun_while_noisy(lambda: searcher.search(space=space, trials=1))
    assert result.returncode == 0, result.stderr
    exported = searcher("export", "--study", "s", "--format", "sh")
    assert exported.returncode == 0, exported.stderr
    return searcher.workdir


SERVE = """
import json, os, sys
import torch
import autotune

infer = autotune.load()
torch.manual_seed(0)
x = torch.randn(infer.config.batch_size, 3, 16, 16)
out = infer(x)
numpy_same = bool(torch.equal(torch.as_tensor(infer(x.numpy())), torch.as_tensor(out)))  # numpy arrays taken too
try:
    infer([[0.0]])
    refused = None
except TypeError as exc:
    refused = str(exc)
instance = int(os.environ["AUTOTUNE_INSTANCE"])
with open(f"served-{instance}.json", "w") as f:  # one file per instance: concurrent writes to one pipe may interleave
    json.dump({"instance": instance, "of": int(os.environ["AUTOTUNE_INSTANCES"]),
               "cpus": sorted(os.sched_getaffinity(0)), "out": out.tolist(),
               "preload": os.environ.get("LD_PRELOAD", ""), "numpy_same": numpy_same, "refused": refused}, f)
"""


def test_the_launch_script_starts_your_program_pinned_and_load_gives_the_tuned_model(tuned):
    script = tuned / "studies" / "s" / "launch.sh"
    (tuned / "serve.py").write_text(SERVE)
    done = subprocess.run(
        ["bash", str(script), sys.executable, "serve.py"], cwd=tuned, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = sorted((json.loads(path.read_text()) for path in tuned.glob("served-*.json")), key=lambda r: r["instance"])
    assert [r["instance"] for r in lines] == [0, 1] and all(r["of"] == 2 for r in lines)
    assert len(lines[0]["cpus"]) == 1 and lines[0]["cpus"] != lines[1]["cpus"]  # one core each, disjoint
    assert all("jemalloc" in r["preload"] for r in lines)
    # The tuned callable computes what the model with the study's weights computes.
    best = json.loads((tuned / "studies" / "s" / "best.json").read_text())
    from tiny_models import TinyCNN

    model = TinyCNN().eval()
    model.load_state_dict(torch.load(best["job"]["model"]["weights_path"], weights_only=True))
    torch.manual_seed(0)
    expected = model(torch.randn(4, 3, 16, 16))
    assert torch.allclose(torch.tensor(lines[0]["out"]), expected, atol=1e-5)
    assert all(r["numpy_same"] for r in lines)  # a numpy batch gives the same outputs as the tensor
    assert "takes torch tensors or numpy arrays (a batch of 4), got list" in lines[0]["refused"]


def test_load_refuses_a_process_not_started_as_tuned(tuned):
    (tuned / "serve.py").write_text(SERVE)
    env = {
        "AUTOTUNE_BEST": str(tuned / "studies" / "s" / "best.json"),
        "PATH": "/usr/bin:/bin",
        "AUTOTUNE_INSTANCE": "0",
        "AUTOTUNE_INSTANCES": "1",
    }
    done = subprocess.run([sys.executable, "serve.py"], cwd=tuned, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert "TunedEnvironmentMismatch" in done.stderr and "libjemalloc" in done.stderr and "launch.sh" in done.stderr


def test_show_prints_the_leaderboard_and_failures_grouped_by_cause(searcher):
    space = searcher.space(batch_size=[2, 4], baseline={"batch_size": 2})
    assert searcher.search(model=tiny("crashing"), space=space, trials=1).returncode == 0
    study = searcher.study()
    for _ in range(2):  # the same config at the batch size the model crashes at
        study.enqueue_trial({**study.trials[0].params, "batch_size": 4})
    assert searcher.search(model=tiny("crashing"), space=space, trials=2).returncode == 0
    shown = searcher("show", "--study", "s")
    assert shown.returncode == 0, shown.stderr
    assert "3 trials: 1 COMPLETE, 2 FAIL" in shown.stdout
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.stdout.splitlines() if line.startswith("│")]
    assert rows[0][:2] == ["1", "0 (baseline)"] and rows[0][-1] == "1.00x"
    # grouped by the cause with its numbers masked, shown with the first trial's real cause and the trials
    assert ["FAIL", "2", "1, 2", "instance 0 killed by signal SIGABRT"] in rows
    assert "instance N" not in shown.stdout


def test_verify_remeasures_and_says_when_it_regressed_or_the_machine_differs(tuned):
    best_path = tuned / "studies" / "s" / "best.json"
    first = rerun_while_noisy(lambda: run_autotune("verify", str(best_path), "--repeats", "1", cwd=tuned))
    assert first.returncode in (0, 1), first.stderr
    assert "same hardware and software as when it was tuned" in first.stdout
    assert "samples/s here (median of the 1 clean runs of 1) vs" in first.stdout
    best = json.loads(best_path.read_text())
    best["metrics"]["throughput_sps"] *= 10  # as if it once ran ten times faster
    best["objective"]["revalidated_median"] = None
    best["fingerprint"]["hardware"]["cpu_model"] = "Some Other CPU"
    tampered = tuned / "tampered.json"
    tampered.write_text(json.dumps(best))
    second = rerun_while_noisy(lambda: run_autotune("verify", str(tampered), "--repeats", "1", cwd=tuned))
    assert second.returncode == 1, second.stderr
    assert "hardware: cpu_model 'Some Other CPU' -> " in second.stdout and "REGRESSED" in second.stdout


def test_the_independent_stopwatch_times_every_instance_in_a_plain_process(tuned):
    """`compare --independent`'s measurement of a non-OpenVINO winner: one stopwatch process per instance."""
    from autotune.remeasure.context import context_from_best
    from autotune.remeasure.crosscheck import independent_winner
    from autotune.results.best_json import read_best

    best = read_best(tuned / "studies" / "s" / "best.json")
    ctx = context_from_best(best)
    measured = independent_winner(best, tuned / "independent", 1.0, ctx.runtime(best.config.runtime))
    assert "autotune.stopwatch_process" in measured.tool and len(measured.commands) == 2
    assert len(measured.per_instance_sps) == 2 and all(sps > 0 for sps in measured.per_instance_sps)
    assert measured.throughput_sps == sum(measured.per_instance_sps)


def test_verify_and_compare_refuse_what_they_cannot_remeasure(cli, workdir):
    # what a study where no configuration met the drift bound exports: never timed
    (workdir / "nothing.json").write_text(json.dumps(closest_candidate()))
    result = cli("verify", str(workdir / "nothing.json"))
    assert result.returncode == 2 and "no timed winner" in result.stderr and "Traceback" not in result.stderr
    (workdir / "other.json").write_text(json.dumps({"meets_drift": False, "config": {}}))
    result = cli("verify", str(workdir / "other.json"))
    assert result.returncode == 2 and "best.json lacks its required 'schema'" in result.stderr
    assert "Traceback" not in result.stderr
    for name, why in (("other.json", "best.json lacks its required 'schema'"), ("nothing.json", "no timed winner")):
        compared = cli("compare", "--best", str(workdir / name))  # the same one line
        assert compared.returncode == 2 and why in compared.stderr and "Traceback" not in compared.stderr


def _run_on_a_terminal(args: list[str], cwd, timeout: float = 300) -> str:
    """Run with stdout and stderr on a pseudo-terminal, as a user at a shell would; return what it drew."""
    import os
    import pty
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        args, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "COLUMNS": "160"}
    )
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side closed: the program ended
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_live_progress_on_a_terminal_and_plain_lines_in_logs(searcher, workdir):
    space = searcher.space(batch_size=[2, 4])
    args = ["search", "--model", tiny(), "--input-shape", "3x16x16", "--space", str(space), "--trials", "3", *FAST]
    drawn = _run_on_a_terminal([sys.executable, "-m", "autotune.cli", *args, "--study", "tty"], workdir)
    assert "autotune search" in drawn and "used," in drawn and "left" in drawn  # the live panel
    assert "running: trial" in drawn and "best so far: trial" in drawn
    logged = searcher.search(space=space, trials=3, study="log")
    assert logged.returncode == 0, logged.stderr
    assert "\x1b" not in logged.stdout + logged.stderr and "\r" not in logged.stdout  # no control characters in a log
    assert len(re.findall(r"^trial +\d+ (COMPLETE|PRUNED|FAIL) ", logged.stdout, re.M)) == 3  # one plain line per trial
    assert "running: trial" not in logged.stdout


def test_a_latency_slo_keeps_only_configs_whose_p99_stays_under_it(searcher):
    space = searcher.space(batch_size=[2])

    def search(study: str, *slo: str):
        return searcher.search("--no-speed-pruning", *slo, space=space, trials=2, study=study)

    tight = search("tight", "--slo-ms", "0.0001")
    assert tight.returncode == 0, tight.stderr
    for trial in searcher.study("tight").trials:
        assert trial.state.name == "PRUNED" and trial.user_attrs["prune_reason"].startswith("latency SLO: p99")
        assert (
            trial.user_attrs["slo"]["met"] is False and trial.user_attrs["latency_ms"]["p99"] > 0.0001
        )  # measured, then refused
        assert trial.user_attrs["measurement"]["calls"] >= 100
    assert "no trial completed" in tight.stdout
    loose = search("loose", "--slo-ms", "100000")
    assert loose.returncode == 0, loose.stderr
    assert all(t.state.name == "COMPLETE" and t.user_attrs["slo"]["met"] for t in searcher.study("loose").trials)
    wrong = search("w", "--slo-ms", "5", "--objective", "latency")
    assert wrong.returncode == 2 and "--slo-ms" in wrong.stderr


def test_the_pareto_objective_exports_the_front_of_throughput_and_p99(searcher):
    space = searcher.space(batch_size=[1, 16], baseline={"batch_size": 1})
    result = searcher.search("--objective", "pareto", space=space, trials=4, study="p")
    assert result.returncode == 0, result.stderr
    study = searcher.study("p")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) >= 3 and all(t.values[1] == t.user_attrs["latency_ms"]["p99"] for t in complete)
    front = searcher.best("p")["pareto_front"]
    assert front and [p["throughput_sps"] for p in front] == sorted((p["throughput_sps"] for p in front), reverse=True)
    for point in front:  # nothing completed beats a front point on both objectives
        assert not any(t.values[0] > point["throughput_sps"] and t.values[1] < point["p99_ms"] for t in complete)

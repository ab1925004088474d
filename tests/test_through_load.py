"""What a program gets: `autotune.load()` converts nothing it need not, and `verify --through-load` times the
winner through it, in processes started by the launch script, beside the protocol's own runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import require, run_autotune, tiny
from tiny_models import PACE_S

import autotune
from autotune.machine.probe import probe_machine

BATCH = 4


def tuned_study(searcher, model: str, **space) -> dict:
    """best.json of a one-trial study. A trial flagged noisy (another process on its cores) never wins, and
    then nothing is exported: the study is resumed (one more trial of the same config), at most twice."""
    space_path = searcher.space(batch_size=[BATCH], **space)
    best_path = searcher.workdir / "studies" / "s" / "best.json"
    for _ in range(3):
        result = searcher.search(model=tiny(model), space=space_path, trials=1)
        if best_path.exists():
            return json.loads(best_path.read_text())
        assert "flagged as noisy" in result.stderr, result.stderr
    pytest.fail("every trial was flagged noisy three times: the machine is too busy for this test")


@pytest.fixture(scope="module")
def paced(tmp_path_factory, end_to_end):
    """An eager winner whose every call sleeps PACE_S: two one-core instances, jemalloc preloaded."""
    machine = probe_machine()
    require(machine.physical_cores >= 2, "two physical cores")
    require("jemalloc" in machine.allocators, "jemalloc")
    searcher = end_to_end(tmp_path_factory.mktemp("paced"))
    tuned_study(searcher, "paced", instances=[2], threads_per_instance=[1], allocator=["jemalloc"])
    return searcher.workdir


@pytest.fixture(scope="module")
def onnxruntime_winner(tmp_path_factory, end_to_end):
    searcher = end_to_end(tmp_path_factory.mktemp("ort"))
    tuned_study(
        searcher, "tiny_cnn", backends={"onnxruntime": {"precision": ["fp32"], "execution_mode": ["sequential"]}}
    )
    return searcher.workdir / "studies" / "s" / "best.json"


def spy_on(infer) -> list:
    """Record what the backend's run receives from autotune.load()'s callable (and still run it)."""
    seen, run = [], infer.runner.run
    infer.runner.run = lambda batch: (seen.append(batch), run(batch))[1]
    return seen


def test_load_hands_a_numpy_batch_to_onnxruntime_as_it_is(onnxruntime_winner):
    infer = autotune.load(onnxruntime_winner, check_environment=False)
    assert infer.runner.takes == "numpy"
    seen = spy_on(infer)
    x = np.random.default_rng(0).standard_normal((BATCH, 3, 16, 16), dtype=np.float32)
    from_numpy = infer(x)
    assert seen[-1][0] is x  # the very array: no trip through torch and back
    tensor = torch.from_numpy(x.copy())
    from_torch = infer(tensor)
    assert isinstance(seen[-1][0], np.ndarray) and np.shares_memory(seen[-1][0], tensor.numpy())  # a view, no copy
    np.testing.assert_allclose(from_numpy, from_torch)
    wide = x.astype(np.float64)  # what the backend cannot take: converted, to the same result
    np.testing.assert_allclose(infer(wide), from_numpy, rtol=1e-6)
    assert seen[-1][0].dtype == np.float32 and not np.shares_memory(seen[-1][0], wide)


def test_load_hands_a_tensor_to_a_torch_backend_as_it_is(paced):
    infer = autotune.load(paced / "studies" / "s" / "best.json", check_environment=False)
    assert infer.runner.takes == "torch"
    seen = spy_on(infer)
    x = torch.randn(BATCH, 3, 16, 16)
    infer(x)
    assert seen[-1][0] is x
    array = x.numpy().copy()
    infer(array)
    assert isinstance(seen[-1][0], torch.Tensor) and np.shares_memory(seen[-1][0].numpy(), array)


RUN_LINE = re.compile(
    r"run (\d)/2 through autotune\.load\(\): ([\d.]+) samples/s \(2 instances: (\d+) \+ (\d+) calls of (\d+) samples "
    r"in ([\d.]+) \+ ([\d.]+) s, windows overlapping (\d+)%\)"
)
PROTOCOL_LINE = re.compile(r"run (\d)/2: ([\d.]+) samples/s(.*)")
SUMMARY = re.compile(
    r"through autotune\.load\(\): ([\d.]+) samples/s \(median of (\d) runs, .* (\d+) calls in all\), ([+-][\d.]+)% "
    r"from the protocol's ([\d.]+) measured here in the same run"
)


@pytest.mark.timeout(900)
def test_verify_through_load_times_the_winner_as_a_program_runs_it(paced):
    best_path = paced / "studies" / "s" / "best.json"
    done = run_autotune("verify", str(best_path), "--repeats", "2", "--through-load", cwd=paced, timeout=800)
    assert done.returncode in (0, 1, 3), done.stderr  # the verdict depends on this machine's load; the lines do not
    out = done.stdout
    # Interleaved: each protocol run is followed by its run through load().
    order = [line.split(":")[0] for line in out.splitlines() if line.startswith("run ")]
    assert order == ["run 1/2", "run 1/2 through autotune.load()", "run 2/2", "run 2/2 through autotune.load()"]
    runs = [m.groups() for m in RUN_LINE.finditer(out)]
    assert len(runs) == 2, out
    ceiling = BATCH / PACE_S  # no call returns sooner than its sleep: an instance cannot do better than this
    figures = []
    for _, sps, calls0, calls1, batch, window0, window1, overlap in runs:
        assert int(batch) == BATCH and int(overlap) >= 80  # the instances were timed together
        rates = [int(calls0) * BATCH / float(window0), int(calls1) * BATCH / float(window1)]
        assert float(sps) == pytest.approx(sum(rates), rel=0.01)  # the figure is the calls counted over the window
        assert all(ceiling / 4 < rate <= ceiling for rate in rates), rates  # and what the sleep allows
        figures.append(float(sps))
    protocol_runs = [(float(m[2]), "noisy" not in m[3]) for m in PROTOCOL_LINE.finditer(out)]
    # Pairs whose protocol run was clean are compared (all pairs when none was).
    paired = [i for i, (_, clean) in enumerate(protocol_runs) if clean] or [0, 1]
    summary = SUMMARY.search(out)
    assert summary, out
    here, count, calls = float(summary[1]), int(summary[2]), int(summary[3])
    gap, protocol = float(summary[4]), float(summary[5])
    assert count == len(paired)
    assert here == pytest.approx(
        sum(figures[i] for i in paired) / len(paired), abs=0.02
    )  # median of 1 or 2 (each printed rounded)
    assert protocol == pytest.approx(sum(protocol_runs[i][0] for i in paired) / len(paired), abs=0.02)
    assert calls == sum(int(runs[i][2]) + int(runs[i][3]) for i in paired)
    assert gap == pytest.approx((here / protocol - 1) * 100, abs=0.06)
    # Independent of each other, both measure the same sleep-bound calls: close, not equal by construction.
    assert 1 / 1.5 < here / protocol < 1.5, out
    # Each process ran pinned where the protocol's instance of the same number ran, and loaded the tuned model.
    for i in range(2):
        for instance in range(2):
            through = json.loads((paced / "studies/s/verify" / f"load-{i}" / f"result-{instance}.json").read_text())
            protocol_instance = json.loads(
                (paced / "studies/s/verify" / str(i) / f"result-{instance}.json").read_text()
            )
            assert through["cpus"] == protocol_instance["cpus"] and len(through["cpus"]) == 1
            assert through["pid"] != protocol_instance["pid"] and through["load_s"] > 0


def test_verify_through_load_says_in_one_line_when_a_program_cannot_run_as_tuned(paced):
    """A best.json whose exported environment no longer holds (its allocator moved): the protocol's run, which
    builds its environment from the config, still works; a program started by the launch script does not."""
    best = json.loads((paced / "studies" / "s" / "best.json").read_text())
    best["environment"]["LD_PRELOAD"] = "/nonexistent/libjemalloc.so.2"
    moved = paced / "studies" / "s" / "moved.json"
    moved.write_text(json.dumps(best))
    done = run_autotune("verify", str(moved), "--repeats", "1", "--through-load", cwd=paced)
    assert done.returncode == 2 and "run 1/1: " in done.stdout, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "through autotune.load() the tuned config does not run here: the launch script exited with 1" in done.stderr
    assert "/nonexistent/libjemalloc.so.2 is not preloaded" in done.stderr

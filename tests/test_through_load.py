"""What a program gets: `autotune.load()` converts nothing it need not."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import FAST, require, run_autotune, tiny, write_space

import autotune
from autotune.machine.probe import probe_machine

ARGS = ["--input-shape", "3x16x16", "--study", "s", "--trials", "1", "--budget", "3m", *FAST]
BATCH = 4


def tuned_study(workdir, model: str, **space) -> dict:
    """best.json of a one-trial study. A trial flagged noisy (another process on its cores) never wins, and
    then nothing is exported: the study is resumed (one more trial of the same config), at most twice."""
    space_path = write_space(workdir / "space.yaml", batch_size=[BATCH], **space)
    best_path = workdir / "studies" / "s" / "best.json"
    for _ in range(3):
        result = run_autotune("search", "--model", tiny(model), *ARGS, "--space", str(space_path), cwd=workdir)
        if best_path.exists():
            return json.loads(best_path.read_text())
        assert "flagged as noisy" in result.stderr, result.stderr
    pytest.fail("every trial was flagged noisy three times: the machine is too busy for this test")


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    """An eager winner whose every call sleeps PACE_S: two one-core instances, jemalloc preloaded."""
    machine = probe_machine()
    require(machine.physical_cores >= 2, "two physical cores")
    require("jemalloc" in machine.allocators, "jemalloc")
    workdir = tmp_path_factory.mktemp("paced")
    tuned_study(workdir, "paced", instances=[2], threads_per_instance=[1], allocator=["jemalloc"])
    return workdir


@pytest.fixture(scope="module")
def onnxruntime_winner(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ort")
    tuned_study(
        workdir, "tiny_cnn", backends={"onnxruntime": {"precision": ["fp32"], "execution_mode": ["sequential"]}}
    )
    return workdir / "studies" / "s" / "best.json"


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

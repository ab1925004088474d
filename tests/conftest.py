"""Shared helpers: run the real CLI in a subprocess, write small search spaces, read studies."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

TESTS = Path(__file__).resolve().parent
TINY = TESTS / "tiny_models.py"
FAST = ["--measure-seconds", "0.3s-2s", "--eval-samples", "8", "--finalists", "0"]

# The tests run on shared cloud VMs whose hypervisor steals 5-10% of the CPUs for minutes at a time, past
# the 5% a measurement may lose by default; no test here times anything, so they tolerate it as a user on
# such a VM would (tests/test_measure.py checks the default and this variable themselves).
os.environ.setdefault("AUTOTUNE_MAX_STEAL", "0.5")


def require(available: bool, what: str) -> None:
    """Skip a test whose machine lacks `what`, except in CI, which installs it: there it is a failure,
    so a missing allocator, numactl or core is never a silent skip."""
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide {what} (make setup installs it as root)")
    pytest.skip(f"{what} is not available here (make setup installs it as root)")


def tiny(name: str = "tiny_cnn") -> str:
    return f"{TINY}:{name}"


def run_autotune(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


NOISY_REFUSAL = "was flagged as noisy"


def assert_trials_ran(result: subprocess.CompletedProcess) -> None:
    """The search ran its trials: exit 0, or the one refusal a loaded machine causes (every measurement
    flagged as noisy, so no winner is exported, exit 2). For tests whose subject is what a trial did, not
    which one won: a shared machine must not fail them, and any other error still does."""
    if result.returncode == 2 and NOISY_REFUSAL in result.stderr:
        return
    assert result.returncode == 0, result.stderr


def flagged_noisy(result: subprocess.CompletedProcess) -> bool:
    """The outcome a loaded machine causes: a search whose every trial was flagged noisy (exit 2, no
    winner), or a verify whose every run was (exit 3, no verdict)."""
    return (result.returncode == 2 and NOISY_REFUSAL in result.stderr) or (
        result.returncode == 3 and "no verdict" in result.stdout
    )


def rerun_while_noisy(command: Callable[[], subprocess.CompletedProcess], attempts: int = 3):
    """Runs an autotune command again while a loaded machine flags all it measured: a search resumes
    with more trials, a verify measures again. For tests that need one clean measurement."""
    for _ in range(attempts - 1):
        result = command()
        if not flagged_noisy(result):
            return result
    return command()


def write_space(path: Path, **overrides) -> Path:
    space = {
        "batch_size": [2, 4],
        "allocator": ["glibc"],
        "instances": [1],
        "threads_per_instance": "auto",
        "backends": {"eager": {"precision": ["fp32"], "memory_format": ["contiguous"]}},
    }
    space.update(overrides)
    space.setdefault("baseline", {"batch_size": space["batch_size"][0]})
    path.write_text(yaml.safe_dump(space))
    return path


def load_study(workdir: Path, name: str) -> optuna.study.Study:
    storage = f"sqlite:///{workdir / 'studies' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage)


def states(study: optuna.study.Study) -> list[str]:
    return [t.state.name for t in study.trials]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """The tiny Llama trained on the standard library's docstrings (tiny_lm.train_llama), trained once for
    every test that reads it: its weights, held-out text and perplexity are only read."""
    from tiny_lm import train_llama

    return train_llama(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="session")
def postgres():
    """A function returning the URL of a new database on a real PostgreSQL server on loopback."""
    from db_servers import start_postgres

    yield from start_postgres()


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory):
    """The same on a real MariaDB (MySQL) server."""
    from db_servers import start_mariadb

    yield from start_mariadb(tmp_path_factory.mktemp("mariadb"))


def openvino_computes_bf16() -> bool:
    """What OpenVINO itself says of one MatMul compiled with a bf16 hint on this CPU: whether it runs in bf16.
    Not the same as its BF16 capability: an Ice Lake Xeon (AVX-512 without BF16) lists none, yet runs
    the MatMul in bf16; an AVX2-only CPU computes it in f32."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([4, 64], np.float32)
    weights = ops.constant(np.ones((64, 64), np.float32))
    model = ov.Model([ops.matmul(x, weights, False, False)], [x])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
    return any(
        op.get_rt_info()["layerType"].astype(str) == "FullyConnected"
        and op.get_rt_info()["runtimePrecision"].astype(str) == "bf16"
        for op in compiled.get_runtime_model().get_ordered_ops()
    )

"""Shared helpers: run the real CLI in a subprocess, write small search spaces, read studies; and the test tiers.

Tiers come from the fixtures a test uses, never from a hand-kept list (`pytest_collection_modifyitems`):
a test whose fixtures run a real search end to end (`searcher`, `end_to_end`, the session's trained model)
is `slow`, unless it is one of the few `smoke` tests the fast tier keeps; one that starts a database
server is `needs_db`, a browser `browser`, the IPEX runtime `ipex`. `make test` runs `-m "not slow"`,
`make test-all` everything.
"""

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


def benchmark_script(name: str, registered_as: str | None = None):
    """docs/benchmarks/NAME.py as a module (the scripts are not a package), registered in sys.modules under
    `registered_as` (default: its name) so the dataclasses it defines find their module."""
    import importlib.util

    path = TESTS.parent / "docs" / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(registered_as or name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[registered_as or name] = module
    spec.loader.exec_module(module)
    return module


def require(available: bool, what: str, how: str = "make setup installs it as root") -> None:
    """Skip a test whose machine lacks `what`, except in CI, which installs it: there it is a failure,
    so a missing allocator, numactl or core is never a silent skip."""
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide {what} ({how})")
    pytest.skip(f"{what} is not available here ({how})")


def tiny(name: str = "tiny_cnn") -> str:
    return f"{TINY}:{name}"


def run_autotune(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([*AUTOTUNE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


LM = TESTS / "tiny_lm.py"
# A language model's quick workload: short prompts, few tokens, a small drift set, no finalist round.
GENERATE = ["--prompt-tokens", "32", "--new-tokens", "8", "--finalists", "0"]
QUICK_GENERATION = ["--measure-seconds", "0.3s-1s", "--no-speed-pruning"]


AUTOTUNE = [sys.executable, "-m", "autotune.cli"]  # the command line, as a test starts it itself (Popen)


class Autotune:
    """The real command line in a subprocess, run in one test's folder, and what it leaves there."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def __call__(
        self, *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        return run_autotune(*args, cwd=self.workdir, timeout=timeout, env=env)

    def space(self, name: str = "space.yaml", **overrides) -> Path:
        return write_space(self.workdir / name, **overrides)

    def study(self, name: str = "s") -> optuna.study.Study:
        return load_study(self.workdir, name)

    def best(self, study: str = "s") -> dict:
        import json

        return json.loads((self.workdir / "studies" / study / "best.json").read_text())


class Searcher(Autotune):
    """Autotune that also runs real searches: what a test gets through the `searcher` fixture, which makes it
    an end-to-end (slow) test."""

    def search(
        self, *extra: str, timeout: float = 600, env: dict[str, str] | None = None, **settings
    ) -> subprocess.CompletedProcess:
        """A tiny classification search (`search_args`), run to its end."""
        return self(*self.search_args(*extra, **settings), timeout=timeout, env=env)

    def search_args(
        self,
        *extra: str,
        model: str | None = None,
        input_shape: str | None = "3x16x16",
        space: Path | None = None,
        study: str | None = "s",
        trials: int | None = None,
        budget: str = "3m",
        quick: bool = True,
    ) -> list[str]:
        """`autotune search`'s words for a tiny classification search: the tiny CNN on 3x16x16 in the default
        small space, short windows (`study=None`: the study takes the model's name)."""
        args = ["search", "--model", model or tiny(), "--budget", budget, "--space", str(space or self.space())]
        if study is not None:
            args += ["--study", study]
        if input_shape:
            args += ["--input-shape", input_shape]
        if trials is not None:
            args += ["--trials", str(trials)]
        return [*args, *(FAST if quick else []), *extra]

    def generate(
        self,
        *extra: str,
        space: Path,
        model: str = "tiny_llama",
        trials: int | None = None,
        trained: dict | None = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess:
        """A short text-generation search of a tiny decoder from tests/tiny_lm.py; with `trained` (the
        session's trained model), its weights and held-out text, perplexity allowed to rise 2%."""
        args = ["search", "--model", f"{LM}:{model}", "--space", str(space)]
        if trials is not None:
            args += ["--trials", str(trials)]
        if trained is not None:
            args += ["--weights", str(trained["weights"]), "--data", str(trained["text"])]
            args += ["--drift-metric", "perplexity", "--max-drift", "2%"]
        return self(*args, *QUICK_GENERATION, *GENERATE, *extra, timeout=timeout)


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


def generation_space(path: Path, backends: dict, sequences=(2,), allocators=("glibc",)) -> Path:
    """A text-generation search space: the given backends, one instance on all cores, GNU OpenMP."""
    space = {
        "sequences": list(sequences),
        "allocator": list(allocators),
        "instances": [1],
        "threads_per_instance": "auto",
        "openmp": ["gnu"],
        "backends": backends,
    }
    path.write_text(yaml.safe_dump(space))
    return path


def measurement(ci_rel: float | None = 0.01, **fields):
    """A stored measurement (records/metrics.Measurement) of 20 calls of batch 2 in a second, its throughput
    known to `ci_rel`; `fields` change any other."""
    from autotune.records.metrics import Measurement

    defaults = dict(common_window_s=1.0, calls=20, samples=40, ci_confidence=0.95, ci_target_rel=0.02)
    record = {**defaults, "samples_per_call": 2, **fields}
    return Measurement(throughput_ci_rel=ci_rel, ci_target_met=ci_rel is not None and ci_rel <= 0.02, **record)


def trial_metrics(throughput_sps: float):
    """A completed trial's metrics, as the search records them: calls of 10 ms, a clean measurement."""
    import numpy as np

    from autotune.measure.stopwatch import latency_summary
    from autotune.records.metrics import TrialMetrics

    latency = latency_summary(np.full(20, 0.01))
    return TrialMetrics(throughput_sps=throughput_sps, latency_ms=latency, measurement=measurement())


def closest_candidate() -> dict:
    """The best.json a study exports when no configuration met the drift bound (never timed), written by hand."""
    from autotune.records.config import TrialConfig

    return {
        "schema": "autotune.best/2",
        "meets_drift": False,
        "study": {"name": "s", "trial": 0},
        "objective": {"name": "throughput"},
        "selection": "NO configuration met the drift bound",
        "model": {},
        "config": TrialConfig("eager", "bf16", 1).to_json(),
        "drift": {},
        "job": None,
    }


def load_study(workdir: Path, name: str) -> optuna.study.Study:
    storage = f"sqlite:///{workdir / 'studies' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage)


def states(study: optuna.study.Study) -> list[str]:
    return [t.state.name for t in study.trials]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def cli(workdir: Path) -> Autotune:
    """The command line in this test's folder, for commands that search nothing (bad input, help, probe)."""
    return Autotune(workdir)


@pytest.fixture(scope="session")
def end_to_end() -> type[Searcher]:
    """Searcher, for fixtures of any scope that run real searches: depending on it makes a test `slow`."""
    return Searcher


@pytest.fixture
def searcher(end_to_end: type[Searcher], workdir: Path) -> Searcher:
    """Real searches end to end in this test's folder (`searcher.search(...)`, `searcher.generate(...)`)."""
    return end_to_end(workdir)


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """The tiny Llama trained on the standard library's docstrings (tiny_lm.train_llama), trained once for
    every test that reads it: its weights, held-out text and perplexity are only read."""
    from tiny_lm import train_llama

    return train_llama(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="session")
def ipex_runtime():
    """The IPEX runtime `make setup` builds beside the main one (.venv-ipex: torch 2.8 and IPEX)."""
    from autotune.machine.runtimes import Runtime, default_ipex_runtime

    python = default_ipex_runtime()
    assert python is not None, "the IPEX runtime .venv-ipex is missing: make setup builds it"
    return Runtime("ipex", str(python), "auto")


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


# ---- tiers ---------------------------------------------------------------------------------------------
# Which marker a fixture gives the tests that use it (directly or through another fixture).
FIXTURE_MARKERS = {
    "end_to_end": "slow",  # real searches in fresh processes
    "trained": "slow",  # trains the tiny Llama (once per session, a minute)
    "postgres": "needs_db",
    "mariadb": "needs_db",
    "browser": "browser",
    "chromium": "browser",
    "ipex_runtime": "ipex",
}
# A test of the fast tier that takes longer than this is named at the end of the run: its fixtures should
# make it slow, or it should get faster.
FAST_TIER_LIMIT_S = 60.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in used and not (marker == "slow" and item.get_closest_marker("smoke")):
                item.add_marker(marker)


_slow_in_fast_tier: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "slow" not in report.keywords and report.duration > FAST_TIER_LIMIT_S:
        _slow_in_fast_tier.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _slow_in_fast_tier:
        terminalreporter.section("fast-tier tests over a minute")
        for nodeid, seconds in _slow_in_fast_tier:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")

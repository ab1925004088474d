"""Runtimes: probing real Python environments, routing trials to the one that can run them, and the
IPEX runtime `make setup` builds (torch 2.8 + intel-extension-for-pytorch) next to the main one."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST, assert_trials_ran, load_study, tiny, write_space

from autotune.machine.runtimes import discover_runtimes, probe_runtime


@pytest.fixture
def probe_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "autotune" / "runtimes.json"


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A Python environment without torch: it can run no backend."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def test_the_main_runtime_reports_its_torch_and_backends(probe_cache):
    runtimes = discover_runtimes()
    main = runtimes["main"]
    assert main.torch == importlib.metadata.version("torch")
    assert all(main.runs(b) for b in ("eager", "inductor", "onnxruntime", "openvino", "torchao"))
    assert not main.runs("ipex") and "intel_extension_for_pytorch" in main.backends["ipex"]
    assert main.openmp["gnu"].endswith(".so.1") and main.openmp["intel"].endswith("libiomp5.so")
    assert str(Path(main.python)) in json.loads(probe_cache.read_text())


def test_a_probe_is_cached_until_the_environment_changes(probe_cache, bare_venv):
    python = bare_venv / "bin" / "python"
    first = probe_runtime(python, "bare", "explicit")
    assert first.torch is None and not any(first.runs(b) for b in first.backends)
    assert "torch" in first.backends["eager"]  # the reason: torch does not import there
    cache = json.loads(probe_cache.read_text())
    cache[str(python)]["report"]["python_version"] = "from-cache"
    probe_cache.write_text(json.dumps(cache))
    assert probe_runtime(python, "bare", "explicit").python_version == "from-cache"
    site = next(bare_venv.glob("lib/python*/site-packages"))
    (site / "newly_installed").mkdir()  # what an install does to site-packages
    assert probe_runtime(python, "bare", "explicit").python_version != "from-cache"


def test_a_runtime_that_does_not_exist_is_one_clear_line(cli, workdir):
    for command in (["search", "--model", tiny(), "--input-shape", "3x16x16"], ["probe"]):
        result = cli(*command, "--runtime", str(workdir / "no-such-venv"))
        assert result.returncode == 2
        assert (
            result.stderr.strip().count("\n") == 0
            and "does not exist" in result.stderr
            and "Traceback" not in result.stderr
        )


def test_a_runtime_lacking_every_backend_of_the_space_is_refused(cli, bare_venv):
    space = cli.space()
    result = cli(
        *("search", "--model", tiny(), "--input-shape", "3x16x16", "--space", str(space)),
        *("--runtime", str(bare_venv), "--trials", "1", *FAST),
    )
    assert result.returncode == 2, result.stderr
    assert (
        "runs none of the space's backends" in result.stderr
        and "torch" in result.stderr
        and "Traceback" not in result.stderr
    )


@pytest.mark.timeout(900)
def test_ipex_trials_run_in_the_ipex_runtime_beside_main_runtime_trials(searcher, workdir, ipex_runtime):
    space = write_space(
        workdir / "space.yaml",
        backends={
            "eager": {"precision": ["fp32"]},
            "ipex": {"precision": ["bf16", "int8"], "graph": ["torchscript"]},
            "openvino": {"precision": ["fp32"], "streams": [1]},
        },
    )
    result = searcher.search("--no-speed-pruning", space=space, study=None, trials=4, budget="10m", timeout=900)
    assert result.returncode == 0, result.stderr
    assert "ipex runs in runtime ipex" in result.stdout
    study = load_study(workdir, "tiny_cnn")
    main_torch = importlib.metadata.version("torch")
    by_backend: dict[str, list] = {}
    for trial in study.trials:
        assert trial.state.name == "COMPLETE", trial.user_attrs.get("fail_cause")
        by_backend.setdefault(trial.user_attrs["config"]["backend"], []).append(trial)
    assert sorted(by_backend) == ["eager", "ipex", "openvino"] and len(by_backend["ipex"]) == 2
    for backend, trials in by_backend.items():
        for trial in trials:
            runtime = trial.user_attrs["runtime"]
            expected = ("ipex", "2.8.0") if backend == "ipex" else ("main", main_torch)
            assert (runtime["name"], runtime["torch"]) == expected
            assert trial.user_attrs["torch_version"].startswith(expected[1])  # what the worker itself imported
            assert trial.user_attrs["drift"]["relative_l2"] < 0.05
    int8 = next(t for t in by_backend["ipex"] if t.user_attrs["config"]["precision"] == "int8")
    assert int8.user_attrs["artifact"]["details"]["quantization"].startswith("IPEX static int8")
    best = json.loads((workdir / "studies" / "tiny_cnn" / "best.json").read_text())
    winner = study.trials[best["study"]["trial"]]
    assert (
        best["runtime"]["name"] == winner.user_attrs["runtime"]["name"]
        and best["runtime"]["torch"] == winner.user_attrs["runtime"]["torch"]
    )
    assert best["runtime"]["python"] in best["launch"]["commands"][0]


@pytest.mark.timeout(600)
def test_an_extra_runtime_compares_torch_versions_in_one_study(searcher, workdir, ipex_runtime):
    space = write_space(workdir / "space.yaml", batch_size=[4], backends={"eager": {"precision": ["fp32"]}})
    result = searcher.search(
        "--runtime",
        str(Path(ipex_runtime.python).parent.parent),
        "--no-speed-pruning",
        space=space,
        study=None,
        trials=2,
    )
    assert_trials_ran(result)
    study = load_study(workdir, "tiny_cnn")
    versions = {
        t.user_attrs["runtime"]["name"]: t.user_attrs["torch_version"]
        for t in study.trials
        if t.state.name == "COMPLETE"
    }
    assert set(versions) == {"main", "venv-ipex"}
    assert versions["venv-ipex"].startswith("2.8.0") and versions["main"].startswith(
        importlib.metadata.version("torch")
    )


@pytest.mark.timeout(600)
def test_intel_openmp_and_huge_pages_reach_the_trial_process(searcher, workdir):
    space = write_space(workdir / "space.yaml", batch_size=[4], openmp=["intel"], kmp_blocktime=[0], thp=[True])
    result = searcher.search(space=space, study=None, trials=1)
    assert_trials_ran(result)
    trial = load_study(workdir, "tiny_cnn").trials[0]
    assert trial.state.name == "COMPLETE", trial.user_attrs.get("fail_cause")
    seen = trial.user_attrs["instances"][0]["openmp"]  # what the worker found mapped in its own process
    assert seen["intel"] and seen["intel"][0].endswith("libiomp5.so")
    assert (seen["KMP_BLOCKTIME"], seen["THP_MEM_ALLOC_ENABLE"]) == ("0", "1")
    assert trial.user_attrs["env"]["LD_PRELOAD"].endswith("libiomp5.so")


def test_the_generation_probe_is_cached_until_the_runtime_or_where_its_tools_lie_changes(probe_cache, tmp_path):
    """Which generation precisions and engines a runtime runs took 5-10 s per runtime at every search's
    start (torchao's configurations tried, every engine imported); it is kept with the runtime's report and
    made again when the packages, autotune's backends or a variable naming an engine's tools change."""
    from autotune.backends.llamacpp.gguf_export import CONVERTER_ENV
    from autotune.machine.generation_probe import generation_precisions_unavailable

    main = discover_runtimes()["main"]
    first = generation_precisions_unavailable(main, {})
    assert "llamacpp" not in first  # make setup puts llama.cpp's converter in the main runtime
    cache = json.loads(probe_cache.read_text())
    slot = f"{main.python} generation"
    cache[slot]["report"]["unavailable"]["fp32"] = "from the cache"
    probe_cache.write_text(json.dumps(cache))
    assert generation_precisions_unavailable(main, {})["fp32"] == "from the cache"
    moved = generation_precisions_unavailable(main, {CONVERTER_ENV: str(tmp_path / "nowhere")})
    assert "fp32" not in moved and "llama.cpp's converter is not in" in moved["llamacpp"]

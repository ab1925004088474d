"""A backend is one plugin: a package outside autotune registers it through the `autotune.backends`
entry-point group, and a study runs it like a built-in one (in the trials' own processes too), with
nothing under autotune/ naming it. A plugin that does not load is left out in one line, never breaking
autotune."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import TESTS, assert_trials_ran, tiny


def install(site: Path, distribution: str, entry_points: dict[str, str]) -> None:
    """What installing a distribution with these entry points leaves on the path: its dist-info."""
    info = site / f"{distribution}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[autotune.backends]\n{lines}")


def plugin_env(tmp_path: Path) -> dict[str, str]:
    """The toy backend (tests/toy_backend.py) and a broken plugin installed on the path; a cache of runtime
    reports of its own, as the main runtime's now lists the toy backend."""
    site = tmp_path / "site"
    install(site, "toy_backend", {"toy": "toy_backend"})
    install(site, "broken_backend", {"broken": "broken_backend"})
    (site / "broken_backend.py").write_text('raise ImportError("this plugin needs a library that is not here")\n')
    # an entry point may name any object with the members, not only a module; this one takes a built-in's name
    install(site, "clashing_backend", {"clash": "clashing_backend:EAGER"})
    (site / "clashing_backend.py").write_text(
        "import dataclasses, types\nimport toy_backend\n"
        "EAGER = types.SimpleNamespace(SPEC=dataclasses.replace(toy_backend.SPEC, name='eager'), "
        "unavailable=toy_backend.unavailable, unsupported=toy_backend.unsupported, prepare=toy_backend.prepare)\n"
    )
    path = [str(site), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


BROKEN = "broken_backend does not load (ImportError: this plugin needs a library that is not here)"
CLASH = "clashing_backend:EAGER is refused: a classify backend named 'eager' is registered already"


def test_a_plugin_backend_runs_a_study_beside_eager(searcher, tmp_path):
    env = plugin_env(tmp_path)
    backends = {"eager": {"precision": ["fp32"]}, "toy": {"grad_mode": ["inference_mode", "no_grad"]}}
    result = searcher.search("--no-speed-pruning", space=searcher.space(backends=backends), trials=3, env=env)
    assert_trials_ran(result)
    assert f"note: backend plugin broken left out: {BROKEN}" in result.stdout, result.stdout
    assert f"note: backend plugin clash left out: {CLASH}" in result.stdout, result.stdout
    study = searcher.study()
    assert study.trials[0].user_attrs["baseline"] is True and study.trials[0].params["backend"] == "eager"
    toy = [t for t in study.trials if t.params.get("backend") == "toy"]
    assert toy and toy[0].state.name == "COMPLETE", [(t.params, t.user_attrs.get("fail_cause")) for t in study.trials]
    assert toy[0].user_attrs["drift"] is not None and toy[0].params["toy.grad_mode"] == "inference_mode"
    assert all(pid != os.getpid() for pid in toy[0].user_attrs["pids"])  # the trial's own process found it too

    probe = searcher("probe", env=env, timeout=600)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert (
        "plugin       toy: classify backend toy (eager PyTorch under inference_mode or no_grad, from a plugin)" in lines
    )
    assert f"plugin       broken left out: {BROKEN}" in lines and f"plugin       clash left out: {CLASH}" in lines
    main_backends = next(line for line in lines if line.startswith("  backends "))
    assert "toy" in main_backends.split(), main_backends


def test_an_unknown_backend_error_says_which_plugins_did_not_load(cli, tmp_path):
    space = cli.space(backends={"broken": {}})
    result = cli(
        "search", "--model", tiny(), "--input-shape", "3x16x16", "--space", str(space), env=plugin_env(tmp_path)
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert (
        "unknown backend 'broken'; known: eager, inductor, ipex, onnxruntime, openvino, torchao, toy" in result.stderr
    )
    assert f"(backend plugins left out: broken: {BROKEN}; clash: {CLASH})" in result.stderr


def test_nothing_under_autotune_names_the_toy_backend():
    package = TESTS.parent / "autotune"
    named = [str(path) for path in package.rglob("*.py") if "toy" in path.read_text().lower()]
    assert not named, named

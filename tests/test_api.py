"""`autotune.search(...)` from Python: a real study in this process (its trials in fresh ones), the
model given as a reference or as its factory function, in-memory models refused, and best.json read
back as a typed record (autotune.records.best.BestJson)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import NOISY_REFUSAL, TINY, tiny, write_space
from rich.console import Console
from tiny_models import TinyCNN

import autotune
from autotune.api import model_reference
from autotune.cli import build_parser, search_summary
from autotune.common.json_record import RecordError
from autotune.records.best import BestJson
from autotune.records.config import TrialConfig
from autotune.records.options import SearchOptions

# The CLI tests' FAST settings (tests/conftest.py), as keyword arguments; a measurement window in seconds.
FAST = {"input_shape": "3x16x16", "measure_seconds": 0.3, "eval_samples": 8, "finalists": 0, "budget": "3m"}


def quiet_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=160, highlight=False, soft_wrap=True), out


def complete(study: optuna.study.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


@pytest.fixture(scope="module")
def searched(tmp_path_factory, end_to_end):
    """A study of two trials run through autotune.search, the model named as the CLI takes it."""
    workdir = tmp_path_factory.mktemp("api")
    console, out = quiet_console()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    result = autotune.search(
        tiny(),
        study="s",
        space=write_space(workdir / "space.yaml", batch_size=[2, 4]),
        trials=2,
        studies_dir=workdir / "studies",
        console=console,
        speed_pruning=False,  # the second trial is sampled: a one-thread batch 2 was pruned at screening once
        **FAST,
    )
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers  # the caller's handlers are back
    return workdir, result, out.getvalue()


@pytest.mark.smoke
def test_search_returns_the_study_and_best_json_as_a_typed_record(searched):
    workdir, result, printed = searched
    assert isinstance(result, autotune.Result) and not result.interrupted
    assert "RANDOM INIT" in printed and "created study 's'" in printed

    # Result.study is the stored Optuna study: the trials ran, each in a fresh process.
    assert result.study.study_name == "s" and len(complete(result.study)) == 2
    stored = optuna.load_study(study_name="s", storage=f"sqlite:///{workdir / 'studies' / 's' / 'study.db'}")
    assert [t.number for t in complete(stored)] == [t.number for t in complete(result.study)]
    assert all(os.getpid() not in t.user_attrs["pids"] for t in complete(result.study))
    assert result.study.user_attrs["spec"]["measure"]["window_min_s"] == 0.3  # a duration given in seconds

    # Result.best says what best.json on disk says, typed.
    assert result.best_path == workdir / "studies" / "s" / "best.json"
    on_disk = json.loads(result.best_path.read_text())
    best = result.best
    assert isinstance(best, BestJson) and best.to_json() == on_disk
    assert best.schema == on_disk["schema"] == "autotune.best/2" and best.meets_drift is True and best.timed
    assert isinstance(best.config, TrialConfig) and best.config == TrialConfig.from_json(on_disk["config"])
    assert (best.config.backend, best.config.precision) == ("eager", "fp32")
    assert best.config.batch_size in (2, 4)
    assert best.trial == best.study.trial == on_disk["study"]["trial"] in [t.number for t in complete(result.study)]
    assert best.study.trials == on_disk["study"]["trials"] and best.study.trials["complete"] == 2
    assert best.throughput_sps == on_disk["metrics"]["throughput_sps"] > 0
    assert best.latency_ms is not None and best.latency_ms.to_json() == on_disk["metrics"]["latency_ms"]
    assert (best.latency_ms.p50 or 0.0) > 0
    assert best.objective.name == "throughput" and best.objective.value == on_disk["objective"]["value"]
    assert best.speedup == on_disk["speedup_vs_baseline"] > 0
    assert best.baseline is not None and best.baseline.trial == 0 and best.baseline.config.backend == "eager"
    assert best.drift_drop == on_disk["drift"]["drop"] and best.max_drift == 0.05
    assert best.launch is not None and best.launch.commands == on_disk["launch"]["commands"]
    assert best.environment == on_disk["environment"]
    assert best.fingerprint is not None and best.fingerprint.to_json() == on_disk["fingerprint"]
    assert BestJson.read(result.best_path) == best
    # The CLI prints its last line from the same record.
    assert search_summary(result).startswith(
        f"best: trial {best.trial} {best.throughput_sps:.1f} samples/s from one search measurement"  # no finalists
    )


def test_a_factory_function_is_passed_as_its_reference(tmp_path):
    from tiny_models import tiny_cnn

    assert model_reference(tiny_cnn) == f"{TINY}:tiny_cnn"  # tests/ is on this process's path only: by file
    console, _ = quiet_console()
    space = write_space(tmp_path / "space.yaml", batch_size=[2])
    for attempt in range(3):  # a trial flagged noisy (the hypervisor stole its CPUs) never wins: resume
        try:
            result = autotune.search(
                tiny_cnn, space=space, trials=1, studies_dir=tmp_path / "studies", console=console, **FAST
            )
            break
        except autotune.UserError as refused:
            if NOISY_REFUSAL not in str(refused) or attempt == 2:
                raise
    assert result.study.study_name == "tiny_cnn"  # named after the function, as --model file.py:tiny_cnn is
    assert result.study.user_attrs["spec"]["model"]["name"] == f"{TINY}:tiny_cnn"
    assert (
        len(complete(result.study)) == attempt + 1 and result.best is not None and result.best.config.backend == "eager"
    )


def test_a_factory_importable_by_name_is_referenced_by_module():
    import torchvision.models

    assert model_reference(torchvision.models.resnet18) == "torchvision.models.resnet:resnet18"
    assert model_reference("my_models.py:build") == "my_models.py:build"
    assert model_reference(Path("model.pt")) == "model.pt"


def test_a_factory_in_a_script_is_referenced_by_its_file(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text(
        "from autotune.api import model_reference\n"
        "def build():\n"
        "    raise AssertionError('not called')\n"
        "if __name__ == '__main__':\n"
        "    print(model_reference(build))\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{script.resolve()}:build"


def test_a_script_calling_search_unguarded_is_stopped_when_its_factory_is_imported(tmp_path):
    """Importing the factory's file runs the script again: without `if __name__ == "__main__":` that would
    start a search inside a search."""
    script = tmp_path / "tune.py"
    script.write_text(
        "import autotune, torch\n"
        "def build():\n"
        "    return torch.nn.Linear(4, 2), torch.zeros(2, 4)\n"
        f"autotune.search(build, studies_dir={str(tmp_path / 'studies')!r}, trials=1)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "autotune.search was called while the model's module was being imported" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert not (tmp_path / "studies").exists()


class Module:
    def build(self):
        raise AssertionError("not called")


def nested():
    def build():
        raise AssertionError("not called")

    return build


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (TinyCNN, "an nn.Module instance (TinyCNN)"),
        (lambda: lambda: None, "a lambda"),
        (nested, "nested.<locals>.build, defined inside a function"),
        (lambda: Module().build, "the bound method Module.build"),
    ],
    ids=["module-instance", "lambda", "nested-function", "bound-method"],
)
def test_an_in_memory_model_is_refused_with_what_to_pass_instead(tmp_path, make, what):
    with pytest.raises(autotune.UserError) as refused:
        autotune.search(make(), input_shape="3x16x16", studies_dir=tmp_path / "studies", trials=1)
    message = str(refused.value)
    assert message.startswith(f"model: {what}") and "\n" not in message
    assert "trials run in fresh processes" in message  # why
    assert "factory function defined at the top level of a module" in message and "file.py:" in message  # instead
    assert not (tmp_path / "studies").exists()  # refused before anything was created


DEFAULTS = {
    "budget": "20m",
    "objective": "throughput",
    "task": "auto",
    "prompt_tokens": 512,
    "new_tokens": 64,
    "max_drift": "0.05",
    "drift_metric": None,  # the task's own: kld for a language model, relative_l2 for a classifier
    "eval_samples": None,  # the task's own: 4 prompts for a language model, 32 inputs for a classifier
    "calibration_samples": 64,
    "trial_timeout": "10m",
    "measure_seconds": "5s",
    "speed_pruning": True,
    "cover_backends": True,
    "finalists": 3,
    "finalist_repeats": 3,
    "finalist_share": 0.2,
    "memory_limit": "80%",
    "cache_size": "20G",
    "runtimes": (),
    "heartbeat_grace": "60s",
    "studies_dir": "studies",
}


def test_the_cli_and_the_api_take_the_options_of_one_record_with_its_defaults():
    """SearchOptions is the one place an option is written: the CLI's parser is made from it (every option
    there, with its default), and autotune.search takes its fields and refuses any other keyword in one line
    (the manual's option table is made from it when the site is built: tests/test_docs.py)."""
    args = build_parser().parse_args(["search", "--model", "resnet18"])
    assert set(vars(args)) - {"command", "func"} == {f.name for f in dataclasses.fields(SearchOptions)}
    assert SearchOptions.from_arguments(args) == SearchOptions(model="resnet18")
    defaults = dataclasses.asdict(SearchOptions(model="m"))
    assert {k: defaults[k] for k in DEFAULTS} == DEFAULTS  # as documented before the record existed
    given = build_parser().parse_args(
        ["search", "--model", "m", "--no-speed-pruning", "--runtime", "a", "--runtime", "b", "--sequences", "1,4"]
    )
    options = SearchOptions.from_arguments(given)
    assert (options.speed_pruning, options.runtimes, options.sequences) == (False, ("a", "b"), [1, 4])
    with pytest.raises(autotune.UserError, match=r"unknown option 'budgett'; its options are weights, ") as refused:
        autotune.search("resnet18", budgett="1m")
    assert "\n" not in str(refused.value)


def test_best_json_needs_its_required_fields_and_keeps_fields_it_does_not_know(searched):
    _, result, _ = searched
    on_disk = json.loads(result.best_path.read_text())

    lacking = {k: v for k, v in on_disk.items() if k != "config"}
    with pytest.raises(RecordError, match=r"best.json lacks its required 'config' field"):
        BestJson.from_json(lacking)
    study_lacking = {**on_disk, "study": {k: v for k, v in on_disk["study"].items() if k != "trial"}}
    with pytest.raises(RecordError, match=r"best.json: .*lacks its 'trial' field"):
        BestJson.from_json(study_lacking)
    with pytest.raises(RecordError, match=r"not an autotune best\.json"):
        BestJson.from_json({**on_disk, "schema": "something.else/1"})

    newer = {
        **on_disk,
        "added_later": {"x": 1},
        "config": {**on_disk["config"], "new_knob": 3},
        "study": {**on_disk["study"], "region": "eu"},
    }
    best = BestJson.from_json(newer)
    assert best.extra == {"added_later": {"x": 1}} and best.study.extra == {"region": "eu"}
    assert best.config == result.best.config  # the config field it does not know is dropped
    written = best.to_json()
    assert written["added_later"] == {"x": 1} and written["study"]["region"] == "eu"

    broken = result.best_path.parent / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(RecordError, match=r"cannot read .*broken\.json"):
        BestJson.read(broken)


def test_a_study_where_no_config_meets_the_drift_bound_gives_the_closest_candidate(tmp_path):
    space = write_space(
        tmp_path / "space.yaml", backends={"eager": {"precision": ["bf16"], "memory_format": ["contiguous"]}}
    )
    console, _ = quiet_console()
    result = autotune.search(
        tiny(), space=space, max_drift=1e-4, trials=1, studies_dir=tmp_path / "studies", console=console, **FAST
    )
    assert not complete(result.study) and result.best is not None
    best = result.best
    assert best.meets_drift is False and not best.timed and best.to_json() == json.loads(result.best_path.read_text())
    assert best.config.precision == "bf16" and best.throughput_sps is None and best.speedup is None
    assert best.drift_drop > best.max_drift == 1e-4 and best.launch is None and best.baseline is None
    assert search_summary(result).startswith("no trial met the drift bound: NO configuration met the drift bound")

"""What earlier versions stored still reads, and loses nothing when written back: best.json, a study's user
attributes (as its storage keeps them) and the worker's job and result files.

tests/data/stored/ holds them as autotune wrote them from tiny studies on a 2-core machine (paths replaced
by {PYTHON}, {TESTS} and {WORK}): a classifier whose winner ran an ONNX Runtime artifact and whose finalist
round re-measured three trials (`classify-finalists-best.json` is that best.json with the round's view, which
the search did not export because no run of it was clean), a text-generation study of a tiny Llama, a
server-scenario study and a Pareto study."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import TESTS

from autotune.records.best import BestJson
from autotune.records.config import TrialConfig
from autotune.records.job import WorkerJob
from autotune.records.metrics import InstanceResult, TrialMetrics
from autotune.records.spec import SearchSpec, StoredSpec

DATA = TESTS / "data" / "stored"
BESTS = (
    "classify-best.json",
    "classify-finalists-best.json",
    "generate-best.json",
    "server-best.json",
    "pareto-best.json",
)
STUDIES = ("classify-study.json", "generate-study.json", "server-study.json")
WORKERS = ("classify-worker.json", "generate-worker.json", "server-worker.json")


def stored(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def lost(original: Any, written: Any, path: str = "") -> list[str]:
    """The paths whose value `written` lacks or changed (a key it adds is not a loss)."""
    if isinstance(original, dict) and isinstance(written, dict):
        return [p for k, v in original.items() for p in lost(v, written.get(k, _MISSING), f"{path}.{k}")]
    if isinstance(original, list) and isinstance(written, list) and len(original) == len(written):
        return [p for i, (a, b) in enumerate(zip(original, written)) for p in lost(a, b, f"{path}[{i}]")]
    return [] if original == written else [path or "."]


_MISSING = object()


@pytest.mark.parametrize("name", BESTS)
def test_a_stored_best_json_reads_and_writes_back_as_it_was(name):
    data = stored(name)
    best = BestJson.from_json(data)
    assert best.timed and best.config == TrialConfig.from_json(data["config"])
    assert best.to_json() == data


def test_a_best_json_from_before_the_layers_loses_no_field_when_written_back():
    data = json.loads((TESTS / "data" / "best-before-layers.json").read_text())
    assert lost(data, BestJson.from_json(data).to_json()) == []


@pytest.mark.parametrize("name", STUDIES)
def test_a_stored_studys_attributes_read_typed_and_write_back_as_they_were(name):
    study = stored(name)
    spec = study["study"]["user_attrs"]["spec"]
    assert SearchSpec.from_json(spec).to_json() == spec
    assert StoredSpec.from_json(spec).objective == spec["objective"]
    complete = [t for t in study["trials"] if t["state"] == "COMPLETE"]
    assert complete
    for trial in study["trials"]:
        attrs = trial["user_attrs"]
        if "config" in attrs:
            assert TrialConfig.from_json(attrs["config"]).to_json() == attrs["config"]
        if "job" in attrs:
            assert WorkerJob.from_json(attrs["job"]).to_json() == attrs["job"]
    for trial in complete:
        attrs = trial["user_attrs"]
        written = TrialMetrics.from_trial_attrs(attrs, trial["number"]).to_json()
        assert {key: attrs[key] for key in written if key in attrs} == {k: v for k, v in written.items() if k in attrs}
        assert [key for key in written if key not in attrs] == []  # every metric a trial stores, read and written


@pytest.mark.parametrize("name", WORKERS)
def test_the_workers_job_and_result_files_read_typed_and_lose_nothing(name):
    files = stored(name)
    for kind in ("trial_job", "prepare_job", "reference_job"):
        if kind in files:
            assert WorkerJob.from_json(files[kind]).to_json() == files[kind], kind
    result = files["trial_result"]
    assert lost(result, InstanceResult.from_json(result).to_json()) == []


@pytest.mark.parametrize("name", STUDIES)
def test_every_attribute_a_stored_trial_holds_reads_typed(name):
    """TrialAttrs reads an attribute of a layout it does not know as not recorded; none of what these
    studies stored is such a one."""
    from autotune.records.attributes import TrialAttrs

    for trial in stored(name)["trials"]:
        attrs = TrialAttrs.from_json(trial["user_attrs"])
        for key in TrialAttrs.NESTED:
            if trial["user_attrs"].get(key) is not None:
                assert getattr(attrs, key) is not None, (trial["number"], key)
                assert getattr(attrs, key).to_json() == trial["user_attrs"][key], (trial["number"], key)


def test_a_generation_study_stored_when_sequences_counted_per_instance_reads_so_and_is_not_resumed(tmp_path):
    """Its trials ran `sequences` on each instance: read as they were (best.json says "per instance"), and a
    search resuming it, whose sequences count all instances together, is refused in one line."""
    import optuna

    from autotune.common.errors import UserError
    from autotune.machine.probe import probe_machine
    from autotune.model.generation import SEQUENCES_TOTAL
    from autotune.tuning.study import open_study

    spec_json = stored("generate-study.json")["study"]["user_attrs"]["spec"]
    assert StoredSpec.from_json(spec_json).sequences_meaning == "per instance"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="lm", storage=storage, direction="maximize")
    study.set_user_attr("spec", spec_json)
    spec = SearchSpec.from_json({**spec_json, "storage": storage, "studies_root": str(tmp_path)})
    with pytest.raises(UserError, match="was stored when --sequences counted sequences per instance"):
        open_study(spec, probe_machine())
    new = {**spec_json, "generation": {**spec_json["generation"], "sequences": SEQUENCES_TOTAL}}
    assert StoredSpec.from_json(new).sequences_meaning == "total"
    assert SearchSpec.from_json(new).to_json()["generation"]["sequences"] == "total"

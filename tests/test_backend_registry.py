"""One registry for every task's backends: each registered module has the members of its interface
(backends/base.py), lookups go by task and name, and an incomplete module is refused when registered."""

import json
import subprocess
import sys
from types import ModuleType

import pytest

from autotune.backends import BACKENDS, TASKS, backend_module, backend_specs, register
from autotune.backends.base import BackendSpec, missing_members
from autotune.records.config import TrialConfig


@pytest.mark.parametrize("task", TASKS)
def test_every_registered_backend_has_its_interface_and_serves_its_task(task):
    specs = backend_specs(task)
    assert specs
    for name, spec in specs.items():
        module = backend_module(name, task)
        assert module.SPEC is spec and spec.task == task and spec.name == name
        assert missing_members(module) == []


def test_classification_and_generation_backends_of_one_name_are_told_apart():
    assert backend_specs("classify") is BACKENDS
    assert backend_module("inductor").SPEC.precisions == ("fp32", "bf16")
    generate = backend_module("inductor", "generate").SPEC
    assert "woq_int4" in generate.precisions and "max_autotune" in generate.options
    with pytest.raises(KeyError, match="unknown generate backend 'onnxruntime'"):
        backend_module("onnxruntime", "generate")


def test_unsupported_answers_for_every_backend_and_ipex_refuses_intel_openmp_without_affinity():
    refused = TrialConfig("ipex", "fp32", batch_size=1, openmp="intel", kmp_affinity="disabled")
    assert "KMP_AFFINITY=disabled" in (backend_module("ipex").unsupported(refused) or "")
    for task in TASKS:
        for name in backend_specs(task):
            assert backend_module(name, task).unsupported(TrialConfig(name, "fp32", batch_size=1)) is None


def test_a_module_lacking_its_interface_is_refused():
    module = ModuleType("half_done")
    module.SPEC = BackendSpec(name="half_done", description="", precisions=("fp32",), uses_artifact=True)  # type: ignore[attr-defined]
    module.unsupported = lambda config: None  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="lacks ARTIFACT_VERSION, artifact_identity, build_artifact, load"):
        register(module)  # type: ignore[arg-type]
    assert "half_done" not in BACKENDS


def test_generation_entry_point_prints_the_unavailable_precisions():
    result = subprocess.run(
        [sys.executable, "-m", "autotune.backends.generation"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout)["unavailable"], dict)


def test_generation_prepare_goes_to_the_configurations_backend():
    """Eager runs the model's own forward; inductor the same prepared model, its forward compiled with
    the flags asked for (compiled lazily: nothing runs here)."""
    from tiny_lm import tiny_llama

    from autotune.backends.generation import prepare

    eager, details = prepare(tiny_llama(), TrialConfig("eager", "fp32", batch_size=1), 2)
    assert "inductor" not in details and eager.forward == eager.model.forward
    config = TrialConfig("inductor", "bf16", batch_size=1, options={"kv_cache": "static", "freezing": False})
    compiled, details = prepare(tiny_llama(), config, 2)
    assert details["inductor"]["freezing"] is False and details["float_dtype"] == "bfloat16"
    assert compiled.forward != compiled.model.forward and compiled.kv_cache == "static"


def test_a_trials_backend_environment_is_what_its_spec_declares(tmp_path):
    """The runner asks the SPEC, not the backend's name: inductor (both tasks) and torchao share the
    inductor cache; OpenVINO beside a preloaded allocator gets the oneTBB setting, and only then."""
    from autotune.runner.trials import backend_env

    cache = str(tmp_path / "inductor")
    for task, backend in (("classify", "inductor"), ("classify", "torchao"), ("generate", "inductor")):
        assert backend_env(TrialConfig(backend, "fp32", 1), tmp_path, task) == {"TORCHINDUCTOR_CACHE_DIR": cache}
    assert backend_env(TrialConfig("eager", "fp32", 1), tmp_path, "generate") == {}
    openvino = TrialConfig("openvino", "fp32", 1, allocator="jemalloc")
    assert backend_env(openvino, tmp_path, "classify") == {"TBB_ENABLE_SANITIZERS": "1"}
    assert backend_env(openvino, tmp_path, "generate") == {"TBB_ENABLE_SANITIZERS": "1"}  # GenAI's pipeline too
    assert backend_env(TrialConfig("openvino", "fp32", 1), tmp_path, "classify") == {}

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
    assert "woq_int4" in generate.precisions and "max_autotune" in generate.choices
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
    with pytest.raises(TypeError, match="lacks unavailable, ARTIFACT_VERSION, artifact_identity, build_artifact, load"):
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


def test_every_fact_of_a_backend_is_in_its_spec():
    """The tie-break and preparation ranks, the packages the artifact cache keys on, and the options that
    only schedule work or apply at some precisions: each read off the SPECs, in the orders they always had."""
    from autotune.runner.artifact_cache import artifact_packages

    def ordered(task, rank):
        return sorted(backend_specs(task), key=lambda name: getattr(backend_specs(task)[name], rank))

    assert ordered("classify", "complexity") == ["eager", "inductor", "ipex", "onnxruntime", "openvino", "torchao"]
    assert ordered("classify", "prepare_cost") == ["eager", "onnxruntime", "openvino", "torchao", "ipex", "inductor"]
    # llama.cpp's conversion after OpenVINO's export, before IPEX's optimize and inductor's compile
    assert ordered("generate", "prepare_cost") == ["eager", "openvino", "llamacpp", "ipex", "inductor"]
    classify = {"onnx", "onnxscript", "onnxruntime", "openvino", "nncf", "torchao", "intel-extension-for-pytorch"}
    assert set(artifact_packages()) == {"torch", "torchvision", *classify}  # the cache keys of before
    assert set(artifact_packages("generate")) == {"torch", "torchvision", *classify, "transformers", "llama_cpp_python"}
    assert backend_specs("classify")["onnxruntime"].scheduling_options == ("execution_mode", "inter_op_threads")
    assert backend_specs("classify")["openvino"].scheduling_options == ("hint", "streams")
    scheduling = ("n_batch", "n_ubatch", "decode_threads", "server_sequences")  # the server's slots among them
    assert backend_specs("generate")["llamacpp"].scheduling_options == scheduling
    openvino = backend_specs("generate")["openvino"].scheduling_options
    assert openvino == ("max_num_batched_tokens", "dynamic_split_fuse", "server_sequences", "server_instances")
    ipex = backend_specs("classify")["ipex"]
    assert ipex.applies("graph", "bf16") and not ipex.applies("graph", "int8") and ipex.applies("memory_format", "int8")
    assert ipex.choices["memory_format"][0] == "channels_last"


def test_options_are_read_as_a_typed_record():
    """A stored configuration's options, read by the backend as its record: an option no longer known is
    ignored, a missing one is at its default (a weight-only precision's activations: fp32, as configurations
    from before that option were measured, though the space lists bf16 first)."""
    from autotune.backends.generation.quantization import TorchGenerateOptions
    from autotune.backends.openvino.classify import OpenVinoOptions

    config = TrialConfig("openvino", "int8", 1, options={"streams": 4, "retired_option": True})
    options = OpenVinoOptions.of(config)
    assert (options.streams, options.hint, options.int8_float) == (4, "THROUGHPUT", "f32")
    old = TorchGenerateOptions.of(TrialConfig("eager", "woq_int4", 1))
    assert (old.activations, old.group_size, old.kv_cache) == ("fp32", 128, "dynamic")
    assert TorchGenerateOptions.choices()["activations"] == ("bf16", "fp32")


def test_every_backend_says_whether_it_runs_here_and_generation_what_it_cached(tmp_path):
    for task in TASKS:
        for name in backend_specs(task):
            why = backend_module(name, task).unavailable()
            assert why is None or (isinstance(why, str) and "\n" not in why), (task, name, why)
    assert backend_module("eager").unavailable() is None  # torch imports here
    ipex = backend_module("ipex").unavailable()  # where IPEX does not import: the runtime it runs in, said too
    assert ipex is None or (ipex.startswith("intel_extension_for_pytorch: ") and ".venv-ipex" in ipex), ipex
    for name in backend_specs("generate"):
        assert backend_module(name, "generate").cached_artifact(tmp_path) is None  # nothing built there


def test_a_backend_whose_name_is_taken_or_whose_options_are_not_choices_is_refused():
    from dataclasses import dataclass

    from autotune.backends.base import BackendOptions

    module = ModuleType("second_eager")
    module.SPEC = BackendSpec(name="eager", description="", precisions=("fp32",))  # type: ignore[attr-defined]
    module.unsupported = module.unavailable = module.prepare = lambda *args: None  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="a classify backend named 'eager' is registered already"):
        register(module)  # type: ignore[arg-type]
    assert backend_module("eager").__name__ == "autotune.backends.eager.classify"

    @dataclass(frozen=True)
    class Untyped(BackendOptions):
        level: int = 3  # not a choice(...): the space would not know its values

    module.SPEC = BackendSpec(name="untyped", description="", precisions=("fp32",), options=Untyped)  # type: ignore[attr-defined]
    assert missing_members(module) == ["choice(...) for its option level"]

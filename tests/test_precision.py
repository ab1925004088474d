"""A configuration runs what it claims: each backend's probe of what it really executes, on real runtimes
and tiny models. Honest int8 / bf16 configurations pass with compute layers counted in the claimed
precision; real fallbacks (a QDQ model left unfused, a quantized program without its fusion passes, a
float IR or module under an int8 or bf16 claim, a bf16 hint the CPU cannot honour) are caught; and a
search FAILs such a trial with its cause."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST, TESTS, load_study, openvino_computes_bf16, tiny, write_space
from tiny_models import tiny_cnn, tiny_mlp, tiny_vit

from autotune.backends import backend_module
from autotune.backends.precision import ExecutedPrecision, check_precision, judge
from autotune.records.config import TrialConfig

ROOT = TESTS.parent
IPEX_PYTHON = Path(sys.prefix).parent / ".venv-ipex" / "bin" / "python"
BATCH = 4
MODELS = {"cnn": (tiny_cnn, (3, 16, 16)), "mlp": (tiny_mlp, (64,))}
SHAPES = {**{name: shape for name, (_, shape) in MODELS.items()}, "vit": (3, 32, 32)}
LAYERS = {"cnn": 3, "mlp": 2}  # convolutions and Linear layers


def example(name: str) -> tuple[torch.Tensor, ...]:
    return (torch.randn(BATCH, *SHAPES[name], generator=torch.Generator().manual_seed(0)),)


def checked(runner, batch, claimed: str) -> ExecutedPrecision:
    native = runner.convert_input(batch)
    runner(native)  # the worker's first call (compilation) comes before the probe
    return check_precision(runner, native, claimed)


def counting_calls(model: torch.nn.Module) -> list[int]:
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def prepared(backend: str, name: str, precision: str, tmp_path: Path, **options):
    config = TrialConfig(backend, precision, batch_size=BATCH, options=options)
    model = MODELS[name][0]().eval()
    return backend_module(backend).prepare(model, example(name), config, tmp_path), model


def built(backend: str, name: str, precision: str, out_dir: Path, **options) -> Path:
    """An artifact as the prepare process builds it: export, conversion, quantization."""
    config = TrialConfig(backend, precision, batch_size=BATCH, options=options)
    out_dir.mkdir(parents=True)
    batches = [example(name), tuple(x * 0.5 for x in example(name))]
    backend_module(backend).build_artifact(MODELS[name][0]().eval(), example(name), batches, config, out_dir)
    return out_dir


def loaded(backend: str, precision: str, artifact: Path, name: str = "cnn", **options):
    config = TrialConfig(backend, precision, batch_size=BATCH, options=options)
    return backend_module(backend).load(example(name), config, artifact)


def assert_runs(record: ExecutedPrecision, bucket: str) -> None:
    assert record.status == "ok", record
    assert record.counts.get(bucket, 0) > 0 and record.probe_s is not None, record


def assert_falls_back(record: ExecutedPrecision, claimed: str) -> None:
    assert record.status == "fallback" and record.fallback, record
    assert record.cause.startswith(f"precision fallback: {claimed} asked, "), record.cause
    assert record.counts.get(claimed, 0) == 0 and sum(record.counts.values()) > 0, record


@pytest.mark.parametrize("name", MODELS)
def test_eager_bf16_runs_bf16_layers_and_the_probe_makes_one_call(name, tmp_path):
    runner, model = prepared("eager", name, "bf16", tmp_path)
    native = runner.convert_input(example(name))
    calls = counting_calls(model)
    record = check_precision(runner, native, "bf16")
    assert_runs(record, "bf16")
    # Each layer once, in bf16: not autocast's outer fp32 call, nor the operators it dispatches through.
    assert record.evidence["ATen operators"] == {"bf16": LAYERS[name]}
    assert len(calls) == 1  # the probe's whole cost: one call, outside any timed window
    assert json.loads(json.dumps(record.to_json())) == record.to_json()  # travels as the worker's JSON


def test_inductor_bf16_with_freezing_runs_bf16_layers(tmp_path):
    runner, _ = prepared("inductor", "mlp", "bf16", tmp_path, freezing=True)
    assert_runs(checked(runner, example("mlp"), "bf16"), "bf16")


@pytest.mark.parametrize("name", MODELS)
def test_a_torch_runner_claiming_bf16_or_int8_that_runs_the_fp32_module_is_caught(name, tmp_path):
    runner, model = prepared("eager", name, "fp32", tmp_path)
    for claimed in ("bf16", "int8"):
        record = checked(runner, example(name), claimed)
        assert_falls_back(record, claimed)
        assert record.counts.get("f32", 0) > 0, record
    calls = counting_calls(model)
    fp32 = check_precision(runner, runner.convert_input(example(name)), "fp32")
    assert fp32.status == "unchecked" and "nothing to check" in (fp32.reason or "") and not calls  # nor run


TORCHAO_WITHOUT_FUSION_PASSES = """
import json, sys
import torch
import torch._inductor.config as inductor_config
import torchao.quantization.pt2e.quantize_pt2e  # the quantized ops, not the x86 inductor passes that fuse them
from autotune.backends.base import Runner
from autotune.backends.precision import check_precision
from autotune.backends.torch_common import torch_probe

assert "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer" not in sys.modules
inductor_config.freezing = True
compiled = torch.compile(torch.export.load(sys.argv[1]).module())

def run(batch):
    with torch.no_grad():
        return compiled(*batch)

batch = (torch.randn(4, 3, 16, 16),)
run(batch)
record = check_precision(Runner(run=run, probe=torch_probe(run)), batch, "int8")
assert "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer" not in sys.modules
open(sys.argv[2], "w").write(json.dumps(record.to_json()))
"""


def run_script(python: Path | str, script: str, *args: str, timeout: float = 300) -> dict:
    out = Path(args[-1])
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}"}
    done = subprocess.run(
        [str(python), "-c", textwrap.dedent(script), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_torchao_int8_runs_int8_kernels_and_without_its_fusion_passes_falls_back(tmp_path):
    artifact = built("torchao", "cnn", "int8", tmp_path / "torchao", scheme="static")
    honest = checked(loaded("torchao", "int8", artifact, scheme="static"), example("cnn"), "int8")
    assert_runs(honest, "int8")
    assert honest.source == "oneDNN primitives"  # the int8 convolutions ran in oneDNN
    program = str(artifact / backend_module("torchao").PROGRAM_FILE)
    unfused = ExecutedPrecision.from_json(
        run_script(sys.executable, TORCHAO_WITHOUT_FUSION_PASSES, program, str(tmp_path / "unfused.json"))
    )
    assert_falls_back(unfused, "int8")  # dequantize, then float convolutions
    assert unfused.evidence["oneDNN primitives"].get("f32", 0) > 0


@pytest.fixture(scope="module")
def onnx_int8(tmp_path_factory) -> Path:
    return built("onnxruntime", "cnn", "int8", tmp_path_factory.mktemp("ort") / "int8")


def test_onnxruntime_int8_fused_runs_int8_operators_and_left_unfused_falls_back(onnx_int8):
    for level in ("all", "extended"):
        assert_runs(
            checked(loaded("onnxruntime", "int8", onnx_int8, graph_optimization=level), example("cnn"), "int8"), "int8"
        )
    unfused = checked(loaded("onnxruntime", "int8", onnx_int8, graph_optimization="basic"), example("cnn"), "int8")
    assert_falls_back(unfused, "int8")  # Conv and Gemm in float between DequantizeLinear / QuantizeLinear
    assert unfused.source == "ONNX Runtime optimized graph" and "graph_optimization=extended" in unfused.cause


@pytest.fixture(scope="module")
def openvino_irs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("openvino")
    return {precision: built("openvino", "cnn", precision, root / precision) for precision in ("fp32", "int8")}


def test_openvino_int8_ir_runs_int8_layers_and_a_float_ir_under_an_int8_claim_falls_back(openvino_irs):
    assert_runs(checked(loaded("openvino", "int8", openvino_irs["int8"]), example("cnn"), "int8"), "int8")
    # The float IR where the int8 one should be (a quantization that produced no FakeQuantize, say).
    float_ir = checked(loaded("openvino", "int8", openvino_irs["fp32"]), example("cnn"), "int8")
    assert_falls_back(float_ir, "int8")
    assert float_ir.source == "OpenVINO runtime model" and float_ir.counts == {"f32": 3}  # 2 Convolution, 1 FC


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_model_with_attention_layers_is_quantized_as_a_transformer_and_stays_near_fp32(backend, tmp_path):
    """ONNX Runtime (dynamic int8) and NNCF (its transformer model type) quantize a model with attention
    layers the way their makers advise for transformers: int8 runs, and the outputs stay within the
    default drift bound (the CNN schemes, static int8 on every operator, drifted 0.29 with ONNX Runtime
    and 0.24 with NNCF on this model). On a CPU without int8 dot products the weights keep 7 bits
    (8 bits drifted 0.27 and 0.36 on an AVX2-only EPYC: the u8 x s8 kernels saturate)."""
    from autotune.common.cpuinfo import int8_dot_products
    from autotune.measure.drift import relative_l2

    model = tiny_vit().eval()
    calibration = [(torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(s)),) for s in range(4)]
    config = TrialConfig(backend, "int8", batch_size=BATCH)
    module = backend_module(backend)
    details = module.build_artifact(model, example("vit"), calibration, config, tmp_path)
    assert details["attention_layers"] == {"MultiheadAttention": 2}
    assert ("dynamic" if backend == "onnxruntime" else "transformer model type") in details["quantization"]
    seven_bit = "7-bit (no VNNI)" if backend == "onnxruntime" else "overflow fix enable"
    assert (seven_bit in details["quantization"]) == (not int8_dot_products()), details["quantization"]
    runner = loaded(backend, "int8", tmp_path, name="vit")
    assert_runs(checked(runner, example("vit"), "int8"), "int8")
    inputs = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        reference = model(inputs).numpy()
    outputs = [runner(runner.convert_input((inputs[i : i + BATCH],))) for i in range(0, 16, BATCH)]
    drift = relative_l2(np.concatenate([np.asarray(o) for o in outputs]), reference)
    assert drift < 0.05, drift


def test_openvino_bf16_runs_bf16_exactly_where_the_cpu_offers_it(openvino_irs):
    record = checked(loaded("openvino", "bf16", openvino_irs["fp32"]), example("cnn"), "bf16")
    if openvino_computes_bf16():  # what OpenVINO itself says of one MatMul here, not its BF16 capability
        assert_runs(record, "bf16")
    else:  # OpenVINO compiles it in f32 without a word: exactly the silent fallback this check is for
        assert_falls_back(record, "bf16")
        assert "inference precision is f32" in record.cause and "no BF16" in record.cause


IPEX_INT8_AND_ITS_FP32_MODULE = """
import json, sys, tempfile
from pathlib import Path
import torch
from tiny_models import tiny_cnn
from autotune.backends.ipex import classify as ipex
from autotune.backends.precision import check_precision
from autotune.records.config import TrialConfig

batch = (torch.randn(4, 3, 16, 16),)
results = {}
int8 = TrialConfig("ipex", "int8", batch_size=4)
folder = Path(tempfile.mkdtemp())
ipex.build_artifact(tiny_cnn().eval(), batch, [batch], int8, folder)
for name, runner, claimed in [
    ("int8", ipex.load(batch, int8, folder), "int8"),
    ("fp32 as int8", ipex.prepare(tiny_cnn().eval(), batch, TrialConfig("ipex", "fp32", batch_size=4), folder), "int8"),
]:
    native = runner.convert_input(batch)
    runner(native), runner(native)
    results[name] = check_precision(runner, native, claimed).to_json()
open(sys.argv[1], "w").write(json.dumps(results))
"""


def test_ipex_int8_runs_int8_kernels_and_its_fp32_module_under_an_int8_claim_falls_back(tmp_path):
    assert IPEX_PYTHON.exists(), f"{IPEX_PYTHON} is missing: run 'make setup', which builds it"
    results = run_script(IPEX_PYTHON, IPEX_INT8_AND_ITS_FP32_MODULE, str(tmp_path / "ipex.json"))
    assert_runs(ExecutedPrecision.from_json(results["int8"]), "int8")
    assert_falls_back(ExecutedPrecision.from_json(results["fp32 as int8"]), "int8")


def test_layers_of_unknown_type_decide_nothing_and_no_layer_is_unchecked():
    assert judge("int8", {"ATen operators": {"other": 2}}).status == "unchecked"  # e.g. TorchScript fusion groups
    assert judge("bf16", {"oneDNN primitives": {}, "ATen operators": {}}).status == "unchecked"
    mixed = judge("int8", {"oneDNN primitives": {"f32": 2, "int8": 1}, "ATen operators": {"f32": 3}})
    assert mixed.status == "ok" and mixed.source == "oneDNN primitives"  # quantizers leave some layers float
    later = judge("bf16", {"oneDNN primitives": {}, "ATen operators": {"bf16": 3}})
    assert later.status == "ok" and later.source == "ATen operators"  # PyTorch's own bf16 kernels


def test_a_trial_that_falls_back_fails_with_its_cause_shows_in_show_and_is_not_launched_again(searcher, workdir):
    space = write_space(
        workdir / "space.yaml",
        batch_size=[BATCH],
        backends={
            "eager": {"precision": ["fp32"], "memory_format": ["contiguous"]},
            "onnxruntime": {
                "precision": ["int8"],
                "graph_optimization": ["basic"],
                "execution_mode": ["sequential", "parallel"],
            },
        },
    )
    args = ["--model", tiny(), "--input-shape", "3x16x16", "--study", "s", "--space", str(space)]
    searched = searcher("search", *args, "--trials", "2", "--calibration-samples", "8", *FAST)
    assert "Traceback" not in searched.stderr, searched.stderr
    baseline, unfused = load_study(workdir, "s").trials
    assert baseline.state.name == "COMPLETE" and baseline.user_attrs["executed_precision"]["status"] == "unchecked"
    assert unfused.state.name == "FAIL" and unfused.user_attrs["config"]["backend"] == "onnxruntime"
    cause = unfused.user_attrs["fail_cause"]
    assert cause.startswith("precision fallback: int8 asked, 0 of 3 compute layers ran in int8"), cause
    record = ExecutedPrecision.from_json(unfused.user_attrs["executed_precision"])
    assert record.fallback and record.counts == {"f32": 3} and record.cause == cause
    assert not (Path(unfused.user_attrs["trial_dir"]) / "stamps-0.npy").exists()  # stopped before any timing
    best = workdir / "studies" / "s" / "best.json"
    if searched.returncode == 0:  # a winner exported (a machine too busy flags every trial noisy: none)
        exported = json.loads(best.read_text())["metrics"]["executed_precision"]
        assert exported == baseline.user_attrs["executed_precision"]
    shown = searcher("show", "--study", "s")
    assert shown.returncode == 0, shown.stderr
    flat = " ".join(re.sub("[│┃]", " ", shown.stdout).split())  # the table's cells, wrapped lines joined
    # grouped by the cause with its numbers masked, shown as the first trial's cause with its numbers
    example = "precision fallback: int8 asked, 0 of 3 compute layers ran in int8 (ONNX Runtime optimized graph: 3 f32)"
    assert "FAIL" in flat and example in flat, shown.stdout

    # The same numerics in the other execution mode, an option that only schedules the work: known to fall back.
    mode = unfused.params["onnxruntime.execution_mode"]
    other_mode = "parallel" if mode == "sequential" else "sequential"
    load_study(workdir, "s").enqueue_trial({**unfused.params, "onnxruntime.execution_mode": other_mode})
    again = searcher("search", *args, "--trials", "1", "--calibration-samples", "8", *FAST)
    assert "Traceback" not in again.stderr, again.stderr
    repeated = load_study(workdir, "s").trials[-1]
    # Pruned, not failed, so the sampler learns from it (TPE ignores FAIL trials and proposes them again).
    assert repeated.state.name == "PRUNED" and repeated.number == 2 and not repeated.intermediate_values
    assert repeated.user_attrs["prune_reason"] == f"{cause} (as trial 1 with the same numerics found): not launched"
    assert repeated.user_attrs["executed_precision"] == unfused.user_attrs["executed_precision"]
    assert not (workdir / "studies" / "s" / "trials" / "00002").exists()  # nothing was started for it


@pytest.mark.parametrize("precision", ["woq_int8", "da8w8", "smoothquant_int8", "bf16"])
def test_a_language_model_runs_the_weights_its_precision_gives_and_an_fp32_one_under_that_claim_falls_back(precision):
    from tiny_lm import tiny_llama

    from autotune.backends.generation import prepare
    from autotune.worker.generate import GenerationRunner

    def runner(applied: str) -> GenerationRunner:
        calibration = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
        generator, details = prepare(tiny_llama(), TrialConfig("eager", applied, batch_size=1), 2, calibration)
        return GenerationRunner(generator, details)

    bucket = "bf16" if precision == "bf16" else "int8"
    quantized = check_precision(runner(precision), None, precision)
    assert_runs(quantized, bucket)
    assert quantized.source == "layer weight types" and quantized.counts == {bucket: 15}  # 2 x 7 Linear + lm_head
    skipped = check_precision(runner("fp32"), None, precision)  # quantize_ that left every layer float
    assert skipped.fallback and skipped.counts == {"f32": 15}
    assert skipped.cause.startswith(f"precision fallback: {precision} asked, 0 of 15 compute layers ran in {bucket}")


@pytest.mark.parametrize("precision", ["woq_int8", "da8w8", "smoothquant_int8"])
def test_a_gpt2_models_conv1d_projections_are_quantized_and_counted(precision, tmp_path):
    """GPT-2's attention and MLP projections are transformers' Conv1D, not nn.Linear: an int8 claim holds
    only when they run int8 too (not the output head alone), in the trial and from the cached artifact."""
    from tiny_lm import tiny_gpt2

    from autotune.backends.generation import build_artifact, cached_artifact, prepare
    from autotune.worker.generate import GenerationRunner

    config = TrialConfig("eager", precision, batch_size=1)
    calibration = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    generator, details = prepare(tiny_gpt2(), config, 4, calibration)
    quantized = check_precision(GenerationRunner(generator, details), None, precision)
    assert_runs(quantized, "int8")
    assert quantized.counts == {"int8": 9} and details["conv1d_as_linear"] == 8  # 2 x 4 Conv1D + lm_head

    torch.manual_seed(0)
    build_artifact(tiny_gpt2(), calibration, config, tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"key": {}, "details": details}))
    torch.manual_seed(0)
    loaded, _ = prepare(tiny_gpt2(), config, 4, calibration, cached_artifact(tmp_path))
    assert check_precision(GenerationRunner(loaded, details), None, precision).counts == {"int8": 9}
    assert torch.equal(loaded.generate(prompt, stamp=False), generator.generate(prompt, stamp=False))


def test_conv1d_as_linear_computes_what_conv1d_did():
    from tiny_lm import tiny_gpt2

    from autotune.backends.generation.quantization import linear_projections

    model = tiny_gpt2().eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        assert linear_projections(model) == 8
        after = model(input_ids=ids).logits
    assert not any(type(m).__name__ == "Conv1D" for m in model.modules())
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_an_int8_claim_with_only_the_output_head_quantized_is_a_fallback_naming_the_share():
    """What GPT-2's int8 trials recorded before its Conv1D projections were converted: 1 of 9 compute
    layers int8. Counted over every compute layer, that is a fallback, not an int8 model."""
    from tiny_lm import tiny_gpt2
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from autotune.backends.generation.quantization import weight_probe

    model = tiny_gpt2().eval()
    quantize_(model, Int8WeightOnlyConfig())  # quantize_ looks for nn.Linear: the output head only
    verdict = weight_probe(model)(None, "woq_int8")
    assert verdict.fallback and verdict.counts == {"f32": 8, "int8": 1}
    assert verdict.reason == "woq_int8 asked, 1 of 9 compute layers ran in int8 (layer weight types: 8 f32, 1 int8)"


def test_a_mix_holds_only_where_every_compressed_matrix_lies_below_the_kept_type():
    """judge_mix: 3 kept matrices and the output layer in f16, 5 compressed ones in int8 is the mix asked; a
    compressed matrix the quantizer left in f32 (torchao skips a Linear its int4 group does not divide) or
    one kept too many is a fallback, not a mix."""
    from autotune.backends.precision import FALLBACK, OK, judge_mix

    details = {"kept_type": "fp16", "kept_layers": ["a", "b", "c"], "compressed_layers": 5}
    assert judge_mix("int8_asym", {"f16": 4, "int8": 5}, "IR weight types", details).status == OK
    left_wide = judge_mix("int8_asym", {"f16": 4, "int8": 4, "f32": 1}, "IR weight types", details)
    assert left_wide.status == FALLBACK and "mix asked" in left_wide.reason
    assert judge_mix("int8_asym", {"f16": 5, "int8": 4}, "IR weight types", details).status == FALLBACK
    int4 = {"kept_type": "Q8_0", "kept_layers": ["a"], "compressed_layers": 2}
    assert judge_mix("Q4_0", {"int8": 2, "int4": 1, "int6": 1}, "GGUF tensor types", int4).status == OK
    assert judge_mix("Q4_0", {"int8": 2, "int4": 1, "f16": 1}, "GGUF tensor types", int4).status == FALLBACK

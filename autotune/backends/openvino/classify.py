"""OpenVINO on CPU: IR converted from the torch model (or from ONNX when that fails), f32 or bf16 made
explicit (OpenVINO would pick bf16 by itself on CPUs that have it), int8 through NNCF post-training
quantization (its float layers in f32, or bf16 as an option; a model with attention layers is quantized
as NNCF's transformer model type, without SmoothQuant). With several streams, one call keeps
as many async requests in flight.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import (
    BackendConfig,
    BackendOptions,
    BackendSpec,
    Runner,
    choice,
    import_failure,
    numpy_batch,
)
from autotune.backends.precision import ExecutedPrecision, bucket_of


@dataclass(frozen=True)
class OpenVinoOptions(BackendOptions):
    hint: str = choice("THROUGHPUT", "LATENCY", scheduling=True)
    streams: str | int = choice("auto", 1, 2, 4, 8, scheduling=True)
    # an int8 IR's float layers (those NNCF leaves unquantized) in f32, or in bf16 as OpenVINO picks by itself
    int8_float: str = choice("f32", "bf16", precisions=("int8",))


SPEC = BackendSpec(
    name="openvino",
    description="OpenVINO (CPU plugin); int8 via NNCF",
    precisions=("fp32", "bf16", "int8"),
    options=OpenVinoOptions,
    requires=("openvino", "nncf"),
    packages=("openvino", "nncf"),
    complexity=4,
    prepare_cost=2,  # an IR conversion
    uses_artifact=True,
    # oneTBB dlopens libtbbbind with RTLD_DEEPBIND, so hwloc frees with glibc what the preloaded allocator
    # handed out and compile_model aborts (oneTBB #1645); this setting drops DEEPBIND.
    preloaded_allocator_env=(("TBB_ENABLE_SANITIZERS", "1"),),
)


def unavailable() -> str | None:
    """Why OpenVINO or NNCF does not import here, or None."""
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


MODEL_FILE = "model.xml"


# Bumped whenever build_artifact changes what it writes: cached artifacts of older builders are not reused.
ARTIFACT_VERSION = 3


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """fp32 and bf16 share one IR (precision is a compile-time hint); int8 is its own quantized IR."""
    return {"weights": "int8" if config.precision == "int8" else "float"}


def convert_to_ir(model: Any, example: Any, out_dir: Path) -> tuple[Any, str]:
    import openvino as ov

    try:
        return ov.convert_model(model, example_input=example if len(example) > 1 else example[0]), "torch"
    except Exception:  # tracing fails on some models: go through ONNX instead
        from autotune.backends.onnxruntime.onnx_export import export_onnx

        onnx_path = out_dir / "model.onnx"
        export_onnx(model, example, onnx_path)
        converted = ov.convert_model(str(onnx_path))
        onnx_path.unlink()
        return converted, "onnx"


def build_artifact(
    model: Any, example: Any, calibration: list[Any], config: BackendConfig, out_dir: Path
) -> dict[str, Any]:
    import openvino as ov

    ov_model, source = convert_to_ir(model, example, out_dir)
    details: dict[str, Any] = {"converted_from": source, "openvino": ov.__version__}
    if config.precision == "int8":
        import nncf

        from autotune.backends.torch_common import attention_layers

        dataset = nncf.Dataset([_feed(numpy_batch(batch)) for batch in calibration])
        attention = attention_layers(model)
        ov_model, scheme = nncf_int8(ov_model, dataset, len(calibration), transformer=bool(attention))
        details.update(
            {
                "quantization": scheme,
                "attention_layers": attention,
                "calibration_batches": len(calibration),
                "nncf": nncf.__version__,
            }
        )
    ov.save_model(ov_model, str(out_dir / MODEL_FILE), compress_to_fp16=False)
    return details


def nncf_int8(
    ov_model: Any, dataset: Any, subset_size: int, transformer: bool, smooth_quant: bool = False
) -> tuple[Any, str]:
    """The IR quantized by NNCF, and the scheme's name: a transformer as NNCF's transformer model type
    (SmoothQuant only when asked: see without_smooth_quant), anything else with the performance preset."""
    import nncf

    if not transformer:
        quantized = nncf.quantize(
            ov_model, dataset, subset_size=subset_size, preset=nncf.QuantizationPreset.PERFORMANCE
        )
        return quantized, "NNCF PTQ, performance preset"
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    from autotune.common.cpuinfo import int8_dot_products

    # Without int8 dot products every layer keeps 7-bit weights (NNCF's overflow fix; its default fixes the
    # first layer only): a two-layer ViT drifted 0.36 from FP32 on an AVX2-only EPYC otherwise.
    overflow = OverflowFix.FIRST_LAYER if int8_dot_products() else OverflowFix.ENABLE
    advanced = AdvancedQuantizationParameters(overflow_fix=overflow)
    if not smooth_quant:
        advanced = without_smooth_quant(advanced)
    quantized = nncf.quantize(
        ov_model,
        dataset,
        subset_size=subset_size,
        model_type=nncf.ModelType.TRANSFORMER,
        advanced_parameters=advanced,
    )
    return (
        quantized,
        f"NNCF PTQ, transformer model type (mixed preset, {'SmoothQuant' if smooth_quant else 'no SmoothQuant'}, "
        f"overflow fix {overflow.value})",
    )


def without_smooth_quant(advanced: Any) -> Any:
    """NNCF's transformer model type keeps the norms, residual adds and softmax in float and quantizes
    activations asymmetrically (mixed preset); its SmoothQuant step is left out. On a random-init
    vit_b_16 with synthetic calibration (an EPYC with VNNI, OpenVINO 2026.4, NNCF 3.4;
    docs/benchmarks/int8_scheme_drift.py), relative L2 against FP32: 0.473 with the CNN preset, 0.067 as a
    transformer with SmoothQuant (alpha 0.95), 0.041 without:
    SmoothQuant moves activation outliers into the weights, and where there are none it only adds
    weight error."""
    from nncf.quantization.advanced_parameters import AdvancedSmoothQuantParameters

    advanced.smooth_quant_alphas = AdvancedSmoothQuantParameters(convolution=-1, matmul=-1)
    return advanced


def _feed(arrays: tuple[Any, ...]) -> dict[int, Any]:
    """Inputs by position, as OpenVINO's infer and NNCF's dataset take them."""
    return dict(enumerate(arrays))


def _float_precision(config: BackendConfig) -> str:
    if config.precision == "int8":
        return OpenVinoOptions.of(config).int8_float
    return "bf16" if config.precision == "bf16" else "f32"


def load(example: Any, config: BackendConfig, artifact_dir: Path) -> Runner:
    import openvino as ov
    import openvino.properties as props
    import openvino.properties.hint as hints

    options = OpenVinoOptions.of(config)
    core = ov.Core()
    model = core.read_model(str(artifact_dir / MODEL_FILE))
    model.reshape({model.inputs[i]: list(x.shape) for i, x in enumerate(example)})
    properties: dict[Any, Any] = {
        hints.performance_mode: getattr(hints.PerformanceMode, options.hint),
        # int8 IR: the layers NNCF left in float run in f32 (drift is what quantization costs) unless
        # int8_float=bf16 asks for what OpenVINO would pick by itself on a CPU with bf16.
        hints.inference_precision: ov.Type.bf16 if _float_precision(config) == "bf16" else ov.Type.f32,
        props.inference_num_threads: config.threads_per_instance,
    }
    if options.streams != "auto":
        properties[props.num_streams] = int(options.streams)
    compiled = core.compile_model(model, "CPU", properties)
    effective_streams = int(compiled.get_property(props.num_streams))
    details = {
        "openvino": ov.__version__,
        "effective_precision": str(compiled.get_property(hints.inference_precision)),
        "effective_streams": effective_streams,
        "effective_threads": int(compiled.get_property(props.inference_num_threads)),
        "optimal_requests": int(compiled.get_property(props.optimal_number_of_infer_requests)),
    }
    probe = runtime_model_probe(compiled, core)
    if effective_streams <= 1:
        request = compiled.create_infer_request()

        def run(batch: tuple[Any, ...]) -> Any:
            return request.infer(_feed(batch))[0]

        return Runner(run=run, convert_input=numpy_batch, takes="numpy", details=details, probe=probe)

    queue = ov.AsyncInferQueue(compiled, details["optimal_requests"])
    outputs: dict[int, Any] = {}
    queue.set_callback(lambda request, slot: outputs.__setitem__(slot, request.get_output_tensor(0).data.copy()))

    def run_async(batch: tuple[Any, ...]) -> Any:
        feed = _feed(batch)
        for slot in range(len(queue)):
            queue.start_async(feed, userdata=slot)
        queue.wait_all()
        return outputs[0]

    return Runner(
        run=run_async,
        convert_input=numpy_batch,
        takes="numpy",
        details=details,
        batches_per_call=len(queue),
        probe=probe,
    )


def runtime_model_probe(compiled: Any, core: Any) -> Callable[[Any, str], ExecutedPrecision]:
    """The precision each compute layer runs in, from the compiled model's runtime model (no call):
    an int8 IR whose layers run f32, or a bf16 hint the CPU does not honour, shows there."""
    import openvino.properties.hint as hints

    from autotune.backends.precision import judge

    def probe(native_input: Any, claimed: str) -> ExecutedPrecision:
        why = ""
        effective = compiled.get_property(hints.inference_precision).to_string()
        if claimed == "bf16" and effective != "bf16":
            capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
            offered = (
                "" if "BF16" in capabilities else f" (the CPU plugin offers {' '.join(capabilities)} here, no BF16)"
            )
            why = f"the compiled model's inference precision is {effective}{offered}"
        return judge(claimed, {"OpenVINO runtime model": openvino_counts(compiled)}, why=why)

    return probe


OPENVINO_COMPUTE = {
    "Convolution",
    "GroupConvolution",
    "Deconvolution",
    "BinaryConvolution",
    "FullyConnected",
    "MatMul",
    "RNNSeq",
    "RNNCell",
    "ScaledDotProductAttention",
}
# Snippets: layers the CPU plugin fused into generated code (with few threads, a whole MLP), in the
# precision it generated them for; one counts when the layers it fused include a matrix product or a
# convolution (by their original names, which carry the operator's type), not for an eltwise chain.
_FUSED_COMPUTE = re.compile(r"MatMul|Conv|Gemm|FullyConnected|linear")


def openvino_counts(compiled: Any) -> dict[str, int]:
    """Compute layers of a compiled OpenVINO model by the precision the CPU plugin runs them in."""
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else ""
        fused = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
        if layer not in OPENVINO_COMPUTE and not (layer == "Subgraph" and _FUSED_COMPUTE.search(fused)):
            continue
        precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "other"
        counts[bucket_of(precision)] += 1
    return dict(counts)

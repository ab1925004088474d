"""ONNX Runtime on CPU: the model exported to ONNX (dynamic batch); int8 through static QDQ quantization
(dynamic for a model with attention layers, as ONNX Runtime advises for transformers).

Intra-op threads are the trial's threads_per_instance; inter-op threads only matter in parallel mode.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
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


@dataclass(frozen=True)
class OnnxRuntimeOptions(BackendOptions):
    execution_mode: str = choice("sequential", "parallel", scheduling=True)
    graph_optimization: str = choice("all", "extended", "basic")
    inter_op_threads: int = choice(1, 2, 4, scheduling=True)


SPEC = BackendSpec(
    name="onnxruntime",
    description="ONNX Runtime (CPU execution provider)",
    precisions=("fp32", "int8"),
    options=OnnxRuntimeOptions,
    requires=("onnxruntime", "onnx", "onnxscript"),
    packages=("onnx", "onnxscript", "onnxruntime"),
    complexity=3,
    prepare_cost=1,  # a graph export
    uses_artifact=True,
)


def unavailable() -> str | None:
    """Why ONNX Runtime or its exporter does not import here, or None."""
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


MODEL_FILE = "model.onnx"
PREPROCESSED_FILE = "pre.onnx"  # a scratch file of the int8 build


# Bumped whenever build_artifact changes what it writes: cached artifacts of older builders are not reused.
ARTIFACT_VERSION = 3


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """Only the precision changes the file: session options apply when it is loaded."""
    return {"precision": config.precision}


def build_artifact(
    model: Any, example: Any, calibration: list[Any], config: BackendConfig, out_dir: Path
) -> dict[str, Any]:
    from autotune.backends.onnxruntime.onnx_export import export_onnx

    fp32_path = out_dir / "fp32.onnx"
    exporter = export_onnx(model, example, fp32_path)
    details: dict[str, Any] = {"exporter": exporter}
    if config.precision == "int8":
        from autotune.backends.torch_common import attention_layers

        attention = attention_layers(model)
        try:
            if attention:
                details.update(quantize_dynamic_int8(fp32_path, out_dir))
            else:
                details.update(quantize_static_int8(fp32_path, calibration, out_dir))
        finally:
            fp32_path.unlink()
            (out_dir / PREPROCESSED_FILE).unlink(missing_ok=True)
        details["attention_layers"] = attention
    else:
        fp32_path.rename(out_dir / MODEL_FILE)
    return details


def quantize_static_int8(fp32_path: Path, calibration: list[Any], out_dir: Path) -> dict[str, Any]:
    """Static int8, QDQ format, signed activations and weights, per-channel: ORT's advice for x86 with VNNI."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from autotune.backends.onnxruntime.onnx_export import input_names

    names = input_names(calibration[0])

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([dict(zip(names, numpy_batch(b))) for b in calibration])

        def get_next(self) -> dict[str, Any] | None:
            return next(self.batches, None)

    source = _preprocessed(fp32_path, out_dir)
    quantize_static(
        source,
        str(out_dir / MODEL_FILE),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return {
        "quantization": "static QDQ s8s8 per-channel",
        "preprocessed": source != str(fp32_path),
        "calibration_batches": len(calibration),
    }


def quantize_dynamic_int8(fp32_path: Path, out_dir: Path) -> dict[str, Any]:
    """Dynamic int8 of the matrix products (weights per channel, activations quantized per call): ONNX
    Runtime's advice for transformer models, whose activations a static calibration cannot cover. Only
    MatMul: a convolution would become ConvInteger (per-tensor and unfused; older ONNX Runtime releases
    run it with uint8 weights only), an embedding's Gather a per-tensor table. Without int8 dot products
    (cpuinfo.int8_dot_products) the weights keep 7 bits (`reduce_range`): the u8 x s8 kernels of AVX2 and
    AVX-512 saturate otherwise (a two-layer ViT drifted 0.27 from FP32 on an AVX2-only EPYC)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from autotune.common.cpuinfo import int8_dot_products

    source = _preprocessed(fp32_path, out_dir)
    reduce_range = not int8_dot_products()
    quantize_dynamic(
        source,
        str(out_dir / MODEL_FILE),
        per_channel=True,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
    )
    scheme = "dynamic s8 MatMul weights per-channel" + (", 7-bit (no VNNI)" if reduce_range else "")
    return {"quantization": scheme, "preprocessed": source != str(fp32_path)}


def _preprocessed(fp32_path: Path, out_dir: Path) -> str:
    """The model to quantize: PREPROCESSED_FILE (ONNX Runtime's shape inference and optimization) when
    that succeeds, else the exported model."""
    from onnxruntime.quantization import quant_pre_process

    pre = str(out_dir / PREPROCESSED_FILE)
    try:
        quant_pre_process(str(fp32_path), pre)
        return pre
    except Exception:  # shape inference fails on some graphs; quantization still works without it
        return str(fp32_path)


def load(example: Any, config: BackendConfig, artifact_dir: Path) -> Runner:
    import onnxruntime as ort

    chosen = OnnxRuntimeOptions.of(config)
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.threads_per_instance
    parallel = chosen.execution_mode == "parallel"
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = int(chosen.inter_op_threads) if parallel else 1
    options.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[chosen.graph_optimization]
    session, probe = _session_and_probe(str(artifact_dir / MODEL_FILE), options, config.precision)
    names = [i.name for i in session.get_inputs()]

    def run(batch: tuple[Any, ...]) -> Any:
        return session.run(None, dict(zip(names, batch)))[0]

    return Runner(
        run=run,
        convert_input=numpy_batch,
        takes="numpy",
        details={"onnxruntime": ort.__version__, "inter_op_threads": options.inter_op_num_threads},
        probe=probe,
    )


def _session_and_probe(model_path: str, options: Any, precision: str) -> tuple[Any, Any]:
    """The session, and what it executes: for int8 the session writes the graph it optimized (and
    runs) to a scratch file, read once here: quantized operators, or float ones left between Q/DQ
    pairs (graph optimization below `extended` does not fuse QDQ). The timed session itself, no call."""
    import onnxruntime as ort

    if precision != "int8":
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        return session, None
    import onnx

    from autotune.backends.precision import ExecutedPrecision, judge

    try:
        with tempfile.TemporaryDirectory(prefix="autotune-ort-") as scratch:
            options.optimized_model_filepath = os.path.join(scratch, "optimized.onnx")
            # Weights go to a side file: the graph alone is small to write and to read.
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "64")
            session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
            graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
            counts = onnx_graph_counts(list(graph.node))
    except Exception as exc:  # not written or not readable: run without it (a broken model fails here again)
        options.optimized_model_filepath = ""
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        reason = f"ONNX Runtime's optimized graph could not be read: {type(exc).__name__}: {exc}"
        return session, lambda native_input, claimed: ExecutedPrecision.unchecked(claimed, reason)
    unfused = options.graph_optimization_level in (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    )
    why = "ONNX Runtime fuses QDQ pairs into int8 operators from graph_optimization=extended on" if unfused else ""
    return session, lambda native_input, claimed: judge(claimed, {"ONNX Runtime optimized graph": counts}, why=why)


ORT_INT8 = {
    "QLinearConv",
    "QLinearMatMul",
    "MatMulInteger",
    "ConvInteger",
    "QGemm",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "QAttention",
    "DynamicQuantizeLSTM",
    "QLinearConvTranspose",
}
ORT_FLOAT = {
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "FusedConv",
    "FusedGemm",
    "FusedMatMul",
    "Attention",
    "MultiHeadAttention",
    "LSTM",
    "GRU",
    "RNN",
}


def onnx_graph_counts(nodes: list[Any]) -> dict[str, int]:
    """Compute nodes of an (optimized) ONNX graph: quantized operators count as int8, float ones
    (left between QuantizeLinear/DequantizeLinear pairs when not fused) as f32."""
    counts: Counter[str] = Counter()
    for node in nodes:
        if node.op_type in ORT_INT8:
            counts["int8"] += 1
        elif node.op_type in ORT_FLOAT:
            counts["f32"] += 1
    return dict(counts)

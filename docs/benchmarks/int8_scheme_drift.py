"""How far each post-training int8 scheme of ONNX Runtime and OpenVINO (NNCF) moves a model's outputs.

The search quantizes a model with attention layers as the toolkits advise for transformers (ONNX Runtime
dynamic int8; NNCF's transformer model type without SmoothQuant) and other models with the CNN schemes
(static int8 on every operator). This prints the drift of every scheme on one model, the same
calibration and evaluation inputs for all, so the choice can be checked on a machine and a model:

    .venv/bin/python docs/benchmarks/int8_scheme_drift.py --model vit_b_16

Random init (no weights are downloaded), seeded synthetic inputs; a torchvision model's zero-initialised
classifier head is drawn again (normal, std 0.02) so that the outputs vary with the input. Drift is the
relative L2 distance from FP32 eager (the search's default metric and bound, 0.05).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from autotune.backends.onnxruntime.classify import quantize_dynamic_int8, quantize_static_int8
from autotune.backends.openvino.classify import convert_to_ir, nncf_int8
from autotune.backends.torch_common import attention_layers
from autotune.measure.drift import relative_l2


def random_model(name: str) -> torch.nn.Module:
    """A torchvision classifier, random init, its classifier head drawn again where it starts at zero."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name).eval()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not module.weight.abs().sum():
            torch.nn.init.normal_(module.weight, std=0.02)
    return model


def onnxruntime_outputs(onnx_path: Path, inputs: np.ndarray, batch: int) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: inputs[i : i + batch]})[0] for i in range(0, len(inputs), batch)])


def openvino_outputs(model: Any, inputs: np.ndarray, batch: int) -> np.ndarray:
    import openvino as ov

    model = model.clone()
    model.reshape({model.inputs[0]: [batch, *inputs.shape[1:]]})
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.concatenate([compiled(inputs[i : i + batch])[0] for i in range(0, len(inputs), batch)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_b_16", help="a torchvision classification model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--calibration-batches", type=int, default=4)
    parser.add_argument("--eval-batches", type=int, default=4)
    args = parser.parse_args()

    import nncf

    from autotune.backends.onnxruntime.onnx_export import export_onnx

    model = random_model(args.model)
    shape = (3, 224, 224)
    calibration = [
        (torch.randn(args.batch, *shape, generator=torch.Generator().manual_seed(seed)),)
        for seed in range(args.calibration_batches)
    ]
    inputs = torch.randn(args.batch * args.eval_batches, *shape, generator=torch.Generator().manual_seed(99))
    with torch.inference_mode():
        reference = model(inputs).numpy()
    scratch = tempfile.TemporaryDirectory(prefix="int8-schemes-")  # the ONNX and IR files, removed at the end
    work = Path(scratch.name)
    fp32_onnx = work / "fp32.onnx"
    export_onnx(model, calibration[0], fp32_onnx)
    ov_model, _ = convert_to_ir(model, calibration[0], work)
    dataset = nncf.Dataset([batch[0].numpy() for batch in calibration])
    evaluated = inputs.numpy()

    def ort_scheme(quantize: Callable[[Path], dict[str, Any]]) -> Callable[[], np.ndarray]:
        """The scheme applied to the exported FP32 model; it writes model.onnx beside it."""

        def run() -> np.ndarray:
            quantize(fp32_onnx)
            return onnxruntime_outputs(work / "model.onnx", evaluated, args.batch)

        return run

    def nncf_scheme(transformer: bool, smooth_quant: bool = False) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            quantized, _ = nncf_int8(ov_model, dataset, len(calibration), transformer, smooth_quant)
            return openvino_outputs(quantized, evaluated, args.batch)

        return run

    schemes: dict[str, tuple[str, Callable[[], np.ndarray]]] = {
        "ONNX Runtime static QDQ s8s8 per-channel": (
            "models without attention layers",
            ort_scheme(lambda path: quantize_static_int8(path, calibration, path.parent)),
        ),
        "ONNX Runtime dynamic s8 MatMul per-channel": (
            "models with attention layers",
            ort_scheme(lambda path: quantize_dynamic_int8(path, path.parent)),
        ),
        "NNCF performance preset": ("models without attention layers", nncf_scheme(transformer=False)),
        "NNCF transformer, SmoothQuant (NNCF's default)": ("", nncf_scheme(transformer=True, smooth_quant=True)),
        "NNCF transformer, no SmoothQuant": ("models with attention layers", nncf_scheme(transformer=True)),
    }
    found = attention_layers(model)
    table = Table(
        title=f"{args.model}, random init: int8 drift from FP32 eager "
        f"({args.calibration_batches}x{args.batch} calibration, {len(evaluated)} evaluated samples; "
        f"attention layers: {found or 'none'})"
    )
    for column in ("scheme", "autotune uses it for", "relative L2", "within 0.05", "seconds"):
        table.add_column(column)
    for name, (used_for, run) in schemes.items():
        started = time.monotonic()
        drift = relative_l2(run(), reference)
        table.add_row(
            name, used_for or "-", f"{drift:.4f}", "yes" if drift <= 0.05 else "no", f"{time.monotonic() - started:.0f}"
        )
    Console(width=200).print(table)
    scratch.cleanup()


if __name__ == "__main__":
    main()

"""torch -> ONNX with a dynamic batch dimension, shared by the ONNX Runtime and OpenVINO backends."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

OPSET = 18
INPUT_NAME = "input"
OUTPUT_NAME = "output"


def input_names(example: tuple[Any, ...]) -> list[str]:
    """ONNX input names: `input` for one input, `input_0`, `input_1`, ... for several."""
    return [INPUT_NAME] if len(example) == 1 else [f"{INPUT_NAME}_{i}" for i in range(len(example))]


def export_onnx(model: Any, example: tuple[Any, ...], path: Path) -> str:
    """Export with the dynamo exporter; fall back to the TorchScript one. Returns which one worked."""
    import torch

    # A batch of 1 would be specialised away: export with at least 2 so the batch stays dynamic.
    if len(example[0]) < 2:
        example = tuple(torch.cat([x, x]) for x in example)
    names = input_names(example)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                model,
                example,
                str(path),
                dynamo=True,
                opset_version=OPSET,
                input_names=names,
                output_names=[OUTPUT_NAME],
                dynamic_shapes=tuple({0: "batch"} for _ in example),
                external_data=False,
                verbose=False,
            )
            return "torch.onnx dynamo"
        except Exception:  # some models do not export through torch.export: the legacy exporter may work
            torch.onnx.export(
                model,
                example,
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=names,
                output_names=[OUTPUT_NAME],
                dynamic_axes={**{n: {0: "batch"} for n in names}, OUTPUT_NAME: {0: "batch"}},
            )
            return "torch.onnx torchscript"

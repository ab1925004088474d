"""torchao int8 through PT2E: export (strict) -> X86InductorQuantizer -> calibrate -> convert, saved as an
exported program; timing processes load it and compile with inductor freezing.

`scheme: static` quantizes activations with calibrated scales (CNNs); `dynamic` computes activation
scales per batch and quantizes Linear layers only (transformer-style models).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendOptions, BackendSpec, Runner, choice, import_failure


@dataclass(frozen=True)
class TorchaoOptions(BackendOptions):
    scheme: str = choice("static", "dynamic")
    memory_format: str = choice("contiguous", "channels_last")


SPEC = BackendSpec(
    name="torchao",
    description="torchao PT2E int8 + torch.compile (inductor, freezing)",
    precisions=("int8",),
    options=TorchaoOptions,
    requires=("torchao",),
    packages=("torchao",),
    complexity=5,
    prepare_cost=3,  # export, quantize and calibrate
    uses_artifact=True,
    torch_threads=True,
    inductor_cache=True,
)


def unavailable() -> str | None:
    """Why torchao does not import here, or None."""
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


PROGRAM_FILE = "quantized.pt2"


# Bumped whenever build_artifact changes what it writes: cached artifacts of older builders are not reused.
ARTIFACT_VERSION = 2


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """The exported program is specialised to the batch size and memory format."""
    options = TorchaoOptions.of(config)
    return {"scheme": options.scheme, "memory_format": options.memory_format, "batch_size": config.batch_size}


def build_artifact(
    model: Any, example: Any, calibration: list[Any], config: BackendConfig, out_dir: Path
) -> dict[str, Any]:
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    from autotune.backends.torch_common import input_converter

    options = TorchaoOptions.of(config)
    dynamic = options.scheme == "dynamic"
    convert = input_converter(options.memory_format)
    example = convert(example)
    with torch.no_grad():
        # Strict export: non-strict export failed inside the quantizer on resnet50 with current versions.
        # Only the input takes the memory format: channels_last weights do not survive torch.export.save,
        # and freezing repacks weights for the kernels anyway.
        graph = torch.export.export(model.eval(), example, strict=True).module()
        quantizer = X86InductorQuantizer()
        quantizer.set_global(get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
        prepared = prepare_pt2e(graph, quantizer)
        for batch in calibration:
            prepared(*convert(batch))
        quantized = convert_pt2e(prepared)
        program = torch.export.export(quantized, example, strict=False)
    torch.export.save(program, str(out_dir / PROGRAM_FILE))
    return {
        "quantization": f"PT2E X86InductorQuantizer {'dynamic' if dynamic else 'static'}",
        "calibration_batches": len(calibration),
    }


def load(example: Any, config: BackendConfig, artifact_dir: Path) -> Runner:
    import torch
    import torch._inductor.config as inductor_config

    # Importing these registers the quantized_decomposed ops the program uses and the inductor passes
    # that fuse them into int8 oneDNN kernels; without the latter the program runs dequantized (slow).
    import torchao.quantization.pt2e.quantize_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer  # noqa: F401

    from autotune.backends.torch_common import input_converter, torch_probe

    module = torch.export.load(str(artifact_dir / PROGRAM_FILE)).module()
    inductor_config.freezing = True  # int8 weights are prepacked only with freezing
    compiled = torch.compile(module)

    def run(batch: tuple[Any, ...]) -> Any:
        with torch.no_grad():
            return compiled(*batch)

    return Runner(
        run=run,
        convert_input=input_converter(TorchaoOptions.of(config).memory_format),
        details={"freezing": True},
        probe=torch_probe(run),
    )

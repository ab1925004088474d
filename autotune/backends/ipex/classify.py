"""Intel Extension for PyTorch: ipex.optimize (fp32, bf16) run eagerly, traced and frozen with
TorchScript, or compiled with torch.compile (IPEX's own backend or inductor); int8 is IPEX static
quantization, calibrated once, traced, frozen and saved, then loaded by the timing processes.

IPEX 2.8 imports only with torch 2.8, so these trials run in the runtime `make setup` builds for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendOptions, BackendSpec, Runner, choice, import_failure

# Where IPEX runs: said with the reason wherever it does not import.
RUNTIME_HINT = "IPEX 2.8 imports only with torch 2.8: its trials run in the IPEX runtime .venv-ipex (make setup)"


@dataclass(frozen=True)
class IpexOptions(BackendOptions):
    # int8 is always traced and frozen (IPEX's int8 path)
    graph: str = choice("eager", "torchscript", "compile_ipex", "compile_inductor", precisions=("fp32", "bf16"))
    memory_format: str = choice("channels_last", "contiguous")


SPEC = BackendSpec(
    name="ipex",
    description="Intel Extension for PyTorch (ipex.optimize; static int8)",
    precisions=("fp32", "bf16", "int8"),
    options=IpexOptions,
    requires=("intel_extension_for_pytorch",),
    packages=("intel-extension-for-pytorch",),
    # IPEX keeps the model in PyTorch (no export to another format), though in a runtime of its own
    complexity=2,
    prepare_cost=4,  # ipex.optimize and its trace
    runtime_hint=RUNTIME_HINT,
    uses_artifact=("int8",),
    torch_threads=True,
)


def unavailable() -> str | None:
    """Why IPEX does not import in this runtime (with the runtime it runs in), or None."""
    return import_failure(SPEC)


PROGRAM_FILE = "quantized.pt"


def unsupported(config: BackendConfig) -> str | None:
    """Combinations that cannot run, refused before launch. IPEX builds a CPU pool from Intel OpenMP's
    affinity when it is imported; with KMP_AFFINITY=disabled that pool is empty and the import fails
    ("Can't find available core id ... CPUPool construction"), seen on every such trial."""
    if config.openmp == "intel" and config.kmp_affinity == "disabled":
        return "IPEX cannot import with Intel OpenMP's KMP_AFFINITY=disabled (its CPU pool finds no core)"
    return None


ARTIFACT_VERSION = 1


def _example(batch: tuple[Any, ...], memory_format: str) -> tuple[Any, ...]:
    from autotune.backends.torch_common import input_converter

    return input_converter(memory_format)(batch)


def prepare(model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
    """ipex.optimize at the trial's precision, then the graph mode the trial asked for."""
    import intel_extension_for_pytorch as ipex
    import torch

    from autotune.backends.torch_common import convert_for, module_runner

    options = IpexOptions.of(config)
    graph = options.graph
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    optimized, prepacked = _optimize(ipex, convert_for(model, options.memory_format), dtype)
    if graph == "torchscript":
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.precision == "bf16"):
            traced = torch.jit.trace(
                optimized, _example(example, options.memory_format), check_trace=False, strict=False
            )
            optimized = torch.jit.freeze(traced)
    elif graph.startswith("compile_"):
        optimized = torch.compile(optimized, backend=graph.removeprefix("compile_"), dynamic=False)
    return module_runner(
        optimized,
        config.precision,
        options.memory_format,
        details={"graph": graph, "ipex": ipex.__version__, "weights_prepack": prepacked},
    )


def _optimize(ipex: Any, model: Any, dtype: Any) -> tuple[Any, bool]:
    """ipex.optimize, prepacking weights where the CPU can. IPEX's bf16 prepack needs AVX-512 BW/VL/DQ
    or AVX-NE-CONVERT and asserts otherwise (seen on an AVX2-only EPYC); there bf16 runs unpacked, and
    the trial's details say so."""
    try:
        return ipex.optimize(model, dtype=dtype), True
    except AssertionError as error:
        if "weight prepack" not in str(error):
            raise
        return ipex.optimize(model, dtype=dtype, weights_prepack=False), False


def artifact_identity(config: BackendConfig) -> dict[str, Any]:
    """The traced int8 graph is specialised to the batch size and memory format."""
    return {
        "precision": config.precision,
        "memory_format": IpexOptions.of(config).memory_format,
        "batch_size": config.batch_size,
    }


def build_artifact(
    model: Any, example: Any, calibration: list[Any], config: BackendConfig, out_dir: Path
) -> dict[str, Any]:
    """IPEX static int8: observers from the default static qconfig, calibration, convert, trace, freeze."""
    import intel_extension_for_pytorch as ipex
    import torch
    from intel_extension_for_pytorch.quantization import convert
    from intel_extension_for_pytorch.quantization import prepare as prepare_int8

    from autotune.backends.torch_common import convert_for

    memory_format = IpexOptions.of(config).memory_format
    example = _example(example, memory_format)
    model = convert_for(model, memory_format)
    prepared = prepare_int8(
        model, ipex.quantization.default_static_qconfig_mapping, example_inputs=example, inplace=False
    )
    with torch.no_grad():
        for batch in calibration:
            prepared(*_example(batch, memory_format))
        quantized = convert(prepared)
        traced = torch.jit.freeze(torch.jit.trace(quantized, example, check_trace=False, strict=False))
        traced(*example)  # the first calls fuse the int8 graph; save it fused
        traced(*example)
    traced.save(str(out_dir / PROGRAM_FILE))
    return {
        "quantization": "IPEX static int8 (default_static_qconfig_mapping), TorchScript traced and frozen",
        "calibration_batches": len(calibration),
        "ipex": ipex.__version__,
    }


def load(example: Any, config: BackendConfig, artifact_dir: Path) -> Runner:
    import intel_extension_for_pytorch as ipex  # registers the int8 kernels the saved graph calls
    import torch

    from autotune.backends.torch_common import input_converter, torch_probe

    module = torch.jit.load(str(artifact_dir / PROGRAM_FILE))

    def run(batch: tuple[Any, ...]) -> Any:
        with torch.no_grad():
            return module(*batch)

    return Runner(
        run=run,
        convert_input=input_converter(IpexOptions.of(config).memory_format),
        details={"graph": "torchscript", "ipex": ipex.__version__},
        probe=torch_probe(run),
    )

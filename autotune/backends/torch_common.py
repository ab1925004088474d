"""Pieces shared by the backends that run a torch nn.Module: memory format, autocast, inference mode."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from autotune.backends.base import Runner
from autotune.backends.precision import ExecutedPrecision


def memory_format_of(options: dict[str, Any]) -> torch.memory_format:
    return torch.channels_last if options.get("memory_format") == "channels_last" else torch.contiguous_format


def convert_for(model: torch.nn.Module, options: dict[str, Any]) -> torch.nn.Module:
    return model.eval().to(memory_format=memory_format_of(options))


def input_converter(options: dict[str, Any]):
    """Batch (tuple of tensors) in, batch out: 4-D float inputs take the memory format, the rest stay."""
    fmt = memory_format_of(options)

    def convert(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(x.contiguous(memory_format=fmt) if x.dim() == 4 and x.is_floating_point() else x for x in batch)

    return convert


def precision_context(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"precision {precision!r} is not supported by this backend")


def module_runner(
    module: Any, precision: str, options: dict[str, Any], details: dict[str, Any] | None = None
) -> Runner:
    """Wrap a callable module so every call runs under inference mode and the precision's autocast."""

    def run(batch: tuple[torch.Tensor, ...]) -> Any:
        with torch.inference_mode(), precision_context(precision):
            return module(*batch)

    return Runner(run=run, convert_input=input_converter(options), details=details or {}, probe=torch_probe(run))


def torch_probe(run: Callable[[Any], Any]) -> Callable[[Any, str], ExecutedPrecision]:
    """A runner's probe: one call under oneDNN's verbose mode and the torch profiler."""
    from autotune.backends.precision import probe_torch

    return lambda native_input, claimed: probe_torch(lambda: run(native_input), claimed)


T = TypeVar("T")
REDUCING_LAYERS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)


def with_reduction_depth(model: torch.nn.Module, forward: Callable[[], T]) -> tuple[T, float | None]:
    """`forward()`'s result, and the multiply-adds per output element of the model's convolutions and
    linear layers over that call: how deep their dot products reduce on average (torchvision's models at
    224x224: resnet50 368, vit_b_16 1221 without its attention's own projections, mobilenet_v3_large 49,
    efficientnet_b0 57). Where the CPU has no int8 dot products, int8 gains in the reduction, while every
    output element is requantized (tuning/payoff.py). Counted by hooks on the work the caller does anyway
    (the reference's own pass: no batch it did not run); None where no such layer ran as a Python module
    (a TorchScript or exported program has none)."""
    totals = {"macs": 0, "outputs": 0}

    def count(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor) or output.dim() == 0:
            return
        if isinstance(module, torch.nn.Linear):
            per_output = module.in_features
        else:
            weight = module.weight  # (out, in / groups, *kernel)
            assert isinstance(weight, torch.Tensor)
            per_output = weight[0].numel()
        totals["macs"] += output.numel() * per_output
        totals["outputs"] += output.numel()

    hooks = []
    try:
        for module in model.modules():
            if isinstance(module, REDUCING_LAYERS):
                hooks.append(module.register_forward_hook(count))
        result = forward()
    finally:
        for hook in hooks:
            hook.remove()
    return result, (totals["macs"] / totals["outputs"] if totals["outputs"] else None)


def attention_layers(model: torch.nn.Module) -> dict[str, int]:
    """The model's attention layers by class (torch's MultiheadAttention, or a class whose name ends in
    Attention: transformers' BertAttention, ViTSelfAttention...; a TorchScript module by its original
    class), outermost only, counted; empty for a convolutional network. The post-training int8 schemes
    that suit a CNN lose a transformer's accuracy: with static int8 on every operator a random-init
    vit_b_16 drifted 0.49 (ONNX Runtime) and 0.47 (OpenVINO) against 0.05 (docs/manual/benchmarks-log.md)."""
    found: dict[str, int] = {}
    counted: list[str] = []
    for path, module in model.named_modules():
        name = getattr(module, "original_name", None) or type(module).__name__
        inside = any(path.startswith(outer + ".") for outer in counted)
        if not inside and (isinstance(module, torch.nn.MultiheadAttention) or name.lower().endswith("attention")):
            counted.append(path)
            found[name] = found.get(name, 0) + 1
    return found

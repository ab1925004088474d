"""Inside a model whose outputs are the same for every input: the last layer whose output still varies,
the head after it, and a seeded redraw of the head's all-zero weights.

torchvision's vision transformers, for one, initialise their classification head to zeros, so a random
init maps any features to zero outputs and drift against them is blind. Redrawing the head's weights
(in the init every trial loads) makes the outputs a random projection of the features, which every
backend's drift then sees, whatever it builds from the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

HEAD_SEED = 2468  # the redraw is the same in every process, so every trial runs the same model


class CannotInspect(Exception):
    """The model's modules cannot be hooked (e.g. TorchScript)."""


@dataclass(frozen=True)
class Layers:
    """Where a constant output comes from."""

    varying: str | None  # the last module (in the order they finish) whose output differs between inputs
    head: list[str]  # the modules that start after it has finished, in the order they start


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _flat(value: Any) -> np.ndarray:
    parts = [t.detach().reshape(-1).float().cpu().numpy() for t in _tensors(value)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


class _Recorder:
    """Forward hooks that note when each module starts and finishes, and whether its output (each of
    its calls within one forward) differs between forwards on different inputs."""

    def __init__(self, constant: Callable[[np.ndarray], bool]) -> None:
        self.constant = constant
        self.forward = 0  # which input is running
        self.clock = 0
        self.calls: dict[str, int] = {}  # this forward's calls of each module so far
        self.starts: dict[str, int] = {}  # first forward: when each module first started
        self.ends: dict[tuple[str, int], int] = {}  # first forward: when each call finished
        self.first: dict[tuple[str, int], np.ndarray] = {}  # first forward: each call's output
        self.varies: set[tuple[str, int]] = set()

    def begin(self, forward: int) -> None:
        self.forward, self.clock, self.calls = forward, 0, {}

    def started(self, name: str) -> None:
        self.clock += 1
        if self.forward == 0:
            self.starts.setdefault(name, self.clock)

    def finished(self, name: str, output: Any) -> None:
        self.clock += 1
        key = (name, self.calls.get(name, 0))
        self.calls[name] = key[1] + 1
        values = _flat(output)
        if self.forward == 0:
            self.ends[key], self.first[key] = self.clock, values
        elif values.size == 0 and key in self.first and self.first[key].size == 0:
            pass  # no tensors out (e.g. None): nothing to compare
        elif key not in self.first or self.first[key].shape != values.shape:
            self.varies.add(key)  # the forward itself changed with the input
        elif key not in self.varies and not self.constant(np.stack([self.first[key], values])):
            self.varies.add(key)

    def layers(self) -> Layers:
        varying = [key for key in self.ends if key in self.varies]
        if not varying:
            return Layers(None, [])
        last = max(varying, key=lambda key: self.ends[key])
        after = sorted((start, name) for name, start in self.starts.items() if start > self.ends[last])
        return Layers(last[0], [name for _, name in after])


def find_layers(model: Any, samples: list[tuple[Any, ...]], constant: Callable[[np.ndarray], bool]) -> Layers:
    """Run each sample (a batch of one) through the model with hooks on every submodule, and find the
    last one whose output differs between samples. `constant` tells whether stacked outputs are the same."""
    import torch

    recorder = _Recorder(constant)
    handles = []
    try:
        for name, module in model.named_modules():
            if not name:
                continue  # the model itself: its output is the one known to be constant
            handles.append(module.register_forward_pre_hook(lambda m, a, name=name: recorder.started(name)))
            handles.append(module.register_forward_hook(lambda m, a, out, name=name: recorder.finished(name, out)))
    except (RuntimeError, AttributeError, TypeError) as exc:
        raise CannotInspect(f"{type(exc).__name__}: {exc}") from None
    try:
        with torch.inference_mode():
            for i, sample in enumerate(samples):
                recorder.begin(i)
                model(*sample)
    finally:
        for handle in handles:
            handle.remove()
    if handles and not recorder.ends:  # traced TorchScript takes hooks and never calls them
        raise CannotInspect("no hook ran")
    return recorder.layers()


def redraw_zero_weights(model: Any, head: list[str], seed: int = HEAD_SEED) -> list[str]:
    """Redraw, in place, every all-zero weight (two or more dimensions) of the head's modules as
    nn.Linear and nn.Conv draw theirs, uniform in +-1/sqrt(fan_in), from a fixed seed. Biases stay:
    a constant offset carries nothing. Returns the names of the redrawn parameters."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    modules = dict(model.named_modules())
    redrawn = []
    for name in head:
        for param_name, param in sorted(modules[name].named_parameters(recurse=False)):
            if param.dim() < 2 or bool(torch.any(param != 0)):
                continue
            bound = 1.0 / math.sqrt(param[0].numel())
            with torch.no_grad():
                param.copy_(torch.empty(param.shape).uniform_(-bound, bound, generator=generator))
            redrawn.append(f"{name}.{param_name}")
    return redrawn

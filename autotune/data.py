"""Inputs the worker feeds models: seeded synthetic tensors, with disjoint seeds per purpose.

Evaluation (drift), calibration (int8) and timing inputs never share a seed, so calibration data is
disjoint from the data drift is measured on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EVAL_SEED = 1234
CALIBRATION_SEED = 5678
TIMING_SEED = 4321


def synthetic_inputs(shape: tuple[int, ...], count: int, seed: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn((count, *shape), generator=generator)


def fixed_batches(inputs: Any, batch_size: int) -> list[Any]:
    """Split into batches of exactly batch_size, padding the last by cycling through the inputs, so shapes
    never change (fixed-shape backends) even when there are fewer inputs than one batch."""
    import torch

    batches = []
    for start in range(0, len(inputs), batch_size):
        chunk = inputs[start : start + batch_size]
        if len(chunk) < batch_size:
            chunk = torch.cat([chunk, inputs[torch.arange(batch_size - len(chunk)) % len(inputs)]])
        batches.append(chunk)
    return batches


def to_numpy(output: Any) -> np.ndarray:
    """A backend's output (torch tensor, numpy array, OpenVINO tensor) as float32 numpy."""
    if hasattr(output, "detach"):
        return output.detach().float().cpu().numpy()
    return np.asarray(output, dtype=np.float32)

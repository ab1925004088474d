"""Inputs the worker feeds models: seeded synthetic batches, with disjoint seeds per purpose.

Evaluation (drift), calibration (int8) and timing inputs never share a seed, so calibration data is
disjoint from the data drift is measured on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EVAL_SEED = 1234
CALIBRATION_SEED = 5678
TIMING_SEED = 4321


def synthetic_inputs(specs: tuple[Any, ...], count: int, seed: int) -> tuple[Any, ...]:
    """A batch (tuple, one tensor per model input) of `count` seeded random samples."""
    from autotune.inputs import synthetic

    return synthetic(specs, count, seed)


def to_numpy(output: Any) -> np.ndarray:
    """A backend's output (torch tensor, numpy array, OpenVINO tensor) as float32 numpy."""
    if hasattr(output, "detach"):
        return output.detach().float().cpu().numpy()
    return np.asarray(output, dtype=np.float32)

"""Seeds of the synthetic batches the worker feeds models (disjoint per purpose), and outputs as numpy.

Evaluation (drift), calibration (int8) and timing inputs never share a seed, so calibration data is
disjoint from the data drift is measured on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EVAL_SEED = 1234
CALIBRATION_SEED = 5678
TIMING_SEED = 4321


def to_numpy(output: Any) -> np.ndarray:
    """A backend's output (torch tensor, numpy array, OpenVINO tensor) as float32 numpy."""
    if hasattr(output, "detach"):
        return output.detach().float().cpu().numpy()
    return np.asarray(output, dtype=np.float32)

"""Drift of a candidate's outputs from the FP32 eager reference: pure functions over arrays."""

from __future__ import annotations

import numpy as np


def relative_l2(outputs: np.ndarray, reference: np.ndarray) -> float:
    """||y - y_ref|| / ||y_ref|| over the whole evaluation set: scale-free, 0 for identical outputs."""
    outputs = np.asarray(outputs, dtype=np.float64).reshape(len(reference), -1)
    reference = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    denom = np.linalg.norm(reference)
    return float(np.linalg.norm(outputs - reference) / denom) if denom > 0 else float(np.linalg.norm(outputs))


def top1_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Share of samples whose arg-max class equals the reference's."""
    outputs = np.asarray(outputs).reshape(len(reference), -1)
    reference = np.asarray(reference).reshape(len(reference), -1)
    return float(np.mean(outputs.argmax(axis=1) == reference.argmax(axis=1)))


def compute_drift(outputs: np.ndarray, reference: np.ndarray) -> dict[str, float | int]:
    if np.shape(outputs) != np.shape(reference):
        raise ValueError(f"output shape {np.shape(outputs)} differs from the reference {np.shape(reference)}")
    finite = bool(np.all(np.isfinite(outputs)))
    return {
        "relative_l2": relative_l2(outputs, reference) if finite else float("inf"),
        "top1_agreement": top1_agreement(outputs, reference) if finite else 0.0,
        "samples": int(len(reference)),
    }

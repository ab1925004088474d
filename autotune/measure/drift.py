"""Drift of a candidate's outputs from the FP32 eager reference, and the criterion that bounds it.

Pure functions over arrays. Every metric is computed for every trial (relative L2 for any output,
cosine similarity for embeddings, top-1 agreement for classifiers, and top-1 accuracy against labels
when the data has them); the user's criterion picks one and bounds its *drop* from FP32, absolute or
relative, as accuracy-aware quantization tools do (NNCF's max_drop / drop_type).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from autotune.common.json_record import Record

METRICS = ("relative_l2", "cosine", "top1", "accuracy", "perplexity", "kld")
METRIC_HELP = {
    "relative_l2": "relative L2 error of the outputs, ||y - y_fp32|| / ||y_fp32||",
    "cosine": "1 - mean cosine similarity of each sample's output with FP32's (embeddings)",
    "top1": "share of samples (for LMs, text positions) whose top-1 class (next token) differs from FP32's",
    "accuracy": "drop of top-1 accuracy against the data's labels, FP32 minus candidate",
    "perplexity": "relative increase of perplexity on the evaluation text, then FP32's generated text (LMs), e.g. 2%",
    "kld": "mean KL divergence of the next-token distributions from FP32's, as llama-perplexity --kl-divergence (LMs)",
}
# What --max-drift bounds when --drift-metric is not given. A language model's default is what people who
# quantize LLMs read: llama.cpp's tools/perplexity/README.md ranks every GGUF type of LLaMA 3 8B by mean KL
# divergence from FP16 (q8_0 0.0014, q6_K 0.0055, q5_K_M 0.011, q4_K_M 0.031, q4_0 0.072, q2_K 0.45).
# The default bound, DEFAULT_MAX_DRIFT, falls between q4_K_M, the type most users deploy, and q4_0.
DEFAULT_GENERATION_METRIC = "kld"
DEFAULT_CLASSIFY_METRIC = "relative_l2"
DEFAULT_MAX_DRIFT = 0.05
# The metrics a bound may be a percentage of FP32's value for (the others are already shares).
RELATIVE_METRICS = ("accuracy", "perplexity")


def _flat(values: np.ndarray, rows: int) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(rows, -1)


def relative_l2(outputs: np.ndarray, reference: np.ndarray) -> float:
    """||y - y_ref|| / ||y_ref|| over the whole evaluation set: scale-free, 0 for identical outputs."""
    outputs, reference = _flat(outputs, len(reference)), _flat(reference, len(reference))
    denom = np.linalg.norm(reference)
    return float(np.linalg.norm(outputs - reference) / denom) if denom > 0 else float(np.linalg.norm(outputs))


def cosine_similarity(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Mean over samples of the cosine between a sample's output vector and the reference's. A zero
    vector has no direction: it agrees (1) only with a zero reference, and not at all (0) otherwise."""
    outputs, reference = _flat(outputs, len(reference)), _flat(reference, len(reference))
    output_norms, reference_norms = np.linalg.norm(outputs, axis=1), np.linalg.norm(reference, axis=1)
    norms = output_norms * reference_norms
    dots = np.sum(outputs * reference, axis=1)
    both_zero = (output_norms == 0) & (reference_norms == 0)
    cos = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(both_zero, 1.0, 0.0))
    return float(np.mean(cos))


def top1_agreement(outputs: np.ndarray, reference: np.ndarray) -> float:
    """Share of samples whose arg-max class equals the reference's."""
    outputs, reference = _flat(outputs, len(reference)), _flat(reference, len(reference))
    return float(np.mean(outputs.argmax(axis=1) == reference.argmax(axis=1)))


def top1_accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Share of samples whose arg-max class is the label."""
    outputs = _flat(outputs, len(labels))
    return float(np.mean(outputs.argmax(axis=1) == np.asarray(labels).reshape(-1)))


# Outputs that differ between samples by no more than this share of their largest magnitude are constant:
# an FP32 forward's rounding stays far below it, any input-dependent output far above.
CONSTANT_RTOL = 1e-6


def constant_across_samples(outputs: np.ndarray) -> bool:
    """True when every sample's output is the same (all zero included). Drift against such a reference
    is 0 whatever a candidate computes before the part that makes it constant (a zero-initialised
    head maps any features to zero), so it tells nothing. One sample alone: only all-zero is known."""
    values = _flat(outputs, len(outputs))
    if values.size == 0 or not np.all(np.isfinite(values)):
        return False
    scale = float(np.max(np.abs(values)))
    if len(values) < 2:
        return scale == 0.0
    spread = float(np.max(values.max(axis=0) - values.min(axis=0)))
    return spread <= CONSTANT_RTOL * scale


@dataclass(frozen=True)
class Drift(Record):
    """How far a configuration's outputs are from the FP32 eager reference, on the evaluation set.

    `reused_from` names the trial that measured it when a trial of the same numerics reuses it.
    """

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("kl_divergence",)  # records stored before it read back as they were

    relative_l2: float
    cosine_similarity: float
    top1_agreement: float
    samples: int
    accuracy: float | None = None
    reference_accuracy: float | None = None
    accuracy_delta: float | None = None
    reused_from: int | None = None
    # Language models: perplexity on the evaluation text then FP32's generated text (each decode step is
    # fed FP32's token of the step before), its relative increase over FP32's, and the share of greedy
    # tokens identical to FP32's.
    perplexity: float | None = None
    reference_perplexity: float | None = None
    perplexity_increase: float | None = None
    greedy_agreement: float | None = None
    # mean KL(FP32 || candidate) of the next-token distributions over the same positions (nats)
    kl_divergence: float | None = None

    def reused_by_another(self, measured_by: int) -> Drift:
        """The same record, as reused by another trial (keeps the first measuring trial)."""
        return replace(self, reused_from=self.reused_from if self.reused_from is not None else measured_by)


def compute_drift(outputs: np.ndarray, reference: np.ndarray, labels: np.ndarray | None = None) -> Drift:
    """Every drift metric of `outputs` against the FP32 `reference` (and `labels`, when there are some)."""
    if np.shape(outputs) != np.shape(reference):
        raise ValueError(f"output shape {np.shape(outputs)} differs from the reference {np.shape(reference)}")
    finite = bool(np.all(np.isfinite(outputs)))
    accuracy = reference_accuracy = None
    if labels is not None:
        reference_accuracy = top1_accuracy(reference, labels)
        accuracy = top1_accuracy(outputs, labels) if finite else 0.0
    return Drift(
        relative_l2=relative_l2(outputs, reference) if finite else math.inf,
        cosine_similarity=cosine_similarity(outputs, reference) if finite else 0.0,
        top1_agreement=top1_agreement(outputs, reference) if finite else 0.0,
        samples=len(reference),
        accuracy=accuracy,
        reference_accuracy=reference_accuracy,
        accuracy_delta=None if accuracy is None or reference_accuracy is None else accuracy - reference_accuracy,
    )


def compute_generation_drift(
    logits: np.ndarray,
    reference_logits: np.ndarray,
    perplexity: float,
    reference_perplexity: float,
    greedy_agreement: float,
) -> Drift:
    """A language model's drift: its next-token logits (prefill positions and decode steps, fed FP32's
    text) against FP32's, one row per position (relative L2, cosine, top-1 agreement), perplexity and
    greedy-token agreement."""
    vocab = reference_logits.shape[-1]
    rows = reference_logits.reshape(-1, vocab)
    drift = compute_drift(logits.reshape(-1, vocab), rows)
    finite = math.isfinite(perplexity)
    kld = mean_kl_divergence(logits.reshape(-1, vocab), rows) if np.all(np.isfinite(logits)) else math.inf
    return replace(
        drift,
        perplexity=perplexity if finite else math.inf,
        reference_perplexity=reference_perplexity,
        perplexity_increase=(perplexity / reference_perplexity - 1)
        if finite and reference_perplexity > 0
        else math.inf,
        greedy_agreement=greedy_agreement,
        kl_divergence=kld,
    )


def mean_kl_divergence(logits: np.ndarray, reference_logits: np.ndarray, chunk: int = 256) -> float:
    """Mean over positions of KL(P_fp32 || P_candidate), the softmax of each row of logits, in nats: what
    llama.cpp's `llama-perplexity --kl-divergence` reports as "Mean KLD". Rows a chunk at a time in float64
    (a 32000-token vocabulary over 764 positions would be 200 MB at once)."""
    total, rows = 0.0, len(reference_logits)
    for start in range(0, rows, chunk):
        p_log = _log_softmax(np.asarray(reference_logits[start : start + chunk], dtype=np.float64))
        q_log = _log_softmax(np.asarray(logits[start : start + chunk], dtype=np.float64))
        total += float(np.sum(np.exp(p_log) * (p_log - q_log)))
    return max(total / rows, 0.0) if rows else 0.0


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class DriftCriterion(Record):
    """The largest drop from FP32 a config may have on one metric; `relative` divides by FP32's value."""

    metric: str = "relative_l2"
    max_drop: float = 0.05
    relative: bool = False

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"drift metric {self.metric!r} is not known; choose from {', '.join(METRICS)}")
        if not self.max_drop > 0:
            raise ValueError(f"the largest drift must be positive, got {self.max_drop}")
        if self.relative and self.metric not in RELATIVE_METRICS:
            raise ValueError(
                f"a % bound applies to {' and '.join(RELATIVE_METRICS)} only; {self.metric} is already a share"
            )

    @classmethod
    def parse(cls, metric: str, text: str) -> DriftCriterion:
        """'0.05' is an absolute drop; '1%' a drop relative to FP32's value (accuracy)."""
        text = str(text).strip()
        relative = text.endswith("%")
        try:
            value = float(text[:-1]) / 100 if relative else float(text)
        except ValueError:
            raise ValueError(
                f"cannot read the drift bound {text!r}: give a number (0.05) or a percentage (1%)"
            ) from None
        return cls(metric, value, relative)

    def drop(self, drift: Drift) -> float | None:
        """How much worse than FP32 the drift record is on this metric (None: cannot be told)."""
        if self.metric == "relative_l2":
            return drift.relative_l2
        if self.metric == "cosine":
            return 1.0 - drift.cosine_similarity
        if self.metric == "top1":
            return 1.0 - drift.top1_agreement
        if self.metric == "perplexity":
            return drift.perplexity_increase
        if self.metric == "kld":
            return drift.kl_divergence
        if drift.accuracy is None or drift.reference_accuracy is None:
            return None
        loss = drift.reference_accuracy - drift.accuracy
        if self.relative:
            return loss / drift.reference_accuracy if drift.reference_accuracy > 0 else (0.0 if loss <= 0 else math.inf)
        return loss

    def exceeded(self, drift: Drift | None) -> bool:
        """True when the drop is beyond the bound, not finite, or cannot be told (no record, or a
        record without this metric): a candidate whose drift is unknown is never kept."""
        if drift is None:
            return True
        value = self.drop(drift)
        return value is None or not math.isfinite(value) or value > self.max_drop

    def describe(self) -> str:
        bound = f"{self.max_drop:.2%} of FP32's" if self.relative else f"{self.max_drop:g}"
        return f"{self.metric} drop <= {bound}"

    def verdict(self, drift: Drift) -> str:
        """One line for a pruned trial: the metric's drop against the bound."""
        value = self.drop(drift)
        shown = "unknown" if value is None else f"{value:.3g}"
        return f"drift: {self.metric} drop {shown} > max {self.max_drop:g}{' (relative)' if self.relative else ''}"

"""What the FP32 reference process reports, what it found out about the reference itself when it needed
care, and the evaluation and calibration sets it drew."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.common.json_record import FORMAT, OpenRecord, Record
from autotune.model.dataset import SYNTHETIC

# The layout of what a worker process reports (its result JSON); one without a format is version 1.
RESULT_FORMAT = "autotune.result/1"


@dataclass(frozen=True)
class ReferenceNote(Record):
    """The FP32 outputs were the same for every input, so drift against them would be 0 whatever a
    candidate computes; what was done about it, and whether drift can now tell anything.

    `redrawn`: the all-zero head weights redrawn (seeded) in the random init every trial loads, so the
    outputs are a random projection of `varying_layer`'s output. `drift_measurable` false: nothing
    could be done, and a drift-bounded search is refused with `message`.
    """

    constant_outputs: bool
    varying_layer: str | None  # the last module whose output varies with the input (None: none does)
    message: str
    redrawn: list[str] = field(default_factory=list)
    drift_measurable: bool = True


@dataclass(frozen=True)
class CalibrationSet(OpenRecord):
    """What int8 artifacts are calibrated on: part of their cache key, kept by the study and best.json.
    Synthetic calibration is `data` and `samples` alone; a user's data adds its digest and where its
    split starts in the shuffled data (`after_eval`, None for a separate --calibration-data)."""

    data: str = SYNTHETIC
    samples: int = 0
    digest: str | None = None
    after_eval: int | None = None

    def _left_out(self, f: dataclasses.Field[Any], value: Any) -> bool:
        return (f.name in ("digest", "after_eval") and self.digest is None) or super()._left_out(f, value)


@dataclass(frozen=True)
class EvaluationSet(OpenRecord):
    """What drift was measured on, as the report and best.json show it (a language model's adds FP32's
    perplexity on it)."""

    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("reference_perplexity",)

    data: str
    samples: int | None = None
    labels: bool | None = None
    reference_accuracy: float | None = None
    synthetic: bool = False
    reference_perplexity: float | None = None


@dataclass(frozen=True)
class ReferenceResult(Record):
    """What the FP32 reference process reports (its result JSON, kept in the reference's meta.json)."""

    NESTED: ClassVar[dict[str, type[Record]]] = {"reference_note": ReferenceNote}
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = (
        "reference_perplexity",
        "reference_format",
        "attention_layers",
        "reduction_depth",
    )

    format: str = field(default=RESULT_FORMAT, kw_only=True, metadata=FORMAT)
    pid: int
    output_shape: list[int]
    seconds: float
    torch: str
    eval_samples: int
    calibration_samples: int
    labels: bool
    reference_accuracy: float | None = None
    reference_note: ReferenceNote | None = None  # the FP32 outputs were constant across inputs
    reference_perplexity: float | None = None  # a language model's, on the evaluation text
    reference_format: int | None = None  # a language model's reference layout (model.generation.REFERENCE_FORMAT)
    # the coverage round's int8 order depends on it (tuning/payoff.int8_first_backend); None: a language model
    attention_layers: int | None = None
    reduction_depth: float | None = None  # and on this (tuning/payoff.expected_payoff)

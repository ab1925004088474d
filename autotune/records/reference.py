"""What the FP32 reference process found out about the reference itself, when it needed care."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.common.json_record import Record


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

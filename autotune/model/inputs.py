"""What a model takes: one or more named tensors per sample, and batches of them.

A batch is always a tuple of tensors, one per input, all with the batch as their first dimension, so
every backend calls `model(*batch)`: an image model gets one float tensor, a text encoder token ids
and an attention mask. Specs are written `3x224x224` (one float input) or
`input_ids:int64:128:0-30522,attention_mask:int64:128:1-2` (name:dtype:shape[:low-high]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autotune.common.errors import UserError
from autotune.common.json_record import Record

DTYPES = ("float32", "int64", "int32")
DEFAULT_NAME = "input"


@dataclass(frozen=True)
class InputSpec(Record):
    TUPLES: ClassVar[tuple[str, ...]] = ("shape",)

    name: str
    shape: tuple[int, ...]  # one sample, without the batch dimension
    dtype: str = "float32"
    low: int = 0  # integer inputs: synthetic values are drawn from [low, high)
    high: int = 2

    def describe(self) -> str:
        dims = "x".join(map(str, self.shape))
        return dims if self.dtype == "float32" else f"{self.name}:{self.dtype}:{dims}:{self.low}-{self.high}"


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise UserError(f"cannot read input shape {text!r}: give one sample's shape, e.g. 3x224x224") from None
    if not shape or any(d <= 0 for d in shape):
        raise UserError(f"input shape {text!r} must have positive dimensions, e.g. 3x224x224")
    return shape


def parse_inputs(text: str) -> tuple[InputSpec, ...]:
    """`3x224x224`, or comma-separated `name:dtype:shape[:low-high]` for several or non-float inputs."""
    if ":" not in text:
        return (InputSpec(DEFAULT_NAME, parse_shape(text)),)
    specs = []
    for part in text.split(","):
        fields = part.strip().split(":")
        if len(fields) not in (3, 4) or not fields[0].isidentifier() or fields[1] not in DTYPES:
            raise UserError(
                f"cannot read input {part!r}: write name:dtype:shape[:low-high] with dtype {', '.join(DTYPES)}, "
                "e.g. input_ids:int64:128:0-30522"
            )
        low, high = 0, 2
        if len(fields) == 4:
            try:
                low, high = (int(v) for v in fields[3].split("-"))
            except ValueError:
                raise UserError(
                    f"cannot read the value range {fields[3]!r} of input {fields[0]!r}: write low-high, e.g. 0-30522"
                ) from None
            if high <= low:
                raise UserError(
                    f"input {fields[0]!r}: the range {fields[3]!r} is empty (values are drawn from [low, high))"
                )
        specs.append(InputSpec(fields[0], parse_shape(fields[2]), fields[1], low, high))
    if len({s.name for s in specs}) != len(specs):
        raise UserError(f"input names repeat in {text!r}")
    return tuple(specs)


def describe(specs: tuple[InputSpec, ...]) -> str:
    return ",".join(s.describe() for s in specs)


def synthetic(specs: tuple[InputSpec, ...], count: int, seed: int) -> tuple[Any, ...]:
    """Seeded random inputs: normal floats, uniform integers in each input's range."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    batch = []
    for spec in specs:
        size = (count, *spec.shape)
        if spec.dtype == "float32":
            batch.append(torch.randn(size, generator=generator))
        else:
            batch.append(
                torch.randint(spec.low, spec.high, size, generator=generator, dtype=getattr(torch, spec.dtype))
            )
    return tuple(batch)


def as_batch(value: Any) -> tuple[Any, ...]:
    """A tensor, a tuple/list of tensors, or a dict of them (in its order) as a batch tuple."""
    if isinstance(value, dict):
        return tuple(value.values())
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


def batch_len(batch: tuple[Any, ...]) -> int:
    return len(batch[0])


def take(batch: tuple[Any, ...], index: Any) -> tuple[Any, ...]:
    return tuple(t[index] for t in batch)


def fixed_batches(batch: tuple[Any, ...], batch_size: int) -> list[tuple[Any, ...]]:
    """Split into batches of exactly batch_size, padding the last by cycling through the samples, so
    shapes never change (fixed-shape backends) even when there are fewer samples than one batch."""
    import torch

    total, batches = batch_len(batch), []
    for start in range(0, total, batch_size):
        count = min(batch_size, total - start)
        index = torch.arange(start, start + count)
        if count < batch_size:
            index = torch.cat([index, torch.arange(batch_size - count) % total])
        batches.append(take(batch, index))
    return batches

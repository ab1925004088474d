"""Eager PyTorch: the baseline every speedup is measured against."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendOptions, BackendSpec, Runner, choice, import_failure


@dataclass(frozen=True)
class EagerOptions(BackendOptions):
    memory_format: str = choice("contiguous", "channels_last")


SPEC = BackendSpec(
    name="eager",
    description="PyTorch eager mode",
    precisions=("fp32", "bf16"),
    options=EagerOptions,
    requires=("torch",),
    complexity=0,
    prepare_cost=0,
    torch_threads=True,
)


def unavailable() -> str | None:
    """Why PyTorch does not import here, or None."""
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


def prepare(model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
    from autotune.backends.torch_common import convert_for, module_runner

    memory_format = EagerOptions.of(config).memory_format
    return module_runner(convert_for(model, memory_format), config.precision, memory_format)

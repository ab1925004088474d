"""Eager PyTorch: the baseline every speedup is measured against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendSpec, Runner

SPEC = BackendSpec(
    name="eager",
    description="PyTorch eager mode",
    precisions=("fp32", "bf16"),
    options={"memory_format": ("contiguous", "channels_last")},
    requires=("torch",),
    torch_threads=True,
)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


def prepare(model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
    from autotune.backends.torch_common import convert_for, module_runner

    return module_runner(convert_for(model, config.options), config.precision, config.options)

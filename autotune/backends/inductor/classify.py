"""torch.compile with the inductor backend; freezing folds weights into the graph for inference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendSpec, Runner

SPEC = BackendSpec(
    name="inductor",
    description="torch.compile (inductor)",
    precisions=("fp32", "bf16"),
    options={"memory_format": ("contiguous", "channels_last"), "freezing": (False, True)},
    requires=("torch",),
    torch_threads=True,
    inductor_cache=True,
)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


def prepare(model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
    import torch
    import torch._inductor.config as inductor_config

    from autotune.backends.torch_common import convert_for, module_runner

    inductor_config.freezing = bool(config.options.get("freezing", False))
    compiled = torch.compile(convert_for(model, config.options), backend="inductor", dynamic=False)
    return module_runner(compiled, config.precision, config.options, details={"freezing": inductor_config.freezing})

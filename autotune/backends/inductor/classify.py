"""torch.compile with the inductor backend; freezing folds weights into the graph for inference."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendOptions, BackendSpec, Runner, choice, import_failure


@dataclass(frozen=True)
class InductorOptions(BackendOptions):
    memory_format: str = choice("contiguous", "channels_last")
    freezing: bool = choice(False, True)


SPEC = BackendSpec(
    name="inductor",
    description="torch.compile (inductor)",
    precisions=("fp32", "bf16"),
    options=InductorOptions,
    requires=("torch",),
    complexity=1,
    prepare_cost=5,  # torch.compile's code generation: the slowest preparation
    torch_threads=True,
    inductor_cache=True,
)


def unavailable() -> str | None:
    """Why PyTorch does not import here, or None."""
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    """Every combination of its space runs: nothing is refused before launch."""
    return None


def prepare(model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
    import torch
    import torch._inductor.config as inductor_config

    from autotune.backends.torch_common import convert_for, module_runner

    options = InductorOptions.of(config)
    inductor_config.freezing = bool(options.freezing)
    compiled = torch.compile(convert_for(model, options.memory_format), backend="inductor", dynamic=False)
    return module_runner(
        compiled, config.precision, options.memory_format, details={"freezing": inductor_config.freezing}
    )

"""A classification backend from outside autotune, as a plugin package would ship it: registered through
the `autotune.backends` entry-point group (tests/test_backend_plugin.py writes the distribution's
metadata), never named inside autotune. It runs the model eagerly under torch.inference_mode or
torch.no_grad, its one option; torch is imported inside functions only, like autotune's own backends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.base import BackendConfig, BackendOptions, BackendSpec, Runner, choice, import_failure


@dataclass(frozen=True)
class ToyOptions(BackendOptions):
    grad_mode: str = choice("inference_mode", "no_grad")


SPEC = BackendSpec(
    name="toy",
    description="eager PyTorch under inference_mode or no_grad, from a plugin",
    precisions=("fp32",),
    options=ToyOptions,
    requires=("torch",),
    torch_threads=True,
)


def unavailable() -> str | None:
    return import_failure(SPEC)


def unsupported(config: BackendConfig) -> str | None:
    return None


def prepare(model: Any, example: Any, config: BackendConfig, workdir: Path) -> Runner:
    import torch

    grad_mode = ToyOptions.of(config).grad_mode
    context = torch.inference_mode if grad_mode == "inference_mode" else torch.no_grad
    module = model.eval()

    def run(batch: tuple[Any, ...]) -> Any:
        with context():
            return module(*batch)

    return Runner(run=run, details={"grad_mode": grad_mode})

"""`autotune.load("best.json")`: the tuned inference callable, inside a process started as tuned.

    # started by the exported launch script: ./launch.sh python serve.py
    import autotune
    infer = autotune.load()                  # best.json from AUTOTUNE_BEST, the model from its source
    outputs = infer(batch)                   # a tensor (or tuple of tensors) of the tuned batch size

The environment (allocator, OpenMP, threads) only takes effect when the process starts, so `load`
checks it instead of setting it, and says what differs and how to start the process right.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.common.files import read_json
from autotune.records.config import TrialConfig


class TunedEnvironmentMismatch(RuntimeError):
    """The process was not started with the environment the winner was tuned with."""


def environment_differences(best: dict[str, Any]) -> list[str]:
    """What this process's environment lacks of the tuned one (libraries preloaded, variables, threads)."""
    import torch

    from autotune.worker.checks import mapped_libraries

    differences = []
    mapped = {os.path.realpath(p) for p in mapped_libraries()}
    for name, value in (best.get("environment") or {}).items():
        if name == "LD_PRELOAD":
            missing = [lib for lib in value.split(":") if lib and os.path.realpath(lib) not in mapped]
            differences += [f"{lib} is not preloaded" for lib in missing]
        elif name != "TORCHINDUCTOR_CACHE_DIR" and os.environ.get(name) != value:
            differences.append(f"{name}={os.environ.get(name)!r}, tuned with {value!r}")
    threads = best["config"]["threads_per_instance"]
    if torch.get_num_threads() != threads:
        differences.append(f"torch runs {torch.get_num_threads()} threads, tuned with {threads}")
    return differences


def load(
    best_path: str | os.PathLike[str] | None = None, model: Any = None, check_environment: bool = True
) -> Callable[..., Any]:
    """The winner of best.json as a callable: `infer(batch)` -> the model's outputs.

    `model`: your nn.Module (default: rebuilt from the model source best.json records; artifact
    backends load their exported, converted or quantized file instead). Raises
    TunedEnvironmentMismatch when the process was not started as tuned (see the launch script).
    """
    from autotune.backends import BACKENDS, backend_module
    from autotune.model.inputs import as_batch, synthetic
    from autotune.model.sources import ModelSource, build_model

    path = Path(best_path or os.environ.get("AUTOTUNE_BEST") or "best.json")
    best = read_json(path)
    if not best.get("meets_drift", True) or not best.get("job"):
        raise ValueError(f"{path} holds no timed winner (no configuration met the drift bound)")
    if check_environment:
        differences = environment_differences(best)
        if differences:
            raise TunedEnvironmentMismatch(
                f"this process was not started as tuned ({'; '.join(differences)}): start it with the script from "
                f"'autotune export --format sh', e.g. ./launch.sh python your_program.py"
            )
    config = TrialConfig.from_dict(best["config"])
    source = ModelSource.from_dict(best["job"]["model"])
    example = synthetic(source.specs, config.batch_size, 0)
    module = backend_module(config.backend)
    if BACKENDS[config.backend].builds_artifact(config.precision):
        runner = module.load(example, config, Path(best["job"]["artifact_dir"]))
    else:
        runner = module.prepare(
            model if model is not None else build_model(source), example, config, Path(best["job"]["workdir"])
        )

    def infer(*inputs: Any) -> Any:
        batch = as_batch(inputs[0] if len(inputs) == 1 else inputs)
        return runner(runner.convert_input(batch))

    infer.config = config  # type: ignore[attr-defined]
    return infer

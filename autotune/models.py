"""Where a model comes from (resolved once, in the search) and how a worker builds it.

Resolution happens in the orchestrator so bad names fail early with a clear message; building happens
in the worker, in whichever runtime the trial runs. Weights never run pickled code (weights_only).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from autotune.errors import UserError
from autotune.files import file_digest

RANDOM_INIT = "random-init"
WEIGHTS_FILE = "weights-file"
HUB_CACHE = "torch-hub-cache"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "torchvision" or "factory" (module:function or file.py:function)
    name: str
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    weights_path: str | None = None
    weights_origin: str = RANDOM_INIT
    seed: int = 0
    weights_sha256: str | None = None  # what the weights are, whatever their path


    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["input_shape"] = list(self.input_shape)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelSource":
        return cls(**{**data, "input_shape": tuple(data["input_shape"])})

    def with_weights(self, path: str) -> "ModelSource":
        return replace(self, weights_path=path, weights_sha256=file_digest(path))


def parse_input_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise UserError(f"cannot read input shape {text!r}: give one sample's shape, e.g. 3x224x224") from None
    if not shape or any(d <= 0 for d in shape):
        raise UserError(f"input shape {text!r} must have positive dimensions, e.g. 3x224x224")
    return shape


def torchvision_classification_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def _hub_cache_weights(name: str) -> tuple[Path | None, tuple[int, ...] | None]:
    """The default pretrained weights of a torchvision model, if already in the torch hub cache."""
    import torch
    import torchvision

    try:
        default = torchvision.models.get_model_weights(name).DEFAULT
    except (ValueError, AttributeError):
        return None, None
    crop = getattr(default.transforms(), "crop_size", None)
    shape = (3, int(crop[0]), int(crop[0])) if crop else None
    path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(default.url)
    return (path if path.is_file() else None), shape


def resolve_model(name: str, weights: str | None, input_shape: str | None) -> ModelSource:
    """Validate what the user named and decide where the weights come from."""
    shape = parse_input_shape(input_shape) if input_shape else None
    if weights is not None:
        weights_file = Path(weights).expanduser()
        if not weights_file.is_file():
            raise UserError(f"weights file {weights!r} does not exist; pass a state_dict saved with torch.save")
        weights = str(weights_file.resolve())
    if ":" in name:
        return _resolve_factory(name, weights, shape)
    known = torchvision_classification_models()
    if name not in known:
        near = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(near)}?" if near else " Run 'autotune models' to list them."
        raise UserError(f"unknown model {name!r}: not a torchvision classification model.{hint}")
    cached, default_shape = _hub_cache_weights(name)
    shape = shape or default_shape or (3, 224, 224)
    if weights:
        return ModelSource("torchvision", name, shape, weights, WEIGHTS_FILE, weights_sha256=file_digest(weights))
    if cached:
        return ModelSource("torchvision", name, shape, str(cached), HUB_CACHE, weights_sha256=file_digest(cached))
    return ModelSource("torchvision", name, shape, None, RANDOM_INIT)


def _resolve_factory(spec: str, weights: str | None, shape: tuple[int, ...] | None) -> ModelSource:
    target, _, func = spec.rpartition(":")
    if not target or not func.isidentifier():
        raise UserError(f"model {spec!r}: after ':' give the name of a function that returns an nn.Module")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise UserError(f"model file {target!r} does not exist")
        target = str(path.resolve())
    elif importlib.util.find_spec(target.split(".")[0]) is None:
        raise UserError(f"model {spec!r}: module {target!r} cannot be imported")
    if shape is None:
        raise UserError(f"model {spec!r}: give --input-shape (one sample, e.g. 3x224x224) for a factory model")
    return ModelSource("factory", f"{target}:{func}", shape, weights, WEIGHTS_FILE if weights else RANDOM_INIT,
                       weights_sha256=file_digest(weights) if weights else None)


def _import_factory(spec: str) -> Any:
    target, _, func = spec.rpartition(":")
    if target.endswith(".py"):
        module_name = f"autotune_user_model_{abs(hash(target))}"
        loader_spec = importlib.util.spec_from_file_location(module_name, target)
        assert loader_spec and loader_spec.loader
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, func)


def build_model(source: ModelSource) -> Any:
    """Build the nn.Module in eval mode, seeded so a random init is the same in every process."""
    import torch

    torch.manual_seed(source.seed)
    if source.kind == "torchvision":
        import torchvision

        model = torchvision.models.get_model(source.name, weights=None)
    else:
        model = _import_factory(source.name)()
    if source.weights_path:
        state = torch.load(source.weights_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.eval()


def primary_output(output: Any) -> Any:
    """The tensor to compare for drift when a model returns a tuple, list or dict."""
    if isinstance(output, (tuple, list)):
        return primary_output(output[0])
    if isinstance(output, dict):
        return primary_output(output.get("logits", next(iter(output.values()))))
    if hasattr(output, "logits"):
        return output.logits
    return output

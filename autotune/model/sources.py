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
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from autotune.common.errors import UserError
from autotune.common.files import file_digest
from autotune.common.json_record import Record
from autotune.model import hf_folder
from autotune.model.inputs import DEFAULT_NAME, DTYPES, InputSpec, as_batch, parse_inputs

RANDOM_INIT = "random-init"
MODEL_FILE = "model-file"  # the weights are inside the TorchScript or exported-program file
TORCHSCRIPT, EXPORTED = "torchscript", "exported-program"
MODEL_FILE_SUFFIXES = (".pt", ".ts", ".pt2")
WEIGHTS_FILE = "weights-file"
HUB_CACHE = "torch-hub-cache"
HF_FOLDER = "hf-folder"  # a Hugging Face model folder: kind and weights origin both
SAFETENSORS_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class ModelSource(Record):
    NESTED: ClassVar[dict[str, type[Record]]] = {"inputs": InputSpec}
    TUPLES: ClassVar[tuple[str, ...]] = ("input_shape",)
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("task", "trust_remote_code")  # a folder's only: other records as before

    # "torchvision", "factory" (module:function or file.py:function), "torchscript", "exported-program" or
    # "hf-folder" (a Hugging Face model folder: model/hf_folder.py)
    kind: str
    name: str
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    weights_path: str | None = None
    weights_origin: str = RANDOM_INIT
    seed: int = 0
    weights_sha256: str | None = None  # what the weights are, whatever their path
    inputs: list[InputSpec] | None = None  # several or non-float inputs; None: one float tensor of input_shape
    task: str | None = None  # a Hugging Face folder's, from its config (generate, classify); None: the study's
    trust_remote_code: bool | None = None  # True: a Hugging Face folder may run the Python code it ships

    @property
    def specs(self) -> tuple[InputSpec, ...]:
        """The model's inputs: the ones given, or one float tensor of input_shape."""
        if self.inputs:
            return tuple(self.inputs)
        return (InputSpec(DEFAULT_NAME, tuple(self.input_shape)),)

    @property
    def has_own_weights(self) -> bool:
        """Weights come from a file (or the model file itself), not from a seeded random init."""
        return bool(self.weights_path) or self.weights_origin in (MODEL_FILE, HF_FOLDER)

    def with_weights(self, path: str) -> ModelSource:
        return replace(self, weights_path=path, weights_sha256=file_digest(path))


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


def resolve_model(
    name: str,
    weights: str | None,
    input_shape: str | None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> ModelSource:
    """Validate what the user named and decide where the weights come from. `allow_pickle`: the user
    trusts a model file whose loader may unpickle Python objects (exported programs);
    `trust_remote_code`: a Hugging Face folder may run the code it ships."""
    specs = parse_inputs(input_shape) if input_shape else None
    if hf_folder.is_folder(name):
        source = _resolve_hf_folder(name, weights, specs[0].shape if specs else None, trust_remote_code)
        if specs and (len(specs) > 1 or specs[0].dtype != "float32"):
            return replace(source, inputs=list(specs))
        return source
    if Path(name).suffix == ".pt2" and ":" not in name and not allow_pickle and Path(name).expanduser().is_file():
        raise UserError(
            f"model file {name!r} is an exported program, whose loader (torch.export.load) may unpickle Python "
            "objects, which can run code: pass --allow-pickle if you trust the file"
        )
    source = _resolve_source(name, weights, specs[0].shape if specs else None)
    if specs and (len(specs) > 1 or specs[0].dtype != "float32"):
        return replace(source, inputs=list(specs))
    return source


def check_torch_save_file(path: Path, what: str) -> None:
    """Readable, and a torch.save archive (zip) or legacy pickle stream: caught here, in one line,
    instead of deep inside the reference process."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise UserError(f"{what} {str(path)!r} cannot be read ({exc.strerror}); check its permissions") from None
    if not (zipfile.is_zipfile(path) or head[:1] == b"\x80"):
        raise UserError(
            f"{what} {str(path)!r} is not a file saved with torch.save; pass a state_dict saved with "
            "torch.save(model.state_dict(), path)"
        )


def check_safetensors_file(path: Path, what: str) -> None:
    """A safetensors file whose header reads: caught here, in one line."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as exc:
        raise UserError(
            f"{what} {str(path)!r} is not a safetensors file ({type(exc).__name__}); pass one written by "
            "safetensors.torch.save_file or save_pretrained, or a state_dict saved with torch.save"
        ) from None


def _checked_weights(weights: str | None) -> str | None:
    """The --weights file, resolved and checked: a torch.save state_dict or a .safetensors file."""
    if weights is None:
        return None
    weights_file = Path(weights).expanduser()
    if not weights_file.is_file():
        raise UserError(
            f"weights file {weights!r} does not exist; pass a state_dict saved with torch.save or a .safetensors file"
        )
    if weights_file.suffix == SAFETENSORS_SUFFIX:
        check_safetensors_file(weights_file, "weights file")
    else:
        check_torch_save_file(weights_file, "weights file")
    return str(weights_file.resolve())


def _resolve_hf_folder(
    name: str, weights: str | None, shape: tuple[int, ...] | None, trust_remote_code: bool
) -> ModelSource:
    """A Hugging Face model folder: its task and weights from the folder (--weights may replace them)."""
    folder = hf_folder.read_folder(name, trust_remote_code)
    weights = _checked_weights(weights)
    shape = shape or (folder.image_shape() if folder.task == "classify" else None)
    if shape is None:
        raise UserError(f"model folder {name!r}: give --input-shape (one sample, e.g. 3x224x224)")
    return ModelSource(
        HF_FOLDER,
        str(folder.path),
        shape,
        weights,
        WEIGHTS_FILE if weights else HF_FOLDER,
        weights_sha256=file_digest(weights) if weights else folder.digest(),
        task=folder.task,
        trust_remote_code=True if trust_remote_code else None,
    )


def _resolve_source(name: str, weights: str | None, shape: tuple[int, ...] | None) -> ModelSource:
    weights = _checked_weights(weights)
    if name.endswith(MODEL_FILE_SUFFIXES) and ":" not in name:
        return _resolve_model_file(name, weights, shape)
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


def _exported_input_shape(path: Path) -> tuple[int, ...] | None:
    """One sample's shape from an exported program with a single input (several: give --inputs);
    refuses a fixed batch dimension."""
    import torch

    program = torch.export.load(str(path))
    names = list(program.graph_signature.user_inputs)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    shapes = [tuple(nodes[name].meta["val"].shape) for name in names if name in nodes]
    for shape in shapes:
        if shape and isinstance(shape[0], int):
            raise UserError(
                f"model file {str(path)!r} was exported with a fixed batch of {shape[0]}; export it with a dynamic "
                "batch "
                "dimension (dynamic_shapes={'x': {0: torch.export.Dim('batch')}}) so autotune can try batch sizes"
            )
    if len(shapes) != 1:
        return None
    return tuple(int(d) for d in shapes[0][1:]) if all(isinstance(d, int) for d in shapes[0][1:]) else None


def _resolve_model_file(name: str, weights: str | None, shape: tuple[int, ...] | None) -> ModelSource:
    """A TorchScript archive (.pt, .ts: torch.jit.save) or an exported program (.pt2: torch.export.save).

    TorchScript holds code run by torch's own interpreter; an exported program may carry pickled
    constants, so it is loaded only with --allow-pickle. The file is the weights, so its digest
    identifies the model."""
    path = Path(name).expanduser()
    if not path.is_file():
        raise UserError(f"model file {name!r} does not exist")
    if weights:
        raise UserError(
            f"model file {name!r} already holds its weights; --weights is for torchvision and factory models"
        )
    kind = EXPORTED if path.suffix == ".pt2" else TORCHSCRIPT
    try:
        found = _exported_input_shape(path) if kind == EXPORTED else None
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"cannot load {name!r} as {'an exported program' if kind == EXPORTED else 'TorchScript'} "
            f"({type(exc).__name__}); save it with {'torch.export.save' if kind == EXPORTED else 'torch.jit.save'}"
        ) from None
    shape = shape or found
    if shape is None:
        raise UserError(f"model {name!r}: give --input-shape (one sample, e.g. 3x224x224)")
    resolved = str(path.resolve())
    return ModelSource(kind, resolved, shape, None, MODEL_FILE, weights_sha256=file_digest(resolved))


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
    inputs = None
    if shape is None:
        found = _factory_example_specs(f"{target}:{func}")
        if found is None:
            raise UserError(
                f"model {spec!r}: give --input-shape (one sample, e.g. 3x224x224) for a factory model, "
                "or return (model, example_inputs) from the factory"
            )
        shape = found[0].shape
        if len(found) > 1 or found[0].dtype != "float32":
            inputs = list(found)
    return ModelSource(
        "factory",
        f"{target}:{func}",
        shape,
        weights,
        WEIGHTS_FILE if weights else RANDOM_INIT,
        weights_sha256=file_digest(weights) if weights else None,
        inputs=inputs,
    )


def _factory_example_specs(spec: str) -> tuple[InputSpec, ...] | None:
    """Input specs from the example inputs a factory may return beside its model: (model, example),
    the example a batched tensor, a tuple of them or a dict of them; None when it returns a model only."""
    import torch

    try:
        made = _import_factory(spec)()
    except Exception as exc:
        raise UserError(f"model {spec!r}: the factory failed ({type(exc).__name__}: {exc})") from None
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        return None
    example = made[1]
    named = example.items() if isinstance(example, dict) else enumerate(as_batch(example))
    specs = []
    for key, tensor in named:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1:
            raise UserError(f"model {spec!r}: example inputs must be batched tensors (batch first)")
        name = (
            key
            if isinstance(key, str)
            else (DEFAULT_NAME if not isinstance(example, (tuple, list)) else f"{DEFAULT_NAME}_{key}")
        )
        if tensor.is_floating_point():
            specs.append(InputSpec(name, tuple(tensor.shape[1:])))
        else:  # integer inputs: synthetic values span what the example holds
            if str(tensor.dtype).removeprefix("torch.") not in DTYPES:
                raise UserError(
                    f"model {spec!r}: example input {name!r} is {tensor.dtype}; inputs may be {', '.join(DTYPES)}"
                )
            specs.append(
                InputSpec(
                    name,
                    tuple(tensor.shape[1:]),
                    str(tensor.dtype).removeprefix("torch."),
                    int(tensor.min()),
                    int(tensor.max()) + 1,
                )
            )
    return tuple(specs)


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


def _exported_module(graph_module: Any) -> Any:
    """An exported program's module as backends expect one: .eval() and .train() are accepted and do
    nothing (the graph keeps the behaviour it was exported with; its own module refuses them)."""
    import torch

    class ExportedModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph_module = graph_module

        def train(self, mode: bool = True) -> ExportedModule:
            self.training = mode
            return self

        def forward(self, *args: Any) -> Any:
            return self.graph_module(*args)

    return ExportedModule()


def build_model(source: ModelSource) -> Any:
    """Build the nn.Module in eval mode, seeded so a random init is the same in every process."""
    import torch

    torch.manual_seed(source.seed)
    if source.kind == "torchvision":
        import torchvision

        model = torchvision.models.get_model(source.name, weights=None)
    elif source.kind == TORCHSCRIPT:
        return torch.jit.load(source.name, map_location="cpu").eval()
    elif source.kind == EXPORTED:
        return _exported_module(torch.export.load(source.name).module())
    elif source.kind == HF_FOLDER:  # --weights replace the folder's own
        state = load_state_dict(source.weights_path) if source.weights_path else None
        return hf_folder.build(source.name, source.task or "generate", bool(source.trust_remote_code), state)
    else:
        model = _import_factory(source.name)()
        if isinstance(model, (tuple, list)):  # (model, example_inputs)
            model = model[0]
    if source.weights_path:
        model.load_state_dict(load_state_dict(source.weights_path))
    return model.eval()


def load_state_dict(path: str) -> dict[str, Any]:
    """A state_dict from a .safetensors file or a torch.save file (weights only: no pickled code runs)."""
    import torch

    if path.endswith(SAFETENSORS_SUFFIX):
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    return torch.load(path, map_location="cpu", weights_only=True)


def primary_output(output: Any) -> Any:
    """The tensor to compare for drift when a model returns a tuple, list or dict."""
    if isinstance(output, (tuple, list)):
        return primary_output(output[0])
    if isinstance(output, dict):
        return primary_output(output.get("logits", next(iter(output.values()))))
    if hasattr(output, "logits"):
        return output.logits
    return output

"""A Hugging Face model folder, as language-model users hold one: `config.json`, the weights
(`model.safetensors`, sharded or not, or `pytorch_model.bin` read weights-only) and often a tokenizer.

Read in the orchestrator, so a bad folder fails at once in one line: the task comes from the config's
`architectures` (a causal language model generates, an image classifier classifies), the weights are
found and digested (what the model is, whatever the folder is called). Built in the worker by
transformers' Auto classes, in whichever runtime the trial runs; code shipped in the folder runs only
with `--trust-remote-code`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.common.errors import UserError
from autotune.common.files import file_digest

CONFIG = "config.json"
# transformers' own names, in the order from_pretrained looks for them
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED, PICKLED_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PICKLED, PICKLED_INDEX)
# an architecture's class name ends with what it does: the task autotune times it on (else transformers' Auto
# tables say: GPT-2's GPT2LMHeadModel is a causal language model)
TASK_OF_SUFFIX = {"ForCausalLM": "generate", "ForImageClassification": "classify"}
SUPPORTED = (
    "a causal language model (…ForCausalLM: generate) or an image classifier (…ForImageClassification: classify)"
)


@dataclass(frozen=True)
class HfFolder:
    """What a folder holds: its architecture, the task it is timed on, and its weight files."""

    path: Path
    architecture: str
    task: str
    weight_files: tuple[Path, ...]
    config: dict[str, Any]

    @property
    def remote_code(self) -> bool:
        """The config names Python code shipped in the folder (transformers' `auto_map`)."""
        return bool(self.config.get("auto_map"))

    def digest(self) -> str:
        """sha256 over the config's, every weight file's and the tokenizer's digests: what the model is."""
        combined = hashlib.sha256()
        for path in (self.path / CONFIG, *self.weight_files, *self.tokenizer_files):
            combined.update(f"{path.name}:{file_digest(path)}\n".encode())
        return combined.hexdigest()

    @property
    def tokenizer_files(self) -> tuple[Path, ...]:
        """The tokenizer's files in the folder (part of what the model is: they decide its prompts' ids)."""
        return tuple(self.path / name for name in TOKENIZER_FILES if (self.path / name).is_file())

    def image_shape(self) -> tuple[int, ...] | None:
        """One image's shape (channels, height, width) from the config of an image classifier, or None."""
        size = self.config.get("image_size")
        if isinstance(size, int):
            size = [size, size]
        if not (isinstance(size, list) and len(size) == 2):
            return None
        return (int(self.config.get("num_channels", 3)), int(size[0]), int(size[1]))


# the files a tokenizer is loaded from (AutoTokenizer reads tokenizer_config.json, then one of the others)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json")


def has_tokenizer(path: str | Path) -> bool:
    """Does the folder hold a tokenizer (the files AutoTokenizer reads)?"""
    folder = Path(path)
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def load_tokenizer(path: str | Path) -> Any:
    """The folder's tokenizer, as transformers loads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def check_tokenizer(folder: HfFolder, name: str) -> None:
    """The folder's tokenizer loads, and its ids fit the model's vocabulary: caught here, in one line."""
    try:
        tokenizer = load_tokenizer(folder.path)
    except Exception as exc:
        raise UserError(
            f"model folder {name!r}: its tokenizer cannot be loaded ({type(exc).__name__}: {str(exc)[:200]}); "
            "fix or remove its tokenizer files"
        ) from None
    vocab = folder.config.get("vocab_size")
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise UserError(
            f"model folder {name!r}: its tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary "
            f"of {vocab}; the folder's tokenizer does not belong to its model"
        )


def is_folder(name: str) -> bool:
    """Does `--model` name a folder (rather than a torchvision name, a factory or a model file)?"""
    return ":" not in name and Path(name).expanduser().is_dir()


def read_folder(name: str, trust_remote_code: bool = False) -> HfFolder:
    """The folder's architecture, task and weights, or UserError saying what is wrong and what to do."""
    path = Path(name).expanduser().resolve()
    config_path = path / CONFIG
    if not config_path.is_file():
        raise UserError(
            f"model folder {name!r} has no {CONFIG}: pass a Hugging Face model folder (save_pretrained writes one)"
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"model folder {name!r}: {CONFIG} cannot be read as JSON ({exc})") from None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not architectures or not isinstance(architectures, list):
        raise UserError(f"model folder {name!r}: {CONFIG} names no architectures; autotune tunes {SUPPORTED}")
    architecture = str(architectures[0])
    task = next((task for suffix, task in TASK_OF_SUFFIX.items() if architecture.endswith(suffix)), None)
    task = task or _task_in_auto_tables(architecture)
    if task is None:
        raise UserError(f"model folder {name!r} holds a {architecture}; autotune tunes {SUPPORTED}")
    folder = HfFolder(path, architecture, task, _weight_files(path, name), config)
    if folder.remote_code and not trust_remote_code:
        raise UserError(
            f"model folder {name!r} runs Python code it ships ({CONFIG}'s auto_map): pass --trust-remote-code "
            "if you trust it"
        )
    if not folder.remote_code:
        _check_known(architecture, task, name)
    return folder


def _weight_files(path: Path, name: str) -> tuple[Path, ...]:
    """The weight files from_pretrained would read: one file, or an index and the shards it names."""
    for file_name in WEIGHT_FILES:
        found = path / file_name
        if not found.is_file():
            continue
        if not file_name.endswith(".index.json"):
            return (found,)
        try:
            shards = sorted(set(json.loads(found.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"model folder {name!r}: {file_name} is not a weights index ({exc})") from None
        missing = [shard for shard in shards if not (path / shard).is_file()]
        if missing:
            raise UserError(f"model folder {name!r}: {file_name} names shards that are missing: {', '.join(missing)}")
        return (found, *(path / shard for shard in shards))
    raise UserError(f"model folder {name!r} has no weights ({', '.join(WEIGHT_FILES)}): save them with save_pretrained")


def _auto_table(task: str) -> set[str]:
    """The architectures transformers' Auto class for the task builds, from its name tables."""
    from transformers.models.auto import modeling_auto

    table = (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if task == "generate"
        else modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES
    )
    return {cls for value in table.values() for cls in ((value,) if isinstance(value, str) else value)}


def _task_in_auto_tables(architecture: str) -> str | None:
    """The task of an architecture named otherwise (GPT-2's GPT2LMHeadModel is a causal language model)."""
    return next((task for task in ("generate", "classify") if architecture in _auto_table(task)), None)


def _check_known(architecture: str, task: str, name: str) -> None:
    """The architecture is one transformers' Auto class for the task knows (a folder written by a newer
    transformers may hold one it does not); read from its name tables, without importing any model's code."""
    import transformers

    if architecture not in _auto_table(task):
        raise UserError(
            f"model folder {name!r} holds a {architecture}, which transformers {transformers.__version__} does not "
            "have: upgrade transformers, or pass --trust-remote-code for a folder that ships its code"
        )


def build(path: str, task: str, trust_remote_code: bool = False, state: dict[str, Any] | None = None) -> Any:
    """The folder's model in float32, as transformers loads it (weights-only for a pickled file), `state`
    (the --weights file's) loaded over its own; an image classifier returns its logits alone, as the
    backends' exporters and compilers expect a tensor."""
    import torch
    import transformers

    auto = transformers.AutoModelForCausalLM if task == "generate" else transformers.AutoModelForImageClassification
    major = int(transformers.__version__.split(".")[0])
    # transformers 5 names it dtype; the IPEX runtime's 4.x, torch_dtype
    settings: dict[str, Any] = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    if major < 5:
        settings.update(rope_for_v4(json.loads((Path(path) / CONFIG).read_text())))
    model = auto.from_pretrained(path, trust_remote_code=trust_remote_code, **settings)
    if state is not None:
        model.load_state_dict(state)
    return model.eval() if task == "generate" else logits_only(model)


def rope_for_v4(config: dict[str, Any]) -> dict[str, Any]:
    """A config written by transformers 5 keeps its rotary settings in `rope_parameters`, which the IPEX
    runtime's transformers 4.x does not read: it would run its default base (10000) where the folder says
    another (a Llama 3's 500000). Given back as 4.x's `rope_theta` and `rope_scaling`."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" in config:
        return {}
    settings: dict[str, Any] = {}
    if "rope_theta" in rope:
        settings["rope_theta"] = rope["rope_theta"]
    scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
    if scaling.get("rope_type", "default") != "default":
        settings["rope_scaling"] = scaling
    return settings


def logits_only(model: Any) -> Any:
    """An image classifier whose forward takes the images and returns the logits tensor (transformers'
    own returns an output record); torch is imported only when a folder is built."""
    import torch

    class ClassifierLogits(torch.nn.Module):
        def __init__(self, wrapped: Any) -> None:
            super().__init__()
            self.model = wrapped

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values=pixel_values).logits

    return ClassifierLogits(model).eval()

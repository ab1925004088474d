"""A causal language model as a GGUF file, written by llama.cpp's own converter (convert_hf_to_gguf.py and
its gguf-py, shipped in llama-cpp-python's source and installed beside the runtime by `make setup`) and
quantized by llama.cpp's own quantizer (`llama_model_quantize`, what the llama-quantize tool calls).

The vocabulary: autotune feeds every engine token ids, never text, so the same ids mean the same rows
of the embedding in every engine. A model loaded from a Hugging Face folder with a tokenizer gets its
real vocabulary, read from the folder by the converter itself, so the GGUF generates text in llama.cpp's
own tools; a factory's model, a folder without a tokenizer, or a tokenizer the converter cannot read
(a BPE whose pre-tokenizer it does not know) get llama.cpp's placeholder vocabulary (tokenizer model
"none": `vocab_size` dummy tokens), and the artifact's details say which.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends.generation.tokenizer_files import copy_tokenizer

# llama.cpp's converter writes these types itself; the others are quantized from its F32 output.
CONVERTER_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}
# llama_ftype values (llama.h) of the types the quantizer writes.
QUANTIZER_FTYPES = {"Q4_0": 2, "Q2_K": 10, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
QUANTIZER_MIX_FTYPES = {"Q8_0": 7}  # the converter writes a whole-model Q8_0; a mix needs the quantizer
EMBEDDINGS = ("token_embd", "position_embd", "token_types")
# ggml_type values (ggml.h) a mix keeps its sensitive matrices in
GGML_TYPES = {"F16": 1, "Q8_0": 8}
CONVERTER_ENV = "AUTOTUNE_LLAMA_CPP_CONVERTER"


def converter_dir() -> Path:
    """Where llama.cpp's converter lies: $AUTOTUNE_LLAMA_CPP_CONVERTER, else the runtime's share/llama.cpp."""
    return Path(os.environ.get(CONVERTER_ENV) or Path(sys.prefix) / "share" / "llama.cpp")


def converter_version() -> str:
    """The llama-cpp-python release whose source the converter and quantizer came from: a GGUF written by
    another release is another artifact."""
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return "unknown"


def converter_missing() -> str | None:
    """Why the converter cannot run here, or None."""
    folder = converter_dir()
    if not (folder / "convert_hf_to_gguf.py").is_file() or not (folder / "conversion").is_dir():
        return f"llama.cpp's converter is not in {folder} (make setup puts it there; or set {CONVERTER_ENV})"
    return None


def _import_converter() -> Any:
    folder = str(converter_dir())
    for path in (str(Path(folder) / "gguf-py"), folder):
        if path not in sys.path:
            sys.path.insert(0, path)
    import conversion

    return conversion


def save_for_converter(model: Any, out_dir: Path) -> None:
    """The model as a Hugging Face folder (config.json and safetensors), with what the converter reads
    that transformers no longer writes (GPT-2's `n_ctx`)."""
    model.save_pretrained(out_dir, safe_serialization=True)
    config_file = out_dir / "config.json"
    config = json.loads(config_file.read_text())
    if "n_positions" in config and "n_ctx" not in config:
        config["n_ctx"] = config["n_positions"]
    config_file.write_text(json.dumps(config, indent=2))


@dataclass(frozen=True)
class Mix:
    """A mixed file: the modules (Hugging Face names) kept in `kept_type`, every other matrix in the file's
    type; the output layer and the token embedding in `kept_type` too (the types llama.cpp itself keeps
    widest)."""

    kept: tuple[str, ...]
    kept_type: str


def convert(
    model: Any, gguf_type: str, out_file: Path, mix: Mix | None = None, imatrix: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write the model as a GGUF of `gguf_type` (F32, F16, BF16, Q8_0 by the converter; Q4_0, Q2_K, Q4_K_M,
    Q5_K_M, Q6_K by the quantizer from the converter's F32; a mix always by the quantizer, with a type
    override per kept tensor); returns the seconds each step took and the architecture. Raises RuntimeError
    saying why when llama.cpp cannot convert this model. `imatrix`: each Linear's mean squared input per column
    (Hugging Face module names), passed to the quantizer as its importance matrix."""
    import torch

    conversion = _import_converter()
    with tempfile.TemporaryDirectory(prefix="autotune-gguf-") as scratch:
        hf_dir = Path(scratch) / "hf"
        save_for_converter(model, hf_dir)
        source = copy_tokenizer(model, hf_dir)
        hparams = conversion.ModelBase.load_hparams(hf_dir, False)
        architecture = conversion.get_model_architecture(hparams, conversion.ModelType.TEXT)
        try:
            model_class = conversion.get_model_class(architecture, mmproj=False)
        except NotImplementedError:
            raise RuntimeError(f"llama.cpp's converter does not support {architecture}") from None
        by_converter = gguf_type in CONVERTER_TYPES and mix is None
        first = CONVERTER_TYPES[gguf_type] if by_converter else "f32"
        converted = out_file if by_converter else Path(scratch) / "f32.gguf"
        t0 = time.monotonic()
        import gguf  # the converter's own gguf-py

        file_types = {
            "f32": gguf.LlamaFileType.ALL_F32,
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }
        with torch.inference_mode():
            instance = model_class(hf_dir, file_types[first], converted, eager=True)
            vocab = int(hparams["vocab_size"])
            own_vocab = instance.set_vocab
            said: dict[str, str] = {"vocab": "placeholder: no tokenizer beside the model"}

            def placeholder_vocab(self: Any = instance) -> None:
                self.gguf_writer.add_tokenizer_model("none")
                self.gguf_writer.add_vocab_size(vocab)

            def folder_vocab() -> None:
                try:  # the converter's own reading; it fails before writing anything of the vocabulary
                    own_vocab()
                    said["vocab"] = f"the model's tokenizer, from {source}"
                except (NotImplementedError, FileNotFoundError, TypeError, KeyError, ValueError) as exc:
                    placeholder_vocab()
                    said["vocab"] = f"placeholder: llama.cpp's converter cannot read the tokenizer ({exc})"

            instance.set_vocab = folder_vocab if source is not None else placeholder_vocab
            instance.write()
        convert_s = time.monotonic() - t0
        quantize_s = None
        overrides: dict[str, str] = {}
        if mix is not None:
            names = gguf.get_tensor_name_map(instance.model_arch, instance.block_count)
            for module in mix.kept:
                tensor = names.get_name(f"{module}.weight", try_suffixes=(".weight",))
                if tensor is None:
                    raise RuntimeError(f"llama.cpp's converter has no tensor for {module}")
                overrides[tensor] = mix.kept_type
        importance: dict[str, Any] = {}
        if imatrix:
            names = gguf.get_tensor_name_map(instance.model_arch, instance.block_count)
            for module, values in imatrix.items():
                tensor = names.get_name(f"{module}.weight", try_suffixes=(".weight",))
                if tensor is not None:
                    importance[tensor] = values
        if not by_converter:
            edges = mix.kept_type if mix else None
            quantize_s = quantize(converted, out_file, gguf_type, overrides, edges, importance)
    return {"architecture": architecture, "convert_s": convert_s, "quantize_s": quantize_s, **said}


def quantize(
    source: Path,
    out_file: Path,
    gguf_type: str,
    overrides: dict[str, str] | None = None,
    edges: str | None = None,
    importance: dict[str, Any] | None = None,
) -> float:
    """llama.cpp's quantizer (what `llama-quantize SOURCE OUT TYPE [--tensor-type NAME=T ...]
    [--output-tensor-type T --token-embedding-type T]` runs); returns the seconds it took. `overrides`: a
    type per tensor (GGUF names), `edges`: the output layer's and token embedding's type, `importance`: the
    importance matrix per tensor (`--imatrix`: float32 values, one per input column)."""
    import ctypes
    import re

    import llama_cpp
    import numpy as np

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZER_FTYPES.get(gguf_type) or QUANTIZER_MIX_FTYPES[gguf_type]
    params.nthread = os.cpu_count() or 1
    if edges is not None:
        params.output_tensor_type = GGML_TYPES[edges]
        params.token_embedding_type = GGML_TYPES[edges]
    override = llama_cpp.llama_model_tensor_override
    table = (override * (len(overrides or {}) + 1))(
        *[override(f"^{re.escape(name)}$".encode(), GGML_TYPES[t]) for name, t in (overrides or {}).items()],
        override(None, llama_cpp.GGML_TYPE_COUNT),  # the end of the list
    )
    if overrides:
        params.tt_overrides = ctypes.cast(table, ctypes.POINTER(override))
    entry = llama_cpp.llama_model_imatrix_data
    columns = [np.ascontiguousarray(v, dtype=np.float32) for v in (importance or {}).values()]
    matrix = (entry * (len(columns) + 1))(
        *[
            entry(name.encode(), v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), v.size)
            for name, v in zip(importance or {}, columns, strict=True)
        ],
        entry(None, None, 0),  # the end of the list
    )
    if importance:
        params.imatrix = ctypes.cast(matrix, ctypes.POINTER(entry))
    t0 = time.monotonic()
    failed = llama_cpp.llama_model_quantize(str(source).encode(), str(out_file).encode(), params)
    if failed:
        raise RuntimeError(f"llama.cpp's quantizer failed to write {gguf_type} (code {failed})")
    return time.monotonic() - t0


def tensor_types(gguf_file: Path) -> dict[str, int]:
    """The file's matrices (the 2-D weight tensors the matrix products read; the embedding tables, which
    are looked up, left out) by their GGUF type: what a K-quant mix really holds (rows too short for a K
    block fall back to another type)."""
    _import_converter()
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_file))
    counts: Counter[str] = Counter()
    for tensor in reader.tensors:
        if len([d for d in tensor.shape if d > 1]) >= 2 and not tensor.name.startswith(EMBEDDINGS):
            counts[tensor.tensor_type.name] += 1
    return dict(counts)


def output_matrices(gguf_file: Path) -> int:
    """1 when the file holds its own output layer (`output.weight`), 0 when it reuses the token embedding (a
    model with tied embeddings): what a mix's check counts beside the kept matrices."""
    _import_converter()
    from gguf import GGUFReader

    return sum(1 for tensor in GGUFReader(str(gguf_file)).tensors if tensor.name == "output.weight")

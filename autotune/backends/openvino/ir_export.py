"""A causal language model to OpenVINO IR, exported by optimum-intel's own command (`optimum-cli export
openvino --task text-generation-with-past`, what OpenVINO's LLM guides tell a user to run): a stateful IR
(the KV cache kept inside the infer request) whose weights NNCF compresses on the way.

optimum-intel pins transformers below the main runtime's, so it lives in an overlay of its own packages
(`make setup` installs it under the venv's share/optimum-intel; AUTOTUNE_OPTIMUM_INTEL names another) and
runs in a subprocess with that overlay first on its path, reusing this runtime's torch, openvino and nncf.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotune.backends.generation.tokenizer_files import copy_tokenizer

OVERLAY_ENV = "AUTOTUNE_OPTIMUM_INTEL"
IR_FILE = "openvino_model.xml"
TOKENIZER_IR = "openvino_tokenizer.xml"  # openvino-tokenizers' conversion, which GenAI's pipeline reads for text
# autotune's precision: optimum-cli's weight format and flags (int4's group size and ratio are added)
WEIGHT_FORMATS: dict[str, tuple[str, ...]] = {
    "fp32": ("--weight-format", "fp32"),
    "fp16": ("--weight-format", "fp16"),
    "int8_asym": ("--weight-format", "int8"),
    "int4_sym": ("--weight-format", "int4", "--sym"),
    "int4_asym": ("--weight-format", "int4"),
}
INT4 = ("int4_sym", "int4_asym")
# the operations between a compressed weight's constant and its MatMul (NNCF's decompression subgraph)
DECOMPRESSION = {"Convert", "Subtract", "Multiply", "Reshape", "Transpose"}


def overlay_dir() -> Path:
    """Where optimum-intel and the transformers it pins are installed."""
    return Path(os.environ.get(OVERLAY_ENV) or Path(sys.prefix) / "share" / "optimum-intel")


def exporter_missing() -> str | None:
    """Why optimum-intel's exporter cannot run here, or None."""
    overlay = overlay_dir()
    if not (overlay / "optimum" / "intel").is_dir():
        return f"optimum-intel is not in {overlay}; make setup installs it"
    return None


def exporter_version() -> str:
    """A short digest of the overlay's pinned packages (its VERSION file, written by make setup): an IR
    exported by other optimum-intel, optimum or transformers versions is another artifact."""
    import hashlib

    try:
        pins = (overlay_dir() / "VERSION").read_bytes()
    except OSError:
        return "unpinned"
    return hashlib.sha256(pins).hexdigest()[:8]


def export(model: Any, precision: str, out_dir: Path, group_size: int = 128, ratio: float = 1.0) -> dict[str, Any]:
    """Export `model` (a transformers causal LM) into out_dir with its weights in `precision`; returns the
    command that ran. Raises RuntimeError with optimum-cli's own last words when it fails."""
    if not hasattr(model, "save_pretrained"):  # a custom module: optimum-intel reads a transformers model's files
        raise RuntimeError(f"optimum-intel exports transformers models only; {type(model).__name__} is not one")
    flags = list(WEIGHT_FORMATS[precision])
    if precision in INT4:
        flags += ["--group-size", str(group_size), "--ratio", str(ratio)]
    with tempfile.TemporaryDirectory(prefix="autotune-ir-") as scratch:
        source = Path(scratch) / "hf"
        model.save_pretrained(source)  # config.json and model.safetensors: what optimum-cli reads
        # a folder's tokenizer beside them: optimum-cli converts it (openvino-tokenizers) into the IR's folder
        tokenizer = copy_tokenizer(model, source)
        command = [
            sys.executable,
            "-m",
            "optimum.commands.optimum_cli",
            "export",
            "openvino",
            "-m",
            str(source),
            "--task",
            "text-generation-with-past",
            *flags,
            str(out_dir),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(overlay_dir()), os.environ.get("PYTHONPATH")])),
        }
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0 or not (out_dir / IR_FILE).is_file():
        said = (result.stderr or result.stdout).splitlines()
        last = [line for line in said if line.strip() and "Warning" not in line]
        why = f"exit code {result.returncode}" + (f": {last[-1]}" if last else "")
        if result.returncode == 0:
            why += f"; no {IR_FILE} written"
        raise RuntimeError(f"optimum-cli export openvino failed ({why})")
    shown = ["optimum-cli", "export", "openvino", "--task", "text-generation-with-past", *flags]
    if tokenizer is None:
        carried = "none: no tokenizer beside the model"
    elif (out_dir / TOKENIZER_IR).is_file():
        carried = f"the model's tokenizer, from {tokenizer}"
    else:
        carried = "none: optimum-cli did not convert the model's tokenizer"
    return {"exported_by": " ".join(shown), "tokenizer": carried}


def scope_patterns(modules: tuple[str, ...] | list[str]) -> list[str]:
    """NNCF ignored-scope patterns for Hugging Face module names: every node the exporter named inside the
    module (`__module.model.layers.3.mlp.down_proj/aten::linear/MatMul` and its weight's nodes)."""
    return [rf"__module\.{re.escape(name)}/.*" for name in modules]


# NNCF's data-aware algorithms for int4 (each reads the calibration text through the IR): AWQ rescales the
# channels activations make salient, scale estimation fits each group's scale to its outputs, GPTQ corrects
# the rounding of each column in the ones after it.
DATA_AWARE = {"awq": {"awq": True}, "scale_estimation": {"scale_estimation": True}, "gptq": {"gptq": True}}


def calibration_dataset(calibration: Any) -> Any:
    """The calibration ids (rows of token ids) as an nncf.Dataset of the stateful IR's inputs, one row a sample
    (NNCF resets the KV-cache state before each)."""
    import nncf
    import numpy as np

    rows = [np.asarray(row, dtype=np.int64)[None] for row in np.asarray(calibration)]

    def inputs(ids: Any) -> dict[str, Any]:
        return {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
            "beam_idx": np.zeros(1, dtype=np.int32),
        }

    return nncf.Dataset(rows, inputs)


def export_compressed(
    model: Any,
    precision: str,
    out_dir: Path,
    group_size: int = 128,
    ratio: float = 1.0,
    kept: tuple[str, ...] = (),
    edges: tuple[str, ...] = (),
    calibration: Any = None,
    data_aware: str = "none",
) -> dict[str, Any]:
    """The fp16 IR exported as for `fp16`, then NNCF's `compress_weights` on it in this process: what a mix
    (`kept`: matrices left one type wider) and the data-aware int4 algorithms need, which optimum-cli cannot
    do with the user's own text. int8_asym: every matrix but the kept ones, the output layer and the embedding
    (`edges`) in int8. int4: every matrix but the kept ones in int4 (the output layer and the embedding in
    NNCF's int8 backup, as in a whole-model int4 export), with `data_aware`'s algorithm on the calibration
    ids, then the kept ones in int8_asym."""
    import nncf
    import openvino as ov

    done = export(model, "fp16", out_dir)
    ir = out_dir / IR_FILE
    compressed = ov.Core().read_model(ir)
    if precision == "int8_asym":
        steps = []
        if len(kept) < len(compressible(compressed)) - 1:  # some matrix is left to compress (share 0: none)
            scope = nncf.IgnoredScope(patterns=scope_patterns([*kept, *edges]), validate=True)
            compressed = nncf.compress_weights(compressed, mode=nncf.CompressWeightsMode.INT8_ASYM, ignored_scope=scope)
            steps = [f"nncf.compress_weights(INT8_ASYM, ignored_scope={len(kept)} kept + output + embedding)"]
    else:
        mode = nncf.CompressWeightsMode.INT4_SYM if precision == "int4_sym" else nncf.CompressWeightsMode.INT4_ASYM
        scope = nncf.IgnoredScope(patterns=scope_patterns(kept), validate=True) if kept else None
        extra: dict[str, Any] = {}
        if data_aware != "none":
            rows = len(calibration)
            extra = {**DATA_AWARE[data_aware], "dataset": calibration_dataset(calibration), "subset_size": rows}
        compressed = nncf.compress_weights(
            compressed, mode=mode, group_size=group_size, ratio=ratio, ignored_scope=scope, **extra
        )
        steps = [
            f"nncf.compress_weights({mode.name}, group_size={group_size}, ratio={ratio}"
            + (f", ignored_scope={len(kept)} kept" if kept else "")
            + (f", {data_aware} on {len(calibration)} calibration rows" if data_aware != "none" else "")
            + ")"
        ]
        if kept:
            compressed = nncf.compress_weights(compressed, mode=nncf.CompressWeightsMode.INT8_ASYM)
            steps.append("nncf.compress_weights(INT8_ASYM) of the kept")
    scratch = out_dir / "compressed.xml"
    ov.save_model(compressed, scratch)
    del compressed
    scratch.replace(ir)
    scratch.with_suffix(".bin").replace(ir.with_suffix(".bin"))
    then = f"; then {'; '.join(steps)}" if steps else "; every matrix kept in fp16 (share 0)"
    return {**done, "exported_by": f"{done['exported_by']}{then}"}


def compressible(model: Any) -> list[str]:
    """The names of the IR's matrix products whose weight is a constant (what NNCF may compress)."""
    names = []
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul":
            continue
        source = node.input(1).get_source_output().get_node()
        while source.get_type_name() in DECOMPRESSION:
            source = source.input(0).get_source_output().get_node()
        if source.get_type_name() == "Constant":
            names.append(node.get_friendly_name())
    return names


def weight_types(ir_file: Path) -> dict[str, int]:
    """The IR's matrix products by the element type of their weights (a compressed weight is a u8/i4
    constant behind its Convert and scales), so the probe counts what NNCF really compressed."""
    import openvino as ov

    counts: dict[str, int] = {}
    for node in ov.Core().read_model(ir_file).get_ordered_ops():
        if node.get_type_name() != "MatMul":
            continue
        source = node.input(1).get_source_output().get_node()
        while source.get_type_name() in DECOMPRESSION:
            source = source.input(0).get_source_output().get_node()
        if source.get_type_name() == "Constant":  # a matrix product of two activations (attention) is none
            kind = str(source.get_element_type().get_type_name())
            counts[kind] = counts.get(kind, 0) + 1
    return counts

"""Which architectures run on which engine, measured: a small random-init model of each common family saved
as a Hugging Face folder with a tokenizer, then each engine's own trial code (autotune.backends.generation's
`prepare`, as a trial runs it) converts it and greedy-decodes a prompt, in a process of its own (a crash is a
result) and in the engine's runtime (IPEX: .venv-ipex). A cell says whether it ran and whether its tokens are
FP32 eager's; the manual's table (docs/manual/text-generation.md) is made from the file this writes (default
docs/results/support/architectures.json).

    .venv/bin/python docs/benchmarks/architectures.py [--out FILE] [--family Llama ...]

tests/test_architectures.py runs it and compares what it measured with the committed file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # tiny_lm: the stdlib text and the SentencePiece trainer

# (engine column, backend, precision): the engines a language model is searched on, each at a precision that
# keeps FP32's numerics (so its tokens can be compared), plus torchao's int8 weight-only, which rewrites the
# model's nn.Linear modules (GPT-2's projections are Conv1D)
ENGINES = (
    ("eager", "eager", "fp32"),
    ("torchao int8", "eager", "woq_int8"),
    ("inductor", "inductor", "fp32"),
    ("llama.cpp", "llamacpp", "F32"),
    ("OpenVINO", "openvino", "fp32"),
    ("IPEX", "ipex", "fp32"),
)
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def family_configs(vocab: int) -> dict[str, Any]:
    """A small config of each family, as transformers builds it (random init)."""
    from transformers import (
        GemmaConfig,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        OPTConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    # the special tokens the folder's tokenizer has (a real folder's config names its tokenizer's)
    special = {"bos_token_id": 1, "eos_token_id": 2}
    common = {**SMALL, **special, "vocab_size": vocab, "max_position_embeddings": 256, "tie_word_embeddings": False}
    kv = {"num_key_value_heads": 2}
    return {
        "Llama": LlamaConfig(**common, **kv),
        "Qwen2": Qwen2Config(**common, **kv),
        "Qwen3": Qwen3Config(**common, **kv, head_dim=16),
        "Mistral": MistralConfig(**common, **kv, sliding_window=None),
        "Phi-3": Phi3Config(**common, **kv, pad_token_id=0),  # its default pad id is past a small vocabulary
        "Gemma": GemmaConfig(**common, **kv, head_dim=16),
        "GPT-2": GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=vocab, **special),
        "OPT": OPTConfig(
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=vocab,
            max_position_embeddings=256,
            word_embed_proj_dim=64,
            pad_token_id=0,
            **special,
        ),
    }


def save_folders(root: Path, families: list[str]) -> dict[str, Path]:
    """Each family's folder: its random-init weights and one SentencePiece tokenizer (trained once)."""
    import tiny_lm
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer_dir = root / "tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_lm.sentencepiece_folder(tokenizer_dir, tiny_lm.stdlib_text()[:200_000])
    folders = {}
    for family, config in family_configs(len(tokenizer)).items():
        if family not in families:
            continue
        torch.manual_seed(0)
        folder = root / family
        AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
        for file in tokenizer_dir.iterdir():
            shutil.copy(file, folder / file.name)
        folders[family] = folder
    return folders


def probe(folder: str, backend: str, precision: str) -> dict[str, Any]:
    """In this process: build the folder's model as a trial does, prepare the engine, greedy-decode 8 tokens
    of a fixed prompt; the tokens, and FP32 eager's."""
    import torch

    from autotune.backends.generation import prepare
    from autotune.model.sources import build_model, resolve_model
    from autotune.records.config import TrialConfig

    source = resolve_model(folder, None, "input_ids:int64:32:0-512")
    prompt = torch.randint(3, 512, (1, 32), generator=torch.Generator().manual_seed(0))
    config = TrialConfig(backend=backend, precision=precision, batch_size=1, threads_per_instance=2)
    generator, details = prepare(build_model(source), config, 8)
    tokens = generator.generate(prompt, stamp=False)[0].tolist()
    reference, _ = prepare(build_model(source), TrialConfig(backend="eager", precision="fp32", batch_size=1), 8)
    eager = reference.generate(prompt, stamp=False)[0].tolist()
    vocab = details.get("vocab") or details.get("tokenizer")
    return {"tokens": tokens, "eager": eager, "detail": str(vocab) if vocab else None}


def run_cell(folder: Path, backend: str, precision: str, python: str) -> dict[str, Any]:
    """One engine on one folder, in a process of its own."""
    started = time.monotonic()
    done = subprocess.run(
        [python, __file__, "--probe", str(folder), backend, precision],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    seconds = round(time.monotonic() - started, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        why = why.replace(str(folder.parent) + "/", "")[:240]  # the scratch folder's name says nothing
        return {"runs": False, "why": why, "seconds": seconds}
    result = json.loads(lines[-1])
    same = result["tokens"] == result["eager"]
    detail = result["detail"].replace(str(folder.parent) + "/", "") if result["detail"] else None
    return {"runs": True, "same_tokens": same, "detail": detail, "seconds": seconds}


def cell_text(cell: dict[str, Any]) -> str:
    """A table cell: runs with FP32 eager's tokens, runs with other tokens, or fails and why."""
    if not cell["runs"]:
        return f"no: {cell['why']}"
    text = "yes" if cell["same_tokens"] else "runs, other tokens than FP32 eager"
    if str(cell.get("detail") or "").startswith("placeholder"):
        text += " (token ids only: the converter kept placeholder tokens, " + cell["detail"].split(": ", 1)[-1] + ")"
    return text


def machine() -> str:
    """The CPU, its matrix extensions and its cores, as the results files name a machine."""
    from autotune.common.cpuinfo import read_cpuinfo

    model, flags = read_cpuinfo()
    extensions = [f for f in ("amx_int8", "amx_bf16", "avx512_bf16", "avx512_vnni", "avx2") if f in flags]
    return f"{model} ({', '.join(extensions)}), {os.cpu_count()} CPUs"


def measure(families: list[str], scratch: Path) -> dict[str, Any]:
    from autotune.machine.runtimes import default_ipex_runtime

    folders = save_folders(scratch, families)
    ipex = default_ipex_runtime()
    table: dict[str, dict[str, Any]] = {}
    for family, folder in folders.items():
        table[family] = {}
        for column, backend, precision in ENGINES:
            python = str(ipex) if backend == "ipex" and ipex else sys.executable
            table[family][column] = run_cell(folder, backend, precision, python)
            print(f"{family:8} {column:13} {cell_text(table[family][column])}", flush=True)
    return {
        "what": "which engines convert and run a small random-init model of each family (autotune's trial code)",
        "command": "python docs/benchmarks/architectures.py" + "".join(f" --family {f}" for f in families),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "engines": [f"{column}: {backend} {precision}" for column, backend, precision in ENGINES],
        "table": table,
    }


def markdown_table(results: dict[str, Any]) -> str:
    """The manual's table, from a results file this script wrote."""
    columns = [entry.split(":")[0] for entry in results["engines"]]
    lines = ["| family | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    for family, cells in results["table"].items():
        lines.append(f"| {family} | " + " | ".join(cell_text(cells[c]).replace("|", "/") for c in columns) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "support" / "architectures.json"))
    parser.add_argument("--family", action="append", help="only these families (default: all)")
    parser.add_argument("--probe", nargs=3, metavar=("FOLDER", "BACKEND", "PRECISION"), help=argparse.SUPPRESS)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.probe:
        print(json.dumps(probe(*args.probe)))
        return 0
    import tempfile

    families = args.family or list(family_configs(512))
    with tempfile.TemporaryDirectory(prefix="autotune-architectures-") as scratch:
        results = measure(families, Path(scratch))
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(markdown_table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

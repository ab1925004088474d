"""A language model whose quality means something, tuned as its users hold it, beside the engines' own tools.

1. Train: a Llama-architecture model of about 23M parameters (hidden 512, 6 layers, vocabulary 4096) with a
   SentencePiece BPE tokenizer, both trained on the docstrings of Python's standard library (text that ships
   with Python, about 1.1 MB; the last 10% held out), for --train-seconds under bfloat16 autocast, saved as a
   Hugging Face folder (studies/benchmarks/trained-llama/model; not committed). Kept and reused when its
   settings have not changed.
2. Search: `autotune search --model FOLDER --data HELD-OUT --budget B` (defaults: 20 minutes, the default space,
   KL divergence bounded by 0.05), as a user runs it.
3. Engines: llm_engines.py on the folder: each engine and type the search tries through autotune (tokens/s, KL
   divergence, same top token, perplexity increase against FP32 eager on the held-out text) beside
   llama-batched-bench and OpenVINO GenAI's benchmark on the same files, and the search's winner as a row.
4. Quality beside llama.cpp's own: `llama-perplexity --kl-divergence` on every GGUF of step 3 against its F32
   GGUF, over the held-out text (chunks of --context tokens, BOS first, the second half of each scored), and
   the ratio of autotune's KL divergence to the tool's (autotune's is over step 3's --eval-samples prompts:
   seeded windows of the same text, the last 128 positions of each, 8,192 positions at the default 64).
   With --quality-only, steps 2 and 3 are replaced: llama.cpp's types alone, through autotune with the tool's
   own chunks as the drift prompts (a token file of rows, each scored once), so both score the same positions
   and the ratio holds no sampling error between them.

    make llama-tools
    .venv/bin/python docs/benchmarks/trained_llm.py [--train-seconds 360] [--budget 20m] [--skip-search]
        [--eval-samples 64] [--quality-only]

Mixed precision at a bound tight enough that the whole-model 4-bit files break it: the search in the mixes'
own space, and the engine rows at the same bound with the types beside it:

    .venv/bin/python docs/benchmarks/trained_llm.py --space search_spaces/generate-mix.yaml --study trained-mix \
        --max-drift 0.001 --types Q8_0,Q4_0 --openvino-types int8_asym,int4_sym --budget 20m

Writes docs/results/trained-llm-<date>.json (machine, commit, command, training, rows, the tool's KLD).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_lm: the training loop the tests use

WORK = ROOT / "studies" / "benchmarks" / "trained-llama"
SHAPE = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8}


def train(seconds: float, vocab: int) -> dict:
    """The trained folder (reused when trained with the same settings): its path, held-out text and numbers."""
    folder, record = WORK / "model", WORK / "training.json"
    settings = {"seconds": seconds, "vocab": vocab, **SHAPE, "text": "stdlib docstrings (all modules, methods)"}
    if record.is_file() and json.loads(record.read_text())["settings"] == settings and folder.is_dir():
        return json.loads(record.read_text())
    import tiny_lm
    from transformers import LlamaConfig

    text = tiny_lm.stdlib_text(tiny_lm.all_stdlib_modules(), methods=True)
    config = LlamaConfig(
        **SHAPE,
        num_key_value_heads=4,
        vocab_size=vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    started = time.monotonic()
    trained = tiny_lm.train_llama_folder(
        folder, steps=1_000_000, seq=256, batch=8, config=config, vocab=vocab, seconds=seconds, text=text, bf16=True
    )
    result = {
        "settings": settings,
        "folder": str(folder),
        "held_out": str(trained["text"]),
        "text_chars": len(text),
        "held_out_tokens": len(trained["ids"]),
        "parameters": trained["parameters"],
        "steps": trained["steps"],
        "tokens_seen": trained["steps"] * 256 * 8,
        "held_out_perplexity": trained["perplexity"],
        "wall_s": time.monotonic() - started,
    }
    record.write_text(json.dumps(result, indent=1))
    return result


def tool_chunks(folder: str, held_out: str, context: int, chunks: int) -> Path:
    """The held-out text as llama-perplexity cuts it: its ids with BOS first, in chunks of `context` whose
    first id is BOS; saved as rows (each row one of autotune's prompts, so both score the same positions)."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = [tokenizer.bos_token_id, *tokenizer.encode(Path(held_out).read_text(), add_special_tokens=False)]
    rows = [[tokenizer.bos_token_id, *ids[i * context + 1 : (i + 1) * context]] for i in range(chunks)]
    out = WORK / f"tool-chunks-{context}.pt"
    torch.save(torch.tensor(rows, dtype=torch.long), out)
    return out


def run(command: list[str]) -> None:
    print("$", shlex.join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_results_commands.py parses the commands results files quote with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-seconds", type=float, default=360.0)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--budget", default="20m", help="the search's budget")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--skip-search", action="store_true", help="the engine rows only (no winner row)")
    parser.add_argument("--context", type=int, default=256, help="llama-perplexity's chunk")
    parser.add_argument(
        "--eval-samples",
        type=int,
        default=64,
        help="the engine rows' drift prompts (64 x 128 compared positions: a KL divergence whose sampling error is "
        "a few percent, to set beside llama-perplexity's)",
    )
    parser.add_argument(
        "--quality-only",
        action="store_true",
        help="no search and llama.cpp's types only; autotune's drift prompts are the tool's own chunks (--context "
        "tokens, BOS first), each once: both score the second half of every chunk",
    )
    parser.add_argument(
        "--space", help="the search's space (default: autotune's; e.g. search_spaces/generate-mix.yaml)"
    )
    parser.add_argument("--study", default="trained-llama", help="the search's study (beside the trained folder)")
    parser.add_argument(
        "--max-drift", type=float, help="the KL divergence bound of the search and the engine rows (default 0.05)"
    )
    parser.add_argument("--types", help="llm_engines.py's --types (default: its own)")
    parser.add_argument("--openvino-types", help="llm_engines.py's --openvino-types (default: its own)")
    parser.add_argument("--target", type=float, help="llm_engines.py's --target: the winner against the best tool")
    parser.add_argument("--out", help="results file (default docs/results/trained-llm-<date>.json)")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    trained = train(args.train_seconds, args.vocab)
    print(
        f"trained: {trained['parameters'] / 1e6:.1f}M parameters, {trained['steps']} steps "
        f"({trained['tokens_seen'] / 1e6:.1f}M tokens), held-out perplexity {trained['held_out_perplexity']:.1f}",
        flush=True,
    )
    folder, held_out = trained["folder"], trained["held_out"]
    python = sys.executable
    shape = ["--prompt-tokens", str(args.prompt), "--new-tokens", str(args.new)]
    study = args.study
    best = WORK / "studies" / study / "best.json"
    bound = ["--max-drift", str(args.max_drift)] if args.max_drift is not None else []
    if not args.skip_search and not args.quality_only:
        run(
            [
                str(Path(python).with_name("autotune")),
                "search",
                "--model",
                folder,
                "--data",
                held_out,
                "--budget",
                args.budget,
                "--study",
                study,
                "--studies-dir",
                str(WORK / "studies"),
                "--sequences",
                "1",
                *shape,
                *bound,
                *(["--space", args.space] if args.space else []),
            ]
        )
    engines_out = WORK / ("engines-quality.json" if args.quality_only else "engines.json")
    engines = [python, str(HERE / "llm_engines.py"), "--model", folder, "--data", held_out, "--sequences", "1"]
    chunks = trained["held_out_tokens"] // args.context
    if args.quality_only:  # the tool's own chunks as the prompts, each once: the same positions scored
        engines[engines.index("--data") + 1] = str(tool_chunks(folder, held_out, args.context, chunks))
        engines += ["--prompt", str(args.context), "--new", "1", "--openvino-types", "", "--ipex-types", ""]
        engines += ["--window", "1", "--eval-samples", str(chunks)]
    else:
        engines += ["--prompt", str(args.prompt), "--new", str(args.new), "--eval-samples", str(args.eval_samples)]
    engines += ["--no-recipe", "--out", str(engines_out), *bound]
    for option, value in (
        ("--types", args.types),
        ("--openvino-types", args.openvino_types),
        ("--target", args.target),
    ):
        if value is not None and not args.quality_only:
            engines += [option, str(value)]
    if best.is_file() and not args.quality_only:
        engines += ["--best", str(best)]
    run(engines)
    from autotune.backends.llamacpp.generate import AMX_BUILD, LlamaCppGenerator
    from autotune.backends.llamacpp.own_tool import PERPLEXITY_TOOL, perplexity_kld, tool_path
    from autotune.machine.probe import probe_machine

    data = json.loads(engines_out.read_text())
    rows = data["rows"]
    files = {r["row"].split()[-1]: Path(r["file"]) for r in rows if r["row"].startswith("autotune llamacpp")}
    tool = tool_path(sys.prefix, PERPLEXITY_TOOL)
    cores = probe_machine().physical_cores
    # as autotune's trials load a GGUF: without llama.cpp's extra weight buffers where the build has AMX
    repack = AMX_BUILD not in LlamaCppGenerator.system_info()
    quality = []
    if "F32" in files:
        scratch = WORK / "perplexity"
        scratch.mkdir(exist_ok=True)
        for gguf_type, gguf in files.items():
            if gguf_type == "F32":
                continue
            row = next(r for r in rows if r["row"] == f"autotune llamacpp {gguf_type}")
            theirs = perplexity_kld(
                tool, files["F32"], gguf, Path(held_out), args.context, chunks, cores, scratch, repack
            )
            ours = row.get("drift_kld")
            quality.append(
                {
                    "type": gguf_type,
                    "autotune_kld": ours,
                    "autotune_same_top": row.get("drift_same_top"),
                    "llama_perplexity_kld": theirs["mean_kld"],
                    "llama_perplexity_kld_pm": theirs["mean_kld_pm"],
                    "llama_perplexity_same_top_percent": theirs["same_top_percent"],
                    "ratio": ours / theirs["mean_kld"] if ours is not None and theirs["mean_kld"] else None,
                    "chunks": chunks,
                    "commands": theirs["commands"],
                }
            )
            print(
                f"{gguf_type}: autotune KLD {ours:.4g} (same top {row.get('drift_same_top')}), llama-perplexity "
                f"{theirs['mean_kld']:.4g} ± {theirs['mean_kld_pm']:.2g} (same top {theirs['same_top_percent']}%)"
                f" over {chunks} chunks of {args.context}: ratio {quality[-1]['ratio']:.3f}",
                flush=True,
            )
    from results import write_results

    out = write_results(
        "trained-llm",
        "a trained 23M Llama folder: each engine and type through autotune beside the tools, autotune's KL "
        "divergence beside llama-perplexity's, and a search's winner",
        {**data["workload"], "model": "trained Llama (training below)"},
        [] if args.quality_only else rows,  # its speeds are one short window each: the quality is the point
        args.out,
        drift_bound=data["drift_bound"],
        targets=[] if args.quality_only else data.get("targets", []),
        failed_tool_runs=data.get("failed_tool_runs", []),
        training=trained,
        llama_perplexity=quality,
        engines_command=shlex.join(engines),
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

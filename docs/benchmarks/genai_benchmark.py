"""OpenVINO GenAI's own benchmark (samples/python/text_generation/benchmark_genai.py) on token ids: the
models autotune benchmarks carry no tokenizer, so the prompt is random ids instead of text; the rest is
that sample at its defaults: an LLMPipeline on CPU with prefix caching off and max_num_batched_tokens
unbounded, 1 warm-up and 3 timed generate calls of max_new_tokens, perf_metrics summed over the timed
calls. Its activations are the CPU plugin's default (bf16 where the CPU has AVX512-BF16 or AMX) unless
--inference-precision names one: the row's quality is that of the precision it ran, printed with the speed.
ignore_eos keeps every call at exactly max_new_tokens (a random model may emit its EOS id). The prompt's ids
are drawn below the model's vocabulary (`vocab_size` in the IR folder's config.json, else --vocab): an id past
it is no token of the model, and the plugin's Gather reads zeros for it.

    .venv/bin/python docs/benchmarks/genai_benchmark.py IR_DIR --prompt 512 --new 64 --sequences 1 --threads 2

Prints one JSON line: TTFT, TPOT and throughput from perf_metrics, and generated tokens over the mean
generate duration (the quantity docs/benchmarks/llm_engines.py compares).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_results_commands.py parses the commands results files quote with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--sequences", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="INFERENCE_NUM_THREADS; 0: the plugin's default")
    parser.add_argument(
        "--inference-precision",
        choices=("f32", "bf16", "f16"),
        help="INFERENCE_PRECISION_HINT; default: the CPU plugin's own (bf16 where the CPU has it)",
    )
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a CPU plugin property passed to the pipeline as autotune's trial passes it (e.g. KV_CACHE_PRECISION=u8)",
    )
    parser.add_argument("--vocab", type=int, help="ids drawn below this; default: the IR folder's vocab_size")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=3)
    return parser


def model_vocab(folder: Path) -> int:
    """The vocabulary the IR's model was exported with (optimum-intel writes its config.json beside it)."""
    config = folder / "config.json"
    if not config.is_file():
        raise SystemExit(f"{config} is missing: pass --vocab, the model's vocabulary size")
    return int(json.loads(config.read_text())["vocab_size"])


def main() -> int:
    import numpy as np
    import openvino as ov
    import openvino_genai

    args = build_parser().parse_args()

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    scheduler.max_num_batched_tokens = sys.maxsize
    properties: dict[str, object] = {"INFERENCE_NUM_THREADS": args.threads} if args.threads else {}
    if args.inference_precision:
        properties["INFERENCE_PRECISION_HINT"] = args.inference_precision
    for named in args.property:
        key, _, value = named.partition("=")
        properties[key] = int(value) if value.isdigit() else value
    precision = args.inference_precision or ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()
    pipe = openvino_genai.LLMPipeline(args.model, "CPU", scheduler_config=scheduler, **properties)
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = args.new
    config.ignore_eos = True
    config.apply_chat_template = False
    vocab = args.vocab or model_vocab(Path(args.model))
    ids = np.random.default_rng(0).integers(0, vocab, (args.sequences, args.prompt), dtype=np.int64)
    inputs = openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    for _ in range(args.warmup):
        pipe.generate(inputs, config)
    first = pipe.generate(inputs, config)
    generated = first.perf_metrics.get_num_generated_tokens()  # one call's: every sequence's new tokens
    if generated != args.sequences * args.new:
        raise SystemExit(f"a call generated {generated} tokens, not {args.sequences} x {args.new}")
    metrics = first.perf_metrics
    for _ in range(args.iterations - 1):
        metrics = metrics + pipe.generate(inputs, config).perf_metrics
    duration_ms = metrics.get_generate_duration().mean
    print(
        json.dumps(
            {
                "genai": openvino_genai.__version__,
                "inference_precision": precision,
                "vocab": vocab,
                "properties": properties,
                "ttft_ms": metrics.get_ttft().mean,
                "tpot_ms": metrics.get_tpot().mean,
                "throughput": metrics.get_throughput().mean,
                "generate_ms": duration_ms,
                "generated_per_call": generated,
                "generated_tokens_per_s": generated / (duration_ms / 1e3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where autotune's OpenVINO trial and OpenVINO GenAI's own benchmark part on the same IR. GenAI's benchmark
(genai_benchmark.py: 1 warm-up, 3 timed generate calls, generated tokens over their mean duration) is run in
the trial's settings one at a time: the plugin properties the trial passes (KV_CACHE_PRECISION u8,
DYNAMIC_QUANTIZATION_GROUP_SIZE 32), tcmalloc preloaded as a trial preloads it (with TBB_ENABLE_SANITIZERS=1),
the process pinned as the trial is; then all three.
autotune's generator (OpenVinoGenerator, the class a trial times) runs under the same protocol in those
settings, with and without the drift pass a trial runs first in its process. Each row is a fresh process;
the rows are interleaved over --rounds rounds and the medians compared with the benchmark at its defaults.

    .venv/bin/python docs/benchmarks/genai_gap.py IR_DIR [--prompt 512] [--new 64] [--rounds 3]
        [--inference-precision bf16]

Writes docs/results/genai-gap-<date>.json (machine, commit, command, every row's runs and command).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

TRIAL_PROPERTIES = ("KV_CACHE_PRECISION=u8", "DYNAMIC_QUANTIZATION_GROUP_SIZE=32")  # what a trial writes


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_results_commands.py parses the commands results files quote with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the IR folder (optimum-intel's export, as a trial built it)")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--inference-precision",
        choices=("f32", "bf16"),
        help="both sides' activations (default: the CPU plugin's own, which GenAI's benchmark runs)",
    )
    parser.add_argument("--out")
    parser.add_argument(
        "--generator",
        action="store_true",
        help="(one row's process) autotune's OpenVinoGenerator under GenAI's protocol; prints one JSON line",
    )
    parser.add_argument("--drift-first", action="store_true", help="with --generator: the drift pass first")
    return parser


def time_generator(args: argparse.Namespace, threads: int) -> dict:
    """autotune's generator under GenAI's protocol: 1 warm-up, 3 timed calls, tokens over their mean wall time
    (with --drift-first, after the drift pass a trial runs first: logits through its own infer request)."""
    import numpy as np

    from autotune.backends.openvino.generate import OpenVinoGenerator
    from autotune.backends.openvino.ir_export import IR_FILE

    vocab = int(json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
    precision = args.inference_precision or plugin_default()
    generator = OpenVinoGenerator(
        Path(args.model) / IR_FILE, new_tokens=args.new, threads=threads, inference_precision=precision
    )
    ids = np.random.default_rng(0).integers(0, vocab, (1, args.prompt), dtype=np.int64)
    if args.drift_first:
        generator.generate_with_logits(ids, positions=64)
    generator.generate(ids, stamp=True)  # stamp: the drift request is released, as in a trial's timed calls
    durations = []
    for _ in range(3):
        started = time.perf_counter()
        generator.generate(ids, stamp=True)
        durations.append(time.perf_counter() - started)
    return {"inference_precision": precision, "generated_tokens_per_s": args.new / statistics.mean(durations)}


def plugin_default() -> str:
    import openvino as ov

    return str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    args = build_parser().parse_args()
    from autotune.machine.probe import find_allocators, probe_machine
    from autotune.records.config import TrialConfig, pin_prefix

    machine = probe_machine()
    threads = len(os.sched_getaffinity(0))
    if args.generator:
        print(json.dumps(time_generator(args, threads)))
        return 0
    config = TrialConfig("openvino", "int8_asym", batch_size=1, threads_per_instance=threads)
    pin = pin_prefix(config.instance_cpus(machine)[0], machine)
    from autotune.backends.openvino.generate import SPEC

    # as a trial preloads it: with the variables OpenVINO needs beside a preloaded allocator (TBB's own
    # allocator proxy otherwise frees tcmalloc's pointers)
    tcmalloc = {"LD_PRELOAD": find_allocators()["tcmalloc"], **dict(SPEC.preloaded_allocator_env)}
    shape = ["--prompt", str(args.prompt), "--new", str(args.new), "--threads", str(threads)]
    precision = ["--inference-precision", args.inference_precision] if args.inference_precision else []
    tool = [sys.executable, str(HERE / "genai_benchmark.py"), args.model, *shape, *precision]
    properties = [part for named in TRIAL_PROPERTIES for part in ("--property", named)]
    ours = [sys.executable, str(Path(__file__).resolve()), args.model, "--generator", *shape[:4], *precision]
    rows: list[tuple[str, list[str], list[str], dict[str, str]]] = [
        ("GenAI's benchmark at its defaults", [], tool, {}),
        ("+ the trial's plugin properties", [], [*tool, *properties], {}),
        ("+ tcmalloc", [], tool, tcmalloc),
        ("+ pinned as the trial", pin, tool, {}),
        ("+ all three (the trial's settings)", pin, [*tool, *properties], tcmalloc),
        ("autotune's generator in the trial's settings", pin, ours, tcmalloc),
        ("autotune's generator after the drift pass", pin, [*ours, "--drift-first"], tcmalloc),
    ]
    runs: dict[str, list[float]] = {name: [] for name, *_ in rows}
    ran: dict[str, str] = {}
    console = Console()
    for round_number in range(args.rounds):
        for name, prefix, command, environment in rows:
            done = subprocess.run(
                [*prefix, *command], env={**os.environ, **environment}, capture_output=True, text=True, timeout=1800
            )
            if done.returncode != 0:
                raise SystemExit(f"{name} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")
            printed = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(printed["generated_tokens_per_s"])
            ran[name] = printed.get("inference_precision", "")
            console.print(f"round {round_number + 1}: {name}: {runs[name][-1]:.1f} tokens/s", markup=False)
    reference = statistics.median(runs[rows[0][0]])
    table = Table(title=f"{args.model}: prompt {args.prompt}, {args.new} new tokens, medians of {args.rounds}")
    for column in ("row", "activations", "tokens/s", "vs the benchmark's defaults", "runs"):
        table.add_column(column, justify="left" if column in ("row", "runs") else "right")
    results = []
    for name, prefix, command, environment in rows:
        median = statistics.median(runs[name])
        table.add_row(
            name, ran[name], f"{median:.1f}", f"{median / reference:.3f}", ", ".join(f"{r:.1f}" for r in runs[name])
        )
        results.append(
            {
                "row": name,
                "tokens_per_s": median,
                "runs": [round(r, 2) for r in runs[name]],
                "vs_baseline": round(median / reference, 3),
                "inference_precision": ran[name],
                "command": shlex.join(command),
                "pinned": shlex.join(prefix),
                "environment": environment,
            }
        )
    console.print(table)
    from results import write_results

    out = write_results(
        "genai-gap",
        "GenAI's benchmark in autotune's trial settings one at a time, and autotune's generator under its protocol",
        {"ir": args.model, "prompt": args.prompt, "new_tokens": args.new, "threads": threads, "rounds": args.rounds},
        results,
        args.out,
        unit="generated tokens/s",
        ratio_to=rows[0][0],
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

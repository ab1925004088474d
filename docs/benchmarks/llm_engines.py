"""llama.cpp and OpenVINO through autotune against their own tools on the same files (llama.cpp's
llama-batched-bench on the GGUF, OpenVINO GenAI's benchmark on the IR), IPEX's ipex.llm.optimize (--ipex-types,
in the IPEX runtime; it has no benchmark tool of its own: its examples time the same `generate`), beside
autotune's eager fp32 and the seed's recipe: the 105M decoder of decoders.py (or its 1B one, --model
decoder_1b; random init), or a Hugging Face folder (--model FOLDER --data TEXT: its tokenizer encodes the text;
trained_llm.py trains one), interleaved in one run.

    make llama-tools   # llama-bench and llama-batched-bench, from the source llama-cpp-python carries
    .venv/bin/python docs/benchmarks/llm_engines.py [--layers 8] [--prompt 512] [--new 64] [--sequences 1,8]
        [--repeats 1] [--best studies/S/best.json ...]

--best adds the winner of an `autotune search --task generate` on the same decoder as a row at its total
sequences, and where it is llama.cpp or OpenVINO, its engine's tool on the winner's own file as a row (a mix
included: whether its speed is the file's; never counted as a tool's type); the seed's recipe (inductor da8w8,
max-autotune, C++ wrapper, concat_linear, freezing) is a row unless --no-recipe. The summary sets the winner
beside the best tool row within --max-drift (relative L2, default 0.05: a tool row past it does not count;
--target is printed beside it), beside the best whole-model type through autotune within it, and beside the
recipe. A mixed winner's row says its compressed_share, kept type and layers (search_spaces/generate-mix.yaml
is the mixed-precision benchmark's space).

autotune's rows run autotune's protocol (a fresh pinned process per trial, warm-up, stop rule, a stamp per
token); tokens/s is generated tokens over the timed calls' time (prefill and decode). llama-batched-bench's
rows run `llama-batched-bench -m FILE -npp PROMPT -ntg NEW -npl SEQUENCES -t CORES -c CTX`, pinned to the
CPUs autotune's trial ran on (autotune/backends/llamacpp/own_tool.py; CTX: the
tokens the shape needs, rounded up to 256, plus 256; its defaults
otherwise: n_batch 2048, n_ubatch 512, flash attention auto; `--no-repack` where llama.cpp's build has AMX,
whose weight buffers crash it, as autotune's trials load it) on the very file autotune's trial loaded, and
their tokens/s is the same quantity read from its JSON line: pl x ntg / t (its own `speed` also counts the
prompt's tokens). OpenVINO GenAI's rows run genai_benchmark.py (its benchmark_genai sample's protocol on
token ids: 1 warm-up, 3 timed calls, `INFERENCE_NUM_THREADS` = the cores) on the IR autotune's trial loaded;
tokens/s is generated tokens over its mean generate duration; they run the CPU plugin's default activations
(bf16 where the CPU has them), and so does autotune's row of each OpenVINO type, so the tool row's drift is the
numerics it ran (on the winner's file, GenAI runs the winner's activations). Drift is the autotune trial's (the
same file and numerics) against FP32 eager: logits' relative L2, mean KL divergence, same-top-token share and
perplexity increase; the bound (--drift-metric, --max-drift) is relative L2 0.05 for the random-init decoders
and KL divergence 0.05 for a folder, autotune's defaults.
Writes docs/results/engines-<date>.json (machine, commit, command, rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TYPES = ("F32", "BF16", "Q8_0", "Q4_K_M", "Q4_0")
OPENVINO_TYPES = ("int8_asym", "int4_sym")
IPEX_TYPES = ("woq_int8", "bf16")
IPEX_OPTIONS = {"lowp_mode": "int8"}
OPENVINO_OPTIONS = {"kv_cache_precision": "u8", "dynamic_quantization_group_size": 32}


def plugin_precision() -> str:
    """The CPU plugin's default activations (bf16 where the CPU has AVX512-BF16 or AMX): what GenAI's benchmark
    runs at its defaults, so autotune's row of each type runs it too and the tool row's quality is its own."""
    import openvino as ov

    return str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())  # "bf16", not the Type


def openvino_row_options() -> dict[str, object]:
    """The options of autotune's OpenVINO row of a whole type: the tool's numerics (its activations)."""
    return {"inference_precision": plugin_precision(), **OPENVINO_OPTIONS}


def genai_bench(
    ir_dir: Path, prompt: int, new: int, sequences: int, threads: int, inference_precision: str | None = None
) -> dict:
    """OpenVINO GenAI's benchmark protocol (genai_benchmark.py) on the IR, in its own process, at the CPU
    plugin's default activations or the ones named (the winner's, on its file)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve().parent / "genai_benchmark.py"),
        str(ir_dir),
        "--prompt",
        str(prompt),
        "--new",
        str(new),
        "--sequences",
        str(sequences),
        "--threads",
        str(threads),
        *(["--inference-precision", inference_precision] if inference_precision else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "command": shlex.join(command)}


def targets(rows: list[dict], max_drift: float, metric: str = "relative_l2", tool_target: float = 1.1) -> list[dict]:
    """Per sequences: the search's winner against the best of the tools' own rows whose file stays within
    the drift bound (a row past it does not count), and against the seed's recipe."""
    out = []
    for sequences in sorted({r["sequences"] for r in rows}):
        shape = [r for r in rows if r["sequences"] == sequences]
        winner = next((r for r in shape if r["row"] == "autotune search winner"), None)
        recipe = next((r for r in shape if r["row"] == "autotune inductor da8w8 recipe"), None)
        tools = [r for r in shape if r["row"].startswith(("llama-batched-bench", "openvino-genai"))]
        within = [r for r in tools if r.get(f"drift_{metric}") is not None and r[f"drift_{metric}"] <= max_drift]
        past = [r["row"] for r in tools if r not in within]
        best_tool = max(within, key=lambda r: r["tokens_per_s"], default=None)
        # autotune's rows of one type for the whole model (not the winner, not the recipe) within the bound
        whole = [
            r
            for r in shape
            if r["row"].startswith("autotune ")
            and r is not winner
            and r is not recipe
            and r.get(f"drift_{metric}") is not None
            and r[f"drift_{metric}"] <= max_drift
        ]
        best_whole = max(whole, key=lambda r: r["tokens_per_s"], default=None)
        line: dict = {
            "sequences": sequences,
            "best_tool": best_tool and best_tool["row"],
            "best_whole_type": best_whole and best_whole["row"],
            "tools_past_bound": past,
        }
        if winner and best_tool:
            line["winner_vs_best_tool"] = winner["tokens_per_s"] / best_tool["tokens_per_s"]
        if winner and best_whole:
            line["winner_vs_best_whole_type"] = winner["tokens_per_s"] / best_whole["tokens_per_s"]
        recipe_drift = recipe and recipe.get(f"drift_{metric}")
        if recipe and not (recipe_drift is not None and recipe_drift <= max_drift):  # garbage (or NaN): no target
            line["recipe_past_bound"] = recipe_drift
            recipe = None
        if winner and recipe:
            line["winner_vs_recipe"] = winner["tokens_per_s"] / recipe["tokens_per_s"]
        text = f"{sequences} seq.: "
        if winner is None:
            text += "no search winner row"
        else:
            text += f"winner {winner['tokens_per_s']:.1f} tokens/s"
            if best_tool:
                text += (
                    f", {line['winner_vs_best_tool']:.2f}x {best_tool['row']} ({best_tool['tokens_per_s']:.1f}; "
                    f"target {tool_target}x)"
                )
            if best_whole:
                text += (
                    f", {line['winner_vs_best_whole_type']:.2f}x the best whole-model type within the bound "
                    f"({best_whole['row']}, {best_whole['tokens_per_s']:.1f})"
                )
            if winner.get("compressed_share") is not None:
                text += f"; the winner is a mix: share {winner['compressed_share']} in its low type"
            if recipe:
                text += f", {line['winner_vs_recipe']:.2f}x the recipe ({recipe['tokens_per_s']:.1f}; target 1.2x)"
        if "recipe_past_bound" in line:
            drift_text = "unknown" if line["recipe_past_bound"] is None else f"{line['recipe_past_bound']:.3g}"
            past = [*past, f"the recipe (drift {drift_text}; target 1.2x not measurable)"]
        if past:
            text += f"; past the drift bound {metric} {max_drift} (not counted): {', '.join(past)}"
        line["text"] = text
        out.append(line)
    return out


WINNER_FILE_ROW = "search winner's file in its engine's tool"  # not a tool's own type: no target counts it


def mix_fields(metrics: object) -> dict:
    """A mixed build's share, kept type and layers and executed types as a row's columns (empty: a whole type)."""
    details = getattr(getattr(metrics, "artifact", None), "details", None) or {}
    if "kept_layers" not in details:
        return {}
    return {
        "compressed_share": details["compressed_share"],
        "kept_type": details["kept_type"],
        "kept_layers": len(details["kept_layers"]),
        "compressed_layers": details["compressed_layers"],
        "executed_types": details.get("tensor_types") or details.get("weight_types"),
    }


def winner_file_tool(
    metrics: object,
    config: object,
    args: argparse.Namespace,
    sequences: int,
    cores: int,
    tool: Path,
    repack: bool,
    machine: object,
) -> dict | None:
    """The engine's own tool on the file the search winner's trial loaded (its mix, where it is one): whether
    the winner's speed is the file's or autotune's process around it. None: not an engine with a tool."""
    from autotune.backends.llamacpp.own_tool import batched_bench
    from autotune.records.config import pin_prefix

    artifact = getattr(metrics, "artifact", None)
    if artifact is None:
        return None
    if config.backend == "openvino":
        precision = str(config.options.get("inference_precision", "f32"))  # the winner's activations, not the default
        measured = genai_bench(Path(artifact.dir), args.prompt, args.new, sequences, cores, precision)
        return {"tool": "openvino-genai", **measured}
    if config.backend == "llamacpp" and tool.is_file():
        pin = pin_prefix(config.instance_cpus(machine)[0], machine)
        measured = batched_bench(
            tool, Path(artifact.dir) / "model.gguf", args.prompt, args.new, sequences, cores, repack, pin
        )
        return {"tool": "llama-batched-bench", **measured}
    return None


def tool_runs_row(
    sequences: int, name: str, measured: list[dict], base: float | None, same_file: dict, kept: tuple[str, ...]
) -> dict:
    """A tool's runs as a row: the median of its tokens/s, the drift (and mix) of the file it ran, its command
    and the fields of its own output kept per run."""
    values = [m["generated_tokens_per_s"] for m in measured]
    return {
        "sequences": sequences,
        "row": name,
        "tokens_per_s": statistics.median(values),
        "runs": values,
        "vs_eager_fp32": statistics.median(values) / base if base else None,
        **same_file,
        "command": measured[0]["command"],
        **{key: [m[key] for m in measured] for key in kept},
    }


def drift_fields(drift: object | None) -> dict[str, float | None]:
    """A trial's drift against FP32 eager as a row's columns (None where it was not measured)."""
    return {
        "drift_relative_l2": getattr(drift, "relative_l2", None),
        "drift_kld": getattr(drift, "kl_divergence", None),
        "drift_same_top": getattr(drift, "greedy_agreement", None),
        "drift_perplexity_increase": getattr(drift, "perplexity_increase", None),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_results_commands.py parses the commands results files quote with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default="decoder",
        help="decoders.py's factory: decoder, the 105M decoder (--layers sets its depth), or decoder_1b; or a "
        "Hugging Face model folder",
    )
    parser.add_argument("--data", help="with a folder: the text prompts and drift are drawn from (its tokenizer's ids)")
    parser.add_argument(
        "--eval-samples", type=int, default=4, help="prompts drift is measured on (autotune's --eval-samples)"
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--sequences", default="1,8")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--window", type=float, default=5.0, help="minimum timed window per autotune run, seconds")
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--openvino-types", default=",".join(OPENVINO_TYPES))
    parser.add_argument(
        "--ipex-types", default=",".join(IPEX_TYPES), help="ipex.llm.optimize precisions (run in the IPEX runtime)"
    )
    parser.add_argument("--out", help="results file (default docs/results/engines-<date>.json)")
    parser.add_argument("--no-recipe", action="store_true", help="leave out the seed's recipe (inductor da8w8)")
    parser.add_argument("--max-drift", type=float, default=0.05, help="a row past this drift does not count")
    parser.add_argument(
        "--target", type=float, default=1.1, help="the winner's target against the best tool row (printed beside it)"
    )
    parser.add_argument(
        "--drift-metric",
        choices=("relative_l2", "kld"),
        help="the bounded drift (default: relative_l2 for decoders.py's, kld for a folder)",
    )
    parser.add_argument(
        "--best",
        action="append",
        default=[],
        help="best.json of a search on this decoder (repeatable): its winner is a row at its total sequences",
    )
    return parser


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from autotune.backends.llamacpp.generate import AMX_BUILD, LlamaCppGenerator
    from autotune.backends.llamacpp.own_tool import batched_bench, tool_path
    from autotune.common.errors import TrialFailed
    from autotune.machine.probe import probe_machine
    from autotune.machine.runtimes import discover_runtimes
    from autotune.measure.stopwatch import MeasureSettings
    from autotune.model.generation import GenerationWorkload
    from autotune.model.sources import resolve_model
    from autotune.records.config import TrialConfig, pin_prefix
    from autotune.runner.trials import TrialContext, compute_reference, run_config

    parser = build_parser()
    args = parser.parse_args()
    folder = args.model not in ("decoder", "decoder_1b")
    if folder and not Path(args.model).is_dir():
        parser.error(f"--model {args.model!r} is neither decoder, decoder_1b nor a model folder")
    metric = args.drift_metric or ("kld" if folder else "relative_l2")
    os.environ["BENCH_LAYERS"] = str(args.layers)
    tool = tool_path()
    if args.types and not tool.is_file():
        print(f"{tool} is missing: run `make llama-tools` first", file=sys.stderr)
        return 2

    console = Console(width=170)
    machine = probe_machine()
    cores = machine.physical_cores
    if folder:
        from autotune.api import _generation_workload

        workload = _generation_workload(args.model, "generate", args.prompt, args.new, args.data, None, None)
        model = resolve_model(args.model, None, f"input_ids:int64:{args.prompt}:0-{workload.vocab_size}")
        shape = Path(args.model).resolve().name
        described = f"{model.name} (the folder {args.model}), data {args.data or 'random ids'}"
    else:
        workload = GenerationWorkload(args.prompt, args.new, 32000, 2048)
        model = resolve_model(
            f"{Path(__file__).resolve().parent / 'decoders.py'}:{args.model}",
            None,
            f"input_ids:int64:{args.prompt}:0-32000",
        )
        shape = f"l{args.layers}" if args.model == "decoder" else "1b"
        described = (
            f"Llama {args.layers} layers hidden 768"
            if args.model == "decoder"
            else "Llama 16 layers hidden 2048 (about 1B parameters)"
        ) + " vocab 32000 (random init)"
    workload = replace(workload, drift_prompts=args.eval_samples)
    work = Path("studies") / "benchmarks" / f"engines-{shape}-p{args.prompt}-n{args.new}"
    reference = compute_reference(model, work, args.eval_samples, 1800, generation=workload)
    measure = MeasureSettings(window_min_s=args.window, window_max_s=4 * args.window, screen_s=0.0)
    ctx = TrialContext(machine, reference, measure, Path("studies") / ".cache", runtimes=discover_runtimes())
    types = [t for t in args.types.split(",") if t]
    console.print(
        f"{machine.cpu_model}, {cores} cores; {described}; "
        f"prompt {args.prompt}, {args.new} new tokens; 1 instance x {cores} threads",
        markup=False,
    )
    winners: dict[int, tuple[str, TrialConfig]] = {}
    for best_file in args.best:
        best = json.loads(Path(best_file).read_text())
        generation = best["job"]["generation"]
        if (generation["prompt_tokens"], generation["new_tokens"]) != (args.prompt, args.new):
            parser.error(
                f"{best_file} was tuned for prompt {generation['prompt_tokens']}, {generation['new_tokens']} new"
            )
        winner = TrialConfig.from_json(best["config"])
        winners[winner.total_batch] = (best_file, winner)
    # like autotune's llama.cpp trials, the tool runs without the extra weight buffers where the build has AMX
    # (their AMX kernels crash llama_decode); elsewhere both run with them
    repack = not types or AMX_BUILD not in LlamaCppGenerator.system_info()
    rows: list[dict] = []
    failures: list[dict] = []  # a tool's runs that crashed: no row, said in the results file
    for sequences in (int(s) for s in args.sequences.split(",")):
        configs = {"autotune eager fp32": TrialConfig("eager", "fp32", sequences, threads_per_instance=cores)}
        if (
            not args.no_recipe
        ):  # the seed's recipe applied by hand (as docs/benchmarks/generation_precisions.py runs it)
            recipe = {"kv_cache": "static", "max_autotune": True, "cpp_wrapper": True, "concat_linear": True}
            configs["autotune inductor da8w8 recipe"] = TrialConfig(
                "inductor", "da8w8", sequences, threads_per_instance=cores, options={**recipe, "freezing": True}
            )
        if sequences in winners:
            configs["autotune search winner"] = winners[sequences][1]
        options = {"n_batch": 2048, "n_ubatch": 512, "flash_attn": True, "kv_cache_type": "f16"}
        for gguf_type in types:
            configs[f"autotune llamacpp {gguf_type}"] = TrialConfig(
                "llamacpp", gguf_type, sequences, threads_per_instance=cores, options=options
            )
        ov_types = [t for t in args.openvino_types.split(",") if t]
        for ov_type in ov_types:
            configs[f"autotune openvino {ov_type}"] = TrialConfig(
                "openvino", ov_type, sequences, threads_per_instance=cores, options=openvino_row_options()
            )
        for ipex_type in (t for t in args.ipex_types.split(",") if t):  # no tool of its own: IPEX's examples
            configs[f"autotune ipex {ipex_type}"] = TrialConfig(  # time the same patched `generate`
                "ipex", ipex_type, sequences, threads_per_instance=cores, options=IPEX_OPTIONS, runtime="ipex"
            )
        runs: dict[str, list[float]] = {name: [] for name in configs}
        tool_runs: dict[str, list[dict]] = {gguf_type: [] for gguf_type in types}
        genai_runs: dict[str, list[dict]] = {ov_type: [] for ov_type in ov_types}
        winner_file_runs: list[dict] = []  # the tool on the search winner's own file (a mix's included)
        drift: dict[str, dict] = {}
        mixes: dict[str, dict] = {}
        files: dict[str, Path] = {}
        for repeat in range(args.repeats):
            for name, config in configs.items():
                run_dir = work / "runs" / f"s{sequences}-{repeat}-{name.replace(' ', '_')}"
                try:
                    metrics = run_config(config, ctx, run_dir, 3600)[0]
                except TrialFailed as exc:
                    console.print(f"{sequences} seq. {name}: FAILED {exc.cause}", markup=False)
                    continue
                runs[name].append(metrics.throughput_sps)
                drift[name] = drift_fields(metrics.drift)
                mixes[name] = mix_fields(metrics)
                if name == "autotune search winner":  # its file may be a mix: never a whole type's tool row
                    measured_file = winner_file_tool(metrics, config, args, sequences, cores, tool, repack, machine)
                    if measured_file:
                        winner_file_runs.append(measured_file)
                        console.print(
                            f"{sequences} seq. repeat {repeat + 1} {measured_file['tool']} on the winner's file: "
                            f"{measured_file['generated_tokens_per_s']:.1f} tokens/s",
                            markup=False,
                        )
                elif metrics.artifact:
                    files[config.precision] = Path(metrics.artifact.dir) / "model.gguf"
                if config.backend == "openvino" and metrics.artifact and name != "autotune search winner":
                    same = str(config.options["inference_precision"])  # the plugin's default: the tool's numerics
                    measured = genai_bench(Path(metrics.artifact.dir), args.prompt, args.new, sequences, cores, same)
                    genai_runs[config.precision].append(measured)
                    console.print(
                        f"{sequences} seq. repeat {repeat + 1} openvino-genai {config.precision}: "
                        f"{measured['generated_tokens_per_s']:.1f} tokens/s",
                        markup=False,
                    )
                console.print(
                    f"{sequences} seq. repeat {repeat + 1} {name}: {metrics.throughput_sps:.1f} tokens/s"
                    f"{metrics.noisy_note()}",
                    markup=False,
                )
                if config.backend == "llamacpp" and config.precision in files and name != "autotune search winner":
                    try:
                        pin = pin_prefix(config.instance_cpus(machine)[0], machine)  # where the trial ran
                        measured = batched_bench(
                            tool, files[config.precision], args.prompt, args.new, sequences, cores, repack, pin
                        )
                    except RuntimeError as exc:
                        failures.append({"sequences": sequences, "row": f"llama-batched-bench {config.precision}"})
                        failures[-1]["failed"] = str(exc)
                        console.print(f"{sequences} seq. llama-batched-bench {config.precision}: {exc}", markup=False)
                        continue
                    tool_runs[config.precision].append(measured)
                    console.print(
                        f"{sequences} seq. repeat {repeat + 1} llama-batched-bench {config.precision}: "
                        f"{measured['generated_tokens_per_s']:.1f} tokens/s",
                        markup=False,
                    )
        base = statistics.median(runs["autotune eager fp32"]) if runs["autotune eager fp32"] else None
        for name, values in runs.items():
            if values:
                rows.append(
                    {
                        "sequences": sequences,
                        "row": name,
                        "tokens_per_s": statistics.median(values),
                        "runs": values,
                        "vs_eager_fp32": statistics.median(values) / base if base else None,
                        **drift.get(name, {}),
                        **mixes.get(name, {}),
                        **(
                            {"file": str(files[configs[name].precision])}
                            if name.startswith("autotune llamacpp")
                            else {}
                        ),
                        **(
                            {"config": configs[name].to_json(), "best_json": winners[sequences][0]}
                            if name == "autotune search winner"
                            else {}
                        ),
                    }
                )
        if winner_file_runs:
            name = f"{WINNER_FILE_ROW} ({winner_file_runs[0]['tool']})"
            same_file = {**drift.get("autotune search winner", {}), **mixes.get("autotune search winner", {})}
            rows.append(tool_runs_row(sequences, name, winner_file_runs, base, same_file, ()))
        tool_sets = (
            ("llama-batched-bench", "autotune llamacpp", tool_runs, ("speed_pp", "speed_tg")),
            ("openvino-genai", "autotune openvino", genai_runs, ("ttft_ms", "tpot_ms")),
        )
        for tool_name, autotune_row, by_type, kept in tool_sets:
            for file_type, measured in by_type.items():
                if measured:
                    same_file = drift.get(f"{autotune_row} {file_type}", {})
                    rows.append(tool_runs_row(sequences, f"{tool_name} {file_type}", measured, base, same_file, kept))
    table = Table(title=f"generated tokens/s, medians of {args.repeats} interleaved run(s)")
    drift_columns = ("KLD", "same top", "ppl +", "rel. L2")
    for column in ("sequences", "row", "tokens/s", "vs eager fp32", "autotune / tool", "mix", *drift_columns):
        table.add_column(column, justify="left" if column == "row" else "right")
    by_name = {(r["sequences"], r["row"]): r for r in rows}
    for row in rows:
        ratio = ""
        tools = {"autotune llamacpp": "llama-batched-bench ", "autotune openvino": "openvino-genai "}
        prefix = " ".join(row["row"].split()[:2])
        if prefix in tools:
            tool_row = by_name.get((row["sequences"], tools[prefix] + row["row"].split()[-1]))
            ratio = f"{row['tokens_per_s'] / tool_row['tokens_per_s']:.3f}" if tool_row else ""
        bounded = row.get(f"drift_{metric}")
        mark = " PAST" if bounded is not None and bounded > args.max_drift else ""
        table.add_row(
            str(row["sequences"]),
            row["row"] + mark,
            f"{row['tokens_per_s']:.1f}",
            f"{row['vs_eager_fp32']:.2f}x" if row["vs_eager_fp32"] else "-",
            ratio,
            "-" if row.get("compressed_share") is None else f"{row['compressed_share']} {row['kept_type']}",
            *(
                "-" if row.get(key) is None else f"{row[key]:.3g}"
                for key in ("drift_kld", "drift_same_top", "drift_perplexity_increase", "drift_relative_l2")
            ),
        )
    console.print(table)
    summary = targets(rows, args.max_drift, metric, args.target)
    for line in summary:
        console.print(line["text"], markup=False)
    for failure in failures:
        console.print(f"{failure['sequences']} seq. {failure['row']} failed: {failure['failed']}", markup=False)
    from results import write_results

    out = write_results(
        "engines",
        "llama.cpp and OpenVINO through autotune against llama-batched-bench and OpenVINO GenAI's benchmark, on the "
        "same files",
        {
            "model": args.model,
            **({"layers": args.layers} if args.model == "decoder" else {}),
            "prompt": args.prompt,
            "new": args.new,
        }
        | ({"data": args.data} if args.data else {}),
        rows,
        args.out,
        drift_bound={"metric": metric, "max": args.max_drift},
        targets=summary,
        tool_target=args.target,
        failed_tool_runs=failures,
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

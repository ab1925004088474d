"""Text generation side by side: fp32 eager against every precision this machine's torchao runs, on a
decoder of realistic shape (a Llama config, random init), through autotune's protocol (fresh pinned
processes, warm-up, stop rule, token stamps), interleaved so slow drifts of a shared machine hit all.

    .venv/bin/python docs/benchmarks/generation_precisions.py [--layers 8] [--prompt 512] [--new 64] [--repeats 2]
        [--best B]

--best adds the winner of a search on the same decoder (autotune search --model
docs/benchmarks/decoders.py:decoder --task generate ...), to set it beside the hand-applied recipe.

The model factory is docs/benchmarks/decoders.py:decoder (hidden 768, 12 heads, MLP 2048, vocabulary 32000).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PINNED = "granularity=fine,compact,1,0"  # Intel OpenMP's KMP_AFFINITY as the search space lists it


def perplexity_table() -> int:
    """Held-out perplexity of a decoder that learned real text, fp32 and each precision this torchao runs
    (random weights make perplexity meaningless, so the 100M decoder's drift columns are logits only)."""
    import tempfile

    import torch
    from rich.console import Console
    from rich.table import Table
    from transformers import LlamaForCausalLM

    from autotune.backends.generation import PRECISIONS, apply_precision, unavailable_precisions

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from tiny_lm import llama_config, train_llama

    trained = train_llama(Path(tempfile.mkdtemp()))
    held_out = torch.tensor(list(Path(trained["text"]).read_bytes()))
    ids = held_out[: 32 * 64].reshape(-1, 64)
    calibration = torch.tensor(list(Path(trained["text"]).read_bytes())[-4 * 64 :]).reshape(4, 64)
    unavailable = unavailable_precisions()
    table = Table(title="tiny Llama (2 layers, hidden 64) trained on stdlib docstrings: held-out byte perplexity")
    for column in ("precision", "perplexity", "change vs fp32"):
        table.add_column(column)
    reference = None
    for precision in PRECISIONS:
        if precision in unavailable:
            table.add_row(precision, "left out", unavailable[precision][:60])
            continue
        model = LlamaForCausalLM(llama_config())
        model.load_state_dict(torch.load(trained["weights"], weights_only=True))
        options = {"group_size": 32, "alpha": 0.5, "activations": "bf16"}  # the space's first activations
        apply_precision(model.eval(), precision, options, calibration)
        with torch.no_grad():
            value = float(torch.exp(model(input_ids=ids, labels=ids).loss.float()))
        reference = reference or value
        table.add_row(precision, f"{value:.3f}", f"{value / reference - 1:+.2%}")
    Console(width=120).print(table)
    return 0


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from autotune.common.errors import TrialFailed
    from autotune.machine.generation_probe import generation_precisions_unavailable
    from autotune.machine.probe import probe_machine
    from autotune.machine.runtimes import discover_runtimes
    from autotune.measure.stopwatch import MeasureSettings
    from autotune.model.generation import GenerationWorkload
    from autotune.model.sources import resolve_model
    from autotune.records.config import TrialConfig, clean_environment
    from autotune.runner.trials import TrialContext, compute_reference, run_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--sequences", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--window", type=float, default=10.0, help="minimum timed window per run, seconds")
    parser.add_argument("--only", help="comma-separated row names to run (default: all)")
    parser.add_argument(
        "--perplexity",
        action="store_true",
        help="instead: perplexity per precision of the tiny Llama the tests train on standard-library docstrings",
    )
    parser.add_argument("--best", help="a best.json of a search on this decoder: its winner becomes a row")
    parser.add_argument("--out", help="results file (default docs/results/generation-precisions-<today>.json)")
    args = parser.parse_args()
    if args.perplexity:
        return perplexity_table()
    os.environ["BENCH_LAYERS"] = str(args.layers)

    console = Console(width=170)
    machine = probe_machine()
    runtimes = discover_runtimes()
    cores = machine.physical_cores
    workload = GenerationWorkload(args.prompt, args.new, 32000, 2048)
    factory = Path(__file__).resolve().parent / "decoders.py"
    model = resolve_model(f"{factory}:decoder", None, f"input_ids:int64:{args.prompt}:0-32000")
    work = Path("studies") / "benchmarks" / f"generation-l{args.layers}-p{args.prompt}-n{args.new}"
    reference = compute_reference(model, work, 4, 1800, generation=workload)
    measure = MeasureSettings(window_min_s=args.window, window_max_s=4 * args.window, screen_s=0.0)
    ctx = TrialContext(machine, reference, measure, Path("studies") / ".cache", runtimes=runtimes)
    unavailable = generation_precisions_unavailable(runtimes["main"], clean_environment(dict(os.environ)))
    rows = {
        "eager fp32": TrialConfig("eager", "fp32", args.sequences, threads_per_instance=cores),
        "eager bf16": TrialConfig("eager", "bf16", args.sequences, threads_per_instance=cores),
        "eager da8w8": TrialConfig("eager", "da8w8", args.sequences, threads_per_instance=cores),
        "eager smoothquant_int8": TrialConfig(
            "eager", "smoothquant_int8", args.sequences, threads_per_instance=cores, options={"alpha": 0.5}
        ),
    }
    # Weight-only int8/int4 take their activations in bf16 (the space's first, A16W8 / A16W4) or fp32.
    for activations in ("bf16", "fp32"):
        for precision in ("woq_int8", "woq_int4"):
            options = {"activations": activations, **({"group_size": 128} if precision == "woq_int4" else {})}
            rows[f"eager {precision} {activations} activations"] = TrialConfig(
                "eager", precision, args.sequences, threads_per_instance=cores, options=options
            )
    # What the coverage round compiles: static cache and freezing (the space's first values).
    compiled = [("bf16", None)] + [(p, a) for p in ("woq_int8", "woq_int4") for a in ("bf16", "fp32")]
    for precision, activations in compiled:
        options: dict = {"kv_cache": "static", "freezing": True}
        options |= {"activations": activations} if activations else {}
        options |= {"group_size": 128} if precision == "woq_int4" else {}
        name = f"inductor {precision} freezing" + (f" {activations} activations" if activations else "")
        rows[name] = TrialConfig("inductor", precision, args.sequences, threads_per_instance=cores, options=options)
    rows |= {
        # The recipe of PyTorch's quantized-LLM-on-Xeon write-up, applied by hand: DA8W8, max-autotune,
        # C++ wrapper, concatenated linears, freezing, one instance on all cores.
        "inductor da8w8 recipe": TrialConfig(
            "inductor",
            "da8w8",
            args.sequences,
            threads_per_instance=cores,
            options={
                "kv_cache": "static",
                "max_autotune": True,
                "cpp_wrapper": True,
                "concat_linear": True,
                "freezing": True,
            },
        ),
    }
    # What the coverage round measures (the space's first values: static cache, no inductor flags, glibc,
    # GNU OpenMP) against freezing, and against a tuned process (tcmalloc, Intel OpenMP), one at a time.
    tuned_process = {"allocator": "tcmalloc", "openmp": "intel", "kmp_blocktime": 0, "kmp_affinity": PINNED}
    for label, freezing, process in (
        ("inductor da8w8", False, {}),
        ("inductor da8w8 freezing", True, {}),
        ("inductor da8w8 tcmalloc iomp", False, tuned_process),
        ("inductor da8w8 freezing tcmalloc iomp", True, tuned_process),
    ):
        options = {"kv_cache": "static", "freezing": freezing}
        rows[label] = TrialConfig(
            "inductor", "da8w8", args.sequences, threads_per_instance=cores, options=options, **process
        )
    if args.best:
        import json

        best = json.loads(Path(args.best).read_text())
        generation = best["job"]["generation"]
        if (generation["prompt_tokens"], generation["new_tokens"]) != (args.prompt, args.new):
            parser.error(
                f"{args.best} was tuned for prompt {generation['prompt_tokens']}, {generation['new_tokens']} new"
            )
        rows["search winner"] = TrialConfig.from_json(best["config"])
    if args.only:
        rows = {name: rows[name] for name in args.only.split(",")}
    for name, config in list(rows.items()):
        if config.precision in unavailable:
            console.print(f"{name}: left out, {unavailable[config.precision]}", markup=False)
            del rows[name]
    console.print(
        f"{machine.cpu_model}, {cores} cores; Llama {args.layers} layers hidden 768 vocab 32000 (random init); "
        f"prompt {args.prompt}, {args.new} new tokens, {args.sequences} sequence(s), 1 instance x {cores} threads",
        markup=False,
    )
    results: dict[str, list] = {name: [] for name in rows}
    for repeat in range(args.repeats):
        for name, config in rows.items():
            try:
                metrics = run_config(config, ctx, work / "runs" / f"{repeat}-{name.replace(' ', '_')}", 3600)[0]
            except TrialFailed as exc:
                console.print(f"{name}: FAILED {exc.cause}", markup=False)
                continue
            results[name].append(metrics)
            generation = metrics.generation
            timing = (
                f", TTFT p50 {generation.ttft_ms.p50:.0f} ms, TPOT p50 {generation.tpot_ms.p50:.1f} ms"
                if generation and generation.ttft_ms.p50 and generation.tpot_ms.p50
                else ""
            )
            console.print(
                f"repeat {repeat + 1} {name}: {metrics.throughput_sps:.2f} tokens/s{timing}{metrics.noisy_note()}",
                markup=False,
            )
    table = Table(title=f"generation, medians of {args.repeats} interleaved run(s) (clean and noisy alike, flagged)")
    columns = ("config", "tokens/s", "vs fp32", "TTFT p50 ms", "TPOT p50 ms", "TPOT p99 ms", "peak RSS MiB")
    extra = ("weights MiB", "quantize s", "first call s", "logits rel. L2", "greedy agree", "noisy runs")
    for column in (*columns, *extra):
        table.add_column(column, justify="left" if column == "config" else "right")
    base = (
        statistics.median(m.throughput_sps for m in results.get("eager fp32", []))
        if results.get("eager fp32")
        else None
    )
    for name, runs in results.items():
        if not runs:
            continue
        gen = [m.generation for m in runs]
        tps = statistics.median(m.throughput_sps for m in runs)
        drift = runs[0].drift
        table.add_row(
            name,
            f"{tps:.2f}",
            f"{tps / base:.2f}x" if base else "-",
            f"{statistics.median(g.ttft_ms.p50 for g in gen):.0f}",
            f"{statistics.median(g.tpot_ms.p50 for g in gen):.1f}",
            f"{statistics.median(g.tpot_ms.p99 or float('nan') for g in gen):.1f}",
            f"{statistics.median(m.peak_rss_mib or 0 for m in runs):.0f}",
            f"{(gen[0].weight_bytes or 0) / 2**20:.0f}",
            f"{statistics.median(g.quantize_s or 0.0 for g in gen):.1f}",
            f"{statistics.median(m.first_call_s or 0.0 for m in runs):.1f}",  # compiles, for inductor
            f"{drift.relative_l2:.2e}" if drift else "-",
            f"{drift.greedy_agreement:.2f}" if drift and drift.greedy_agreement is not None else "-",
            f"{sum(not m.valid for m in runs)}/{len(runs)}",
        )
    console.print(table)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import write_results

    written = []
    for name, runs in results.items():
        if not runs:
            continue
        tps = statistics.median(m.throughput_sps for m in runs)
        drift = runs[0].drift
        written.append(
            {
                "sequences": args.sequences,
                "row": f"autotune search winner ({rows[name].summary()})" if name == "search winner" else name,
                "tokens_per_s": tps,
                "runs": [round(m.throughput_sps, 3) for m in runs],
                "clean_runs": sum(m.valid for m in runs),
                "vs_eager_fp32": round(tps / base, 3) if base else None,
                "ttft_p50_ms": statistics.median(m.generation.ttft_ms.p50 for m in runs if m.generation),
                "tpot_p50_ms": statistics.median(m.generation.tpot_ms.p50 for m in runs if m.generation),
                "drift_relative_l2": drift.relative_l2 if drift else None,
            }
        )
    out = write_results(
        "generation-precisions",
        "Text generation in PyTorch: eager fp32 against every precision torchao runs here",
        {"model": f"Llama {args.layers} layers, hidden 768 (random init)", "prompt": args.prompt, "new": args.new},
        written,
        args.out,
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

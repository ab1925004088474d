"""Language-model servers under load, at their defaults and with server settings changed, on the same files:
the highest Poisson request rate each sustains within p99 bounds on TTFT and TPOT, by autotune's load
generator (vLLM bench serve's conventions: scheduled arrivals, TTFT from the arrival, TPOT over the tokens
after the first) and rate search (autotune/measure/llm_serving.py).

Rows, interleaved per round (each round runs every row once, in the same order):
- llama-server at its defaults (`-np` auto: 4 slots, one KV cache shared by them; `-c` sized for 4 of the
  mix's longest requests, since the default is the model's training context), on the Q8_0 GGUF;
- llama-server with --slots N and one KV cache shared by them (`-kvu`, as the default's), for N of the
  longest requests;
- OpenVINO GenAI's ContinuousBatchingPipeline at its default SchedulerConfig and CPU plugin properties (but
  the threads), on the int8_asym IR;
- the same with --genai-max-seqs and --genai-batched-tokens;
- GenAI's defaults in --genai-pipelines pipelines behind the one arrival stream, each in its own process pinned
  to its share of the cores (autotune/backends/openvino/serving.py's GenAiServerPool, server_instances);
- PyTorch eager in fp32, static batches of --pytorch-batch requests (autotune/backends/generation/
  static_server.py: a batch starts when none runs and decodes until its longest output ends), the baseline
  continuous batching is measured against;
- per --best (a best.json of `autotune search --task generate` on the same folder: a server search's, or an
  offline one's, whose fixed-batch winner is then served as it is, its sequences at once): its winner, its
  file served as its trial served it (autotune/worker/llm_serve.py's serve_trial: the trial's engine,
  settings and sequences at once), its drift from best.json.

The model: a Hugging Face folder (default: the one docs/benchmarks/trained_llm.py trains). Each row's files
are the ones the offline search measures (llama.cpp's converter for Q8_0, optimum-cli and NNCF for
int8_asym); their KL divergence from FP32 is the offline rows' (trained_llm.py), not measured here.

    .venv/bin/python docs/benchmarks/llm_serving.py [--model FOLDER] [--prompt 256] [--new 64] [--range 0.5]
        [--ttft-ms 1000] [--tpot-ms 50] [--slots 8] [--genai-max-seqs 8] [--genai-batched-tokens 512]
        [--pytorch-batch 8] [--best studies/S/best.json ...] [--rows llama-defaults,genai-defaults,pytorch,best]

Writes docs/results/llm-serving-<date>.json (machine, commit, command, request mix, bounds, every probe).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "studies" / "benchmarks" / "trained-llama" / "model"
ROWS = ("llama-defaults", "llama-tuned", "genai-defaults", "genai-tuned", "genai-pool", "pytorch", "best")


def build_files(folder: Path, out: Path, threads: int) -> tuple[Path, Path]:
    """The folder's Q8_0 GGUF and int8_asym IR, as the offline search's artifacts are built."""
    from transformers import AutoModelForCausalLM

    from autotune.backends import backend_module
    from autotune.backends.llamacpp import gguf_export
    from autotune.records.config import TrialConfig

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    gguf = out / "model-Q8_0.gguf"
    if not gguf.exists():
        gguf_export.convert(model, "Q8_0", gguf)
    ir = out / "ir-int8_asym"
    if not (ir / "openvino_model.xml").exists():
        ir.mkdir(parents=True, exist_ok=True)
        config = TrialConfig("openvino", "int8_asym", batch_size=1, threads_per_instance=threads)
        backend_module("openvino", "generate").build_artifact(model, None, config, ir)
    return gguf, ir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="a Hugging Face folder with its tokenizer")
    parser.add_argument("--prompt", type=int, default=256, help="mean prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="mean output tokens")
    parser.add_argument("--range", type=float, default=0.5, help="lengths uniform within +-this share")
    parser.add_argument("--ttft-ms", type=float, default=1000.0)
    parser.add_argument("--tpot-ms", type=float, default=50.0)
    parser.add_argument("--quantile", type=int, default=99, choices=(90, 99))
    parser.add_argument("--slots", type=int, default=8, help="llama-server's tuned row: -np")
    parser.add_argument("--genai-max-seqs", type=int, default=8)
    parser.add_argument("--genai-batched-tokens", type=int, default=512)
    parser.add_argument("--genai-pipelines", type=int, default=2, help="the genai-pool row's pipelines")
    parser.add_argument("--pytorch-batch", type=int, default=8, help="PyTorch's static batches (0: no such row)")
    parser.add_argument(
        "--best", action="append", default=[], help="a search's best.json on this folder: its winner as a row"
    )
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"which rows, comma-separated, of {', '.join(ROWS)} (best: each --best)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--minutes-per-row", type=float, default=6.0)
    parser.add_argument("--out")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        parser.error(f"--model {folder} is not a Hugging Face folder (no config.json): trained_llm.py trains one")

    import json

    from autotune.backends.llamacpp.server import LlamaServer, LlamaServerSettings
    from autotune.backends.openvino.serving import SchedulerSettings, default_scheduler, open_genai_server
    from autotune.machine.probe import probe_machine
    from autotune.measure.llm_load import RequestMix
    from autotune.measure.llm_serving import LatencyBounds, ServingPlan
    from autotune.worker.llm_serve import measure_server

    threads = probe_machine().physical_cores
    vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    mix = RequestMix(args.prompt, args.new, args.range)
    bounds = LatencyBounds(args.ttft_ms, args.tpot_ms, args.quantile)
    plan = ServingPlan(mix, bounds)
    work = ROOT / "studies" / "benchmarks" / "llm-serving"
    work.mkdir(parents=True, exist_ok=True)
    gguf, ir = build_files(folder, work, threads)
    console = Console()

    def llama_row(slots: int) -> dict[str, Any]:
        shown = slots or 4  # -np -1: llama-server's auto, 4 slots
        # an explicit -np makes one KV cache per slot; -kvu keeps the default's one shared cache, so the rows
        # differ in their slots alone
        settings = LlamaServerSettings(
            slots=slots, context=shown * mix.longest_request, threads=threads, unified_kv=True if slots else None
        )
        with (
            tempfile.TemporaryDirectory(prefix="llama-server-") as scratch,
            LlamaServer(gguf, settings, Path(scratch)) as server,
        ):
            metrics = measure_server(server, True, plan, vocab, shown, time.monotonic() + 60 * args.minutes_per_row)
            command = server.described().replace(scratch, "<trial folder>")
        return {
            "engine": "llama-server",
            "file": "Q8_0",
            "settings": settings.to_json(),
            "command": command,
            "metrics": metrics,
        }

    def genai_row(scheduler: SchedulerSettings, pipelines: int = 1) -> dict[str, Any]:
        deadline = time.monotonic() + 60 * args.minutes_per_row
        settings = {**scheduler.to_json(), "pipelines": pipelines}
        with open_genai_server(ir, {"INFERENCE_NUM_THREADS": threads}, scheduler, pipelines, threads) as server:
            metrics = measure_server(server, False, plan, vocab, scheduler.max_num_seqs * pipelines, deadline)
        return {"engine": server.engine, "file": "int8_asym", "settings": settings, "metrics": metrics}

    def pytorch_row(batch: int) -> dict[str, Any]:
        """PyTorch eager fp32, static batches: the fixed-batch path served as model.generate serves."""
        import torch
        from transformers import AutoModelForCausalLM

        from autotune.backends.generation import prepare
        from autotune.records.config import TrialConfig

        torch.set_num_threads(threads)  # the cores the other rows' engines use, not every logical CPU
        config = TrialConfig("eager", "fp32", batch_size=batch, threads_per_instance=threads)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        generator, _ = prepare(model, config, args.new, None, None)
        with generator.open_server(batch, 0, work) as (server, _):
            deadline = time.monotonic() + 60 * args.minutes_per_row
            metrics = measure_server(server, False, plan, vocab, batch, deadline)
        return {"engine": server.engine, "file": "fp32", "settings": config.to_json(), "metrics": metrics}

    def winner_row(best_path: Path) -> dict[str, Any]:
        """The search's winner, served as its trial served it: the same generator, its own server."""
        from transformers import AutoModelForCausalLM

        from autotune.backends.generation import cached_artifact, prepare
        from autotune.records.config import TrialConfig
        from autotune.worker.llm_serve import serve_trial

        best = json.loads(best_path.read_text())
        config = TrialConfig.from_json(best["config"])
        artifact = cached_artifact(best["job"]["artifact_dir"], config.backend)
        if artifact is None:
            raise RuntimeError(f"the winner's file in {best['job']['artifact_dir']} is gone: run the search again")
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        generator, _ = prepare(model, config, args.new, None, artifact)
        metrics = serve_trial(plan, config, generator, vocab, 1, time.monotonic() + 60 * args.minutes_per_row)
        drift = best.get("drift") or {}
        return {
            "engine": config.backend,
            "file": config.precision,
            "settings": config.to_json(),
            "drift": drift,
            "metrics": metrics,
        }

    defaults = default_scheduler()
    tuned = SchedulerSettings(max_num_seqs=args.genai_max_seqs, max_num_batched_tokens=args.genai_batched_tokens)
    wanted = set(args.rows.split(","))
    if wanted - set(ROWS):
        parser.error(f"--rows: unknown {', '.join(sorted(wanted - set(ROWS)))}; choose from {', '.join(ROWS)}")
    keyed = [
        ("llama-defaults", "llama-server defaults (-np auto)", lambda: llama_row(0)),
        ("llama-tuned", f"llama-server -np {args.slots} -kvu", lambda: llama_row(args.slots)),
        ("genai-defaults", "GenAI defaults", lambda: genai_row(defaults)),
        (
            "genai-tuned",
            f"GenAI max_num_seqs {tuned.max_num_seqs}, max_num_batched_tokens {tuned.max_num_batched_tokens}",
            lambda: genai_row(tuned),
        ),
        (
            "genai-pool",
            f"GenAI defaults, {args.genai_pipelines} pipelines pinned apart",
            lambda: genai_row(defaults, args.genai_pipelines),
        ),
    ]
    plans = [(name, run) for key, name, run in keyed if key in wanted]
    if args.pytorch_batch and "pytorch" in wanted:
        plans.append(
            (f"PyTorch eager fp32, static batches of {args.pytorch_batch}", lambda: pytorch_row(args.pytorch_batch))
        )
    for best in args.best if "best" in wanted else []:
        study = Path(best).parent.name
        plans.append((f"autotune winner of study {study}", lambda best=best: winner_row(Path(best))))
    rows: list[dict[str, Any]] = []
    for round_number in range(args.rounds):
        for name, run in plans:
            console.print(f"round {round_number + 1}: {name} ...", markup=False)
            try:
                row = run()
            except Exception as failure:  # one engine's failure is a row of its own; the others still run
                rows.append({"row": name, "round": round_number + 1, "failed": str(failure)[:500]})
                continue
            metrics = row.pop("metrics")
            at = metrics.at_sustained
            rows.append(
                {
                    "row": name,
                    "round": round_number + 1,
                    **row,
                    "sustained_rps": metrics.sustained_rps,
                    "saturated_rps": metrics.saturated_rps,
                    "verdict": metrics.verdict,
                    "ttft_p99_ms": at.load.ttft_ms.p99 if at else None,
                    "tpot_p99_ms": at.load.tpot_ms.p99 if at else None,
                    "goodput_rps": at.load.goodput_rps if at else None,
                    "probes": [p.to_json() for p in metrics.probes],
                }
            )
    best_default = max((r.get("sustained_rps") or 0.0 for r in rows if "defaults" in r["row"]), default=0.0)
    table = Table(title=f"sustained requests/s within {bounds.describe()} ({threads} cores)")
    for column in (
        "row",
        "round",
        "sustained req/s",
        "saturated req/s",
        "TTFT p99 ms",
        "TPOT p99 ms",
        "vs best default",
        "verdict",
    ):
        table.add_column(column)
    for row in rows:
        if "failed" in row:
            table.add_row(row["row"], str(row["round"]), "failed", "", "", "", "", row["failed"][:80])
            continue
        ratio = row["sustained_rps"] / best_default if best_default else None
        row["value"], row["vs_baseline"] = row["sustained_rps"], round(ratio, 3) if ratio else None
        cells = [row["sustained_rps"], row["saturated_rps"], row["ttft_p99_ms"], row["tpot_p99_ms"], ratio]
        table.add_row(row["row"], str(row["round"]), *("-" if c is None else f"{c:.3g}" for c in cells), row["verdict"])
    console.print(table)
    from results import write_results

    out = write_results(
        "llm-serving",
        "language-model servers under Poisson load at their defaults and tuned: highest rate within p99 TTFT and TPOT",
        {
            "model": str(folder),
            "mix": mix.to_json(),
            "bounds": bounds.to_json(),
            "threads": threads,
            "files": {"llama-server": "Q8_0", "genai": "int8_asym"},
        },
        rows,
        args.out,
        unit="requests/s sustained",
        ratio_to="the best engine at its defaults",
        probe_rule="every request completed, backlog steady, the quantile within its bound (measure/llm_serving.py)",
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""guidellm, an independent load generator, beside autotune's own on the command `autotune export --format
llama-server` writes for a server study: at the rate the study's llama.cpp trial sustained, do both measure
the same p99 TTFT and TPOT?

The exported `llama-server.sh` is started once, on a loopback port; then, per round, the same offered load from
each side in turn: autotune's load generator (autotune/measure/llm_server_loop.py's drive_streaming, seeded
Poisson arrivals, token ids to llama-server's `/completion`), then guidellm 0.8.1 (`guidellm run`, its Poisson
profile at the same rate and request count, synthetic text of the same token counts through the model's own
tokenizer, OpenAI `/v1/completions`; guidellm asks for exactly the output tokens, `ignore_eos`, and the
output tokens it counted are recorded). Both count TTFT from when a request is due (guidellm:
from when it was sent; its dispatch delay is shown) and TPOT as the mean gap between a request's tokens after
the first (guidellm's `inter_token_latency_ms`; its own `time_per_output_token_ms` includes the TTFT). Lengths
are fixed (no spread) on both sides, since guidellm draws lengths from a normal distribution and autotune from
a uniform one. Each side's p99 is its own (what a user of either reads).

    make guidellm   # the overlay guidellm runs from (.venv/share/guidellm)
    .venv/bin/python docs/benchmarks/guidellm_check.py --study serve-trained \
        --studies-dir studies/benchmarks/trained-llama/studies [--model FOLDER] [--rate R] [--rounds 3]

Writes docs/results/guidellm-check-<date>.json (machine, commit, command, the exported command, every round).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "studies" / "benchmarks" / "trained-llama" / "model"
GUIDELLM = ROOT / ".venv" / "share" / "guidellm"
TARGET = 0.10  # guidellm's p99s within 10% of autotune's
MEASURES = {"ttft_p99_ms": "TTFT p99", "tpot_p99_ms": "TPOT p99", "ttft_p50_ms": "TTFT p50", "tpot_p50_ms": "TPOT p50"}
STARTUP_S = 120.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="a server study (autotune search --scenario server)")
    parser.add_argument("--studies-dir", default="studies")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="the study's Hugging Face folder (tokenizer)")
    parser.add_argument("--rate", type=float, help="requests/s offered (default: the exported trial's sustained)")
    parser.add_argument("--requests", type=int, help="requests per side and round (default: a server probe's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    return parser


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the exported llama-server exited {process.returncode}: {log.read_text()[-800:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the exported llama-server was not ready within {STARTUP_S:.0f}s: {log.read_text()[-800:]}")


def guidellm_round(url: str, model: Path, rate: float, count: int, prompt: int, new: int, work: Path) -> dict[str, Any]:
    """One guidellm run at `rate`; its p50 and p99 of TTFT and ITL, and what it completed."""
    out = work / f"guidellm-{time.monotonic_ns()}.json"
    scenario = {
        "spec": {
            "backend": {"kind": "openai_http", "target": url, "model": str(model), "request_format": "/v1/completions"},
            "profile": {"kind": "poisson", "rate": rate},
            "data": [{"kind": "synthetic_text", "prompt_tokens": prompt, "output_tokens": new}],
            "constraints": [{"kind": "max_requests", "count": count}],
            "outputs": [{"kind": "json", "path": str(out)}],
        }
    }
    path = work / "scenario.json"
    path.write_text(json.dumps(scenario))
    env = {**os.environ, "PYTHONPATH": str(GUIDELLM)}
    command = [sys.executable, "-m", "guidellm", "run", "--scenario", str(path), "--disable-console-interactive"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"guidellm failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]

    def pct(name: str, p: str) -> float:
        return float(metrics[name]["successful"]["percentiles"][p])

    return {
        "completed": int(metrics["request_totals"]["successful"]),
        "requests": int(metrics["request_totals"]["total"]),
        "ttft_p50_ms": pct("time_to_first_token_ms", "p50"),
        "ttft_p99_ms": pct("time_to_first_token_ms", "p99"),
        "tpot_p50_ms": pct("inter_token_latency_ms", "p50"),
        "tpot_p99_ms": pct("inter_token_latency_ms", "p99"),
        "dispatch_delay_p99_ms": 1e3 * pct("request_dispatch_delay", "p99")
        if "request_dispatch_delay" in metrics
        else None,
        "input_tokens_p50": pct("prompt_token_count", "p50"),
        "output_tokens_p50": pct("output_token_count", "p50"),  # exactly the tokens asked: ignore_eos held
        "command": " ".join(command[1:]),
    }


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    model = Path(args.model)
    if not (model / "config.json").is_file():
        parser.error(f"--model {model} is not a Hugging Face folder (no config.json): trained_llm.py trains one")
    if not (GUIDELLM / "VERSION").is_file():
        parser.error("guidellm is not installed: run `make guidellm` first")

    import numpy as np
    import optuna

    from autotune.backends.llamacpp.server import LlamaServer, LlamaServerSettings
    from autotune.measure.llm_load import RequestMix, arrival_offsets, random_prompts, summarize
    from autotune.measure.llm_server_loop import drive_streaming
    from autotune.measure.llm_serving import LatencyBounds, probe_requests
    from autotune.records.config import TrialConfig
    from autotune.records.spec import default_storage
    from autotune.results.engine_export import best_engine_trial

    studies = Path(args.studies_dir)
    study = optuna.load_study(study_name=args.study, storage=default_storage(studies, args.study))
    best = studies / args.study / "best.json"
    # the trial `autotune export` picks: at the winner's total sequences when best.json names one
    total = TrialConfig.from_json(json.loads(best.read_text())["config"]).total_batch if best.is_file() else None
    trial = best_engine_trial(study, "llama-server", total)
    if not trial.served_rps:
        parser.error(f"study {args.study}'s llama.cpp trial {trial.number} sustained no served rate: nothing to check")
    rate = args.rate or float(trial.served_rps)
    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    mix = RequestMix(trial.prompt_tokens, trial.new_tokens, 0.0)
    count = args.requests or probe_requests(rate, LatencyBounds(None, 1e9), 10.0, 60.0)
    console = Console()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="guidellm-check-") as scratch:
        work = Path(scratch)
        export = work / "export"
        where = ["--study", args.study, "--studies-dir", str(studies), "--format", "llama-server", "-o", str(export)]
        exported = subprocess.run(
            [sys.executable, "-m", "autotune.cli", "export", *where], capture_output=True, text=True
        )
        if exported.returncode != 0:
            raise SystemExit(f"autotune export failed: {exported.stderr.strip()}")
        script = export / "llama-server.sh"
        command = next(line for line in script.read_text().splitlines() if "$LLAMA_SERVER" in line and "&" in line)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = work / "llama-server.log"
        with open(log, "wb") as sink:
            server = subprocess.Popen(
                ["bash", str(script)],
                env={**os.environ, "PORT": str(port)},
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_healthy(url, server, log)
            # autotune's side as a client of the running server: no process of its own
            client = LlamaServer(export / "llama-server.gguf", LlamaServerSettings(), work, port=port)
            lengths, outputs = mix.lengths(count, args.seed)
            warm = random_prompts(lengths[:2], vocab, args.seed + 99)
            drive_streaming(client, np.zeros(2), warm, outputs[:2], give_up_s=600)
            for number in range(args.rounds):
                console.print(f"round {number + 1}: autotune at {rate:.2f} requests/s ...", markup=False)
                offsets = arrival_offsets(rate, count, args.seed + 104729 * (number + 1))
                prompts = random_prompts(lengths, vocab, args.seed + number + 1)
                timings = drive_streaming(client, offsets, prompts, outputs, give_up_s=float(offsets[-1]) + 120)
                load = summarize(timings)
                mine = {
                    "completed": load.completed,
                    "requests": load.requests,
                    "ttft_p50_ms": load.ttft_ms.p50,
                    "ttft_p99_ms": load.ttft_ms.p99,
                    "tpot_p50_ms": load.tpot_ms.p50,
                    "tpot_p99_ms": load.tpot_ms.p99,
                }
                console.print(f"round {number + 1}: guidellm at {rate:.2f} requests/s ...", markup=False)
                theirs = guidellm_round(url, model, rate, count, mix.prompt_tokens, mix.output_tokens, work)
                rounds.append({"round": number + 1, "autotune": mine, "guidellm": theirs})
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)

    rows: list[dict[str, Any]] = []
    verdicts: list[str] = []
    table = Table(title=f"p99s at {rate:.2f} requests/s on the exported llama-server ({count} requests a side)")
    for column in ("measure", "autotune (median of rounds)", "guidellm", "guidellm / autotune", "rounds"):
        table.add_column(column)
    for measure, shown in MEASURES.items():
        mine = [r["autotune"][measure] for r in rounds]
        theirs = [r["guidellm"][measure] for r in rounds]
        ours, their = median(mine), median(theirs)
        ratio = their / ours if ours else None
        rows.append({"row": f"{shown}, autotune", "value": ours, "runs": mine})
        rows.append({"row": f"{shown}, guidellm", "value": their, "runs": theirs, "vs_baseline": ratio})
        if measure.endswith("p99_ms"):
            met = ratio is not None and abs(ratio - 1) <= TARGET
            verdicts.append(f"{shown}: guidellm {their:.1f} ms, autotune {ours:.1f} ms ({'met' if met else 'missed'})")
        each = "; ".join(f"{a:.1f} / {b:.1f}" for a, b in zip(mine, theirs, strict=True))
        table.add_row(shown, f"{ours:.1f}", f"{their:.1f}", f"{ratio:.3f}" if ratio else "-", each)
    console.print(table)
    from results import write_results

    out = write_results(
        "guidellm-check",
        "guidellm beside autotune's load generator on the exported llama-server command at the trial's sustained rate",
        {
            "model": str(model),
            "study": args.study,
            "trial": trial.number,
            "config": trial.config.to_json(),
            "sustained_rps_in_trial": trial.served_rps,
            "rate_offered": rate,
            "requests_per_side": count,
            "prompt_tokens": mix.prompt_tokens,
            "output_tokens": mix.output_tokens,
            "exported_command": command,
        },
        rows,
        args.out,
        unit="ms",
        ratio_to="autotune's own load generator (guidellm / autotune)",
        rounds=rounds,
        targets=[
            {"text": f"guidellm's p99s within {TARGET:.0%} of autotune's (medians of {len(rounds)} rounds): {v}"}
            for v in verdicts
        ],
    )
    console.print(f"wrote {out}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""llama.cpp's own tools on a GGUF autotune's trial loaded: llama-batched-bench, what a llama.cpp user times
instead, and llama-perplexity --kl-divergence, what they judge a quantization's quality by; for the
benchmarks and the tests that set autotune's trial (its speed, its KL divergence) beside them.

`make llama-tools` builds it from the source llama-cpp-python carries (the same llama.cpp) into the runtime's
share/llama.cpp/bin. Its tokens/s here is the quantity autotune's trials report: generated tokens over the
call's time, prefill included (`pl x ntg / t`; its own `speed` also counts the prompt's tokens).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOL = "llama-batched-bench"
RUNS_TO_PRINT = 15


def tool_path(prefix: str | Path = sys.prefix, name: str = TOOL) -> Path:
    """Where `make llama-tools` puts one of llama.cpp's tools (llama-batched-bench, llama-perplexity,
    llama-server) for the runtime at `prefix`."""
    return Path(prefix) / "share" / "llama.cpp" / "bin" / name


def batched_bench(
    tool: Path,
    gguf: Path,
    prompt: int,
    new: int,
    sequences: int,
    threads: int,
    repack: bool = True,
    pin: list[str] | None = None,
) -> dict[str, Any]:
    """One llama-batched-bench run at its defaults (n_batch 2048, n_ubatch 512, flash attention auto); its JSON
    line for this shape, with `generated_tokens_per_s`. `repack=False` adds `--no-repack` (the extra weight
    buffers off, as autotune's trials load the GGUF on a build with AMX); `pin`: a command prefix that pins it
    to the CPUs the trial ran on (its pin prefix, e.g. numactl --physcpubind=0,1)."""
    command = [
        *(pin or []),
        str(tool),
        "-m",
        str(gguf),
        "-npp",
        str(prompt),
        "-ntg",
        str(new),
        "-npl",
        str(sequences),
        "-t",
        str(threads),
        "-c",  # the KV cache the shape needs, padded: a combination that does not fit is skipped silently
        str(-(-sequences * (prompt + new) // 256) * 256 + 256),
        "--output-format",
        "jsonl",
        *([] if repack else ["--no-repack"]),
    ]
    # llama.cpp's logger prints from a thread the tool does not wait for at exit: its result line is lost in
    # one run of three to one of two (stdout, stderr and --log-file alike; 10 of 20 runs to a file, 6 of 20
    # to a pipe on a Zen 4; -v, --log-colors off and --log-jsonl do not help), so a run that printed none is
    # run again, up to RUNS_TO_PRINT times (all of them lost at one in two: 3e-5)
    row: dict[str, Any] | None = None
    attempt = 0
    for attempt in range(1, RUNS_TO_PRINT + 1):  # noqa: B007 (read after the loop)
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:  # a crash (llama.cpp's AMX kernels: SIGSEGV) is a result of its own
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}: {last}")
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        row = next((line for line in lines if line.get("pl") == sequences), None)
        if row is not None:
            break
    if row is None:
        raise RuntimeError(f"{shlex.join(command)} printed no result in {RUNS_TO_PRINT} runs: {done.stderr[-800:]}")
    return {
        **row,
        "command": shlex.join(command),
        "runs_to_print": attempt,
        "generated_tokens_per_s": sequences * new / row["t"],
    }


PERPLEXITY_TOOL = "llama-perplexity"
MEAN_KLD = re.compile(r"^Mean\s+KLD:\s+(\S+)\s+\S+\s+(\S+)", re.MULTILINE)
SAME_TOP = re.compile(r"^Same top p:\s+(\S+)", re.MULTILINE)


def perplexity_kld(
    tool: Path,
    base_gguf: Path,
    gguf: Path,
    text: Path,
    context: int,
    chunks: int,
    threads: int,
    scratch: Path,
    repack: bool = True,
) -> dict[str, Any]:
    """llama-perplexity's mean KL divergence of `gguf` from `base_gguf` over `text`, as its users run it:
    first the base's log-probabilities saved (--kl-divergence-base), then the candidate compared with them
    (--kl-divergence). Each chunk of `context` tokens starts with BOS; the second half of its positions
    count. `repack=False`: the weights as the GGUF holds them (as autotune's trial loaded them on a build with
    AMX, whose buffers crash). Returns Mean KLD with its ±, the same-top-token share (percent), the commands."""
    base = scratch / f"{base_gguf.stem}.kld"
    common = ["-f", str(text), "-c", str(context), "--chunks", str(chunks), "-t", str(threads), "-b", str(context)]
    save = [str(tool), "-m", str(base_gguf), *common, "--kl-divergence-base", str(base)]
    compare = [str(tool), "-m", str(gguf), *common, "--kl-divergence-base", str(base), "--kl-divergence"]
    if not repack:
        compare.append("--no-repack")

    # the tool's logger loses its last lines as llama-batched-bench's does (batched_bench; Mean KLD printed in 6 of
    # 12 runs on a Zen 4, so two tries failed one test run in four): the comparison,
    # whose result is only printed, runs again until it prints, up to RUNS_TO_PRINT times; the base is a file
    def run(command: list[str]) -> str:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}: {last}")
        return done.stdout + done.stderr

    run(save)
    if not base.is_file() or base.stat().st_size == 0:
        run(save)
    for _ in range(RUNS_TO_PRINT):
        output = run(compare)
        kld, same = MEAN_KLD.search(output), SAME_TOP.search(output)
        if kld is not None:
            break
    if kld is None:
        raise RuntimeError(f"{shlex.join(compare)} printed no Mean KLD in {RUNS_TO_PRINT} runs: {output[-800:]}")
    return {
        "mean_kld": float(kld.group(1)),
        "mean_kld_pm": float(kld.group(2)),
        "same_top_percent": float(same.group(1)) if same else None,
        "commands": [shlex.join(save), shlex.join(compare)],
    }

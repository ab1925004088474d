"""llama.cpp's own benchmark, llama-batched-bench, on a GGUF autotune's trial loaded: what a llama.cpp user
runs instead, for the benchmarks and the tests that set autotune's trial beside it.

`make llama-tools` builds it from the source llama-cpp-python carries (the same llama.cpp) into the runtime's
share/llama.cpp/bin. Its tokens/s here is the quantity autotune's trials report: generated tokens over the
call's time, prefill included (`pl x ntg / t`; its own `speed` also counts the prompt's tokens).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOL = "llama-batched-bench"


def tool_path(prefix: str | Path = sys.prefix) -> Path:
    """Where `make llama-tools` puts llama-batched-bench for the runtime at `prefix`."""
    return Path(prefix) / "share" / "llama.cpp" / "bin" / TOOL


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
    # about one run of three (stdout, stderr and --log-file alike), so a run that printed none is run again
    row: dict[str, Any] | None = None
    attempt = 0
    for attempt in range(1, 6):  # noqa: B007 (read after the loop)
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:  # a crash (llama.cpp's AMX kernels: SIGSEGV) is a result of its own
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise RuntimeError(f"{shlex.join(command)} exited {done.returncode}: {last}")
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        row = next((line for line in lines if line.get("pl") == sequences), None)
        if row is not None:
            break
    if row is None:
        raise RuntimeError(f"{shlex.join(command)} printed no result in 5 runs: {done.stderr[-800:]}")
    return {
        **row,
        "command": shlex.join(command),
        "runs_to_print": attempt,
        "generated_tokens_per_s": sequences * new / row["t"],
    }

"""`autotune export --format sh`: a launch script that runs your program the way the winner was tuned.

The script clears the variables autotune manages, sets exactly the winner's environment, and starts one
process per instance pinned to its cores (numactl or taskset, as tuned), all at once, then waits. Each
process learns its place from AUTOTUNE_INSTANCE / AUTOTUNE_INSTANCES and finds the tuned config through
AUTOTUNE_BEST (what `autotune.load()` reads). Without a command it re-measures the winner itself.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from autotune.machine.runtimes import MAIN, replay_env
from autotune.records.config import UNSET_IN_COMMANDS


def launch_script(best: dict[str, Any], best_path: Path) -> str:
    config = best["config"]
    pin_prefixes = best["launch"]["pin_prefixes"]
    runtime = best.get("runtime") or {"name": MAIN}
    python, env = replay_env(runtime, best.get("environment") or {})
    generation = (best.get("job") or {}).get("generation")
    batch = (
        f"{config['batch_size']} sequence(s) of {generation['prompt_tokens']} prompt tokens, "
        f"{generation['new_tokens']} new tokens each"
        if generation
        else f"batch {config['batch_size']}"
    )
    threads = f"{config['instances']} x {config['threads_per_instance']} threads"
    summary = f"{config['backend']}/{config['precision']} {batch}, {threads}"
    lines = [
        "#!/usr/bin/env bash",
        f"# autotune launch script: {best['model']['name']} as tuned in study {best['study']['name']} (trial "
        f"{best['study']['trial']}),",
        f"# {summary}, runtime {runtime.get('name', MAIN)} (torch {runtime.get('torch', '?')}).",
        "# Usage: ./launch.sh [COMMAND ARGS...]   one pinned process per instance runs COMMAND with the tuned",
        "# environment; each gets AUTOTUNE_INSTANCE (0..N-1), AUTOTUNE_INSTANCES and AUTOTUNE_BEST.",
        "# Without a command, each instance re-measures the tuned config and prints JSON.",
        "set -euo pipefail",
        f"unset {' '.join(sorted(set(UNSET_IN_COMMANDS) - set(env)))}",
        *(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())),
        f"export AUTOTUNE_BEST={shlex.quote(str(best_path.resolve()))}",
        f"export AUTOTUNE_INSTANCES={len(pin_prefixes)}",
        f"PYTHON={shlex.quote(python)}",
        "pids=()",
        "trap 'kill \"${pids[@]}\" 2>/dev/null' INT TERM",
    ]
    for i, prefix in enumerate(pin_prefixes):
        pin = shlex.join(prefix)
        default = f'"$PYTHON" -m autotune.worker --best "$AUTOTUNE_BEST" --instance {i}'
        lines.append(
            f'if [ $# -gt 0 ]; then AUTOTUNE_INSTANCE={i} {pin} "$@" & else AUTOTUNE_INSTANCE={i} {pin} {default} & fi'
        )
        lines.append("pids+=($!)")
    lines += ["status=0", 'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done', 'exit "$status"', ""]
    return "\n".join(lines)

"""`autotune export --format sh`: a launch script that runs your program the way the winner was tuned.

The script clears the variables autotune manages, sets exactly the winner's environment, and starts one
process per instance pinned to its cores (numactl or taskset, as tuned), all at once, then waits. Each
process learns its place from AUTOTUNE_INSTANCE / AUTOTUNE_INSTANCES and finds the tuned config through
AUTOTUNE_BEST (what `autotune.load()` reads); a server-scenario winner's batching policy comes as
AUTOTUNE_MAX_BATCH and AUTOTUNE_MAX_WAIT_MS. Without a command it re-measures the winner itself.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from autotune.machine.runtimes import RuntimeRecord, replay_env
from autotune.records.best import BestJson, ServerSummary
from autotune.records.config import UNSET_IN_COMMANDS


def launch_script(best: BestJson | dict[str, Any], best_path: Path) -> str:
    """The script's text; `best` is best.json's record (or its JSON, as read from the file)."""
    best = BestJson.from_json(best)
    config = best.config
    if best.launch is None or best.launch.pin_prefixes is None:
        raise ValueError(f"{best_path} names no launch (pin_prefixes): nothing to start")
    pin_prefixes = best.launch.pin_prefixes
    runtime = best.runtime or RuntimeRecord()
    python, env = replay_env(runtime, best.environment or {})
    generation = best.job.generation if best.job else None
    batch = (
        f"{config.batch_size} sequence(s) of {generation.prompt_tokens} prompt tokens, "
        f"{generation.new_tokens} new tokens each"
        if generation
        else f"batch {config.batch_size}"
    )
    threads = f"{config.instances} x {config.threads_per_instance} threads"
    summary = f"{config.backend}/{config.precision} {batch}, {threads}"
    lines = [
        "#!/usr/bin/env bash",
        f"# autotune launch script: {best.model.name if best.model else '?'} as tuned in study {best.study.name} "
        f"(trial {best.study.trial}),",
        f"# {summary}, runtime {runtime.name} (torch {runtime.torch or '?'}).",
        "# Usage: ./launch.sh [COMMAND ARGS...]   one pinned process per instance runs COMMAND with the tuned",
        "# environment; each gets AUTOTUNE_INSTANCE (0..N-1), AUTOTUNE_INSTANCES and AUTOTUNE_BEST.",
        "# Without a command, each instance re-measures the tuned config and prints JSON.",
        "set -euo pipefail",
        f"unset {' '.join(sorted(set(UNSET_IN_COMMANDS) - set(env)))}",
        *(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())),
        f"export AUTOTUNE_BEST={shlex.quote(str(best_path.resolve()))}",
        f"export AUTOTUNE_INSTANCES={len(pin_prefixes)}",
        *server_variables(best.server, best.objective.revalidated_median),
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


def server_variables(server: ServerSummary | None, revalidated: float | None = None) -> list[str]:
    """The server scenario's batching policy, as variables the user's server reads: send a batch when
    AUTOTUNE_MAX_BATCH requests wait or the oldest has waited AUTOTUNE_MAX_WAIT_MS (none otherwise)."""
    if not server:
        return []
    return [
        f"# server scenario: {revalidated or server.sustained_rps:.1f} requests/s sustained at p99 <= "
        f"{server.slo_ms:g} ms with this batching policy{' (finalists median)' if revalidated else ''}",
        f"export AUTOTUNE_MAX_BATCH={server.max_batch}",
        f"export AUTOTUNE_MAX_WAIT_MS={server.max_wait_ms:g}",
        f"export AUTOTUNE_SLO_MS={server.slo_ms:g}",
    ]

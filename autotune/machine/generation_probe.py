"""What text generation can run in each runtime: the torchao precisions the runtime's torch/torchao can
run on CPU and the engines that can run there at all, asked in a fresh process of that runtime
(`python -m autotune.backends.generation`: APIs move between torchao versions, and what imports may
still have no CPU kernel), and the runtime each engine that cannot run in the main one runs in (IPEX's).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends import backend_specs
from autotune.backends.base import BackendSpec
from autotune.common.errors import UserError
from autotune.machine.runtimes import MAIN, Runtime, cached_report, runtime_env


@dataclass(frozen=True)
class GenerationProbe:
    """What text generation can run here: the main runtime's unavailable precisions and the engines that
    run in no runtime (keyed by backend name), and the engines that run only outside the main runtime."""

    unavailable: dict[str, str]
    routes: dict[str, list[str]]  # engine -> the runtime its trials run in (never "main")


def own_engines() -> dict[str, BackendSpec]:
    """The generation backends with precisions of their own (llama.cpp's, OpenVINO's, IPEX's), not
    torchao's: each says itself whether it runs here, where the torchao ones are probed per precision."""
    return {name: spec for name, spec in backend_specs("generate").items() if "torchao" not in spec.requires}


def probe_generation(
    runtimes: dict[str, Runtime], base_env: dict[str, str], wanted: Collection[str] | None = None
) -> GenerationProbe:
    """Probe the main runtime; an engine of `wanted` (default: every one) that cannot run there (IPEX's,
    which imports only with torch 2.8) is probed in the other runtimes too, the IPEX runtime first, and its
    trials go to the first where it runs. `base_env`: the environment the probes start from (autotune's
    own variables removed)."""
    main = generation_precisions_unavailable(runtimes[MAIN], base_env)
    elsewhere = [name for name in backend_specs("generate") if name in main and (wanted is None or name in wanted)]
    routes: dict[str, list[str]] = {}
    reasons = dict(main)
    for runtime in sorted(runtimes.values(), key=lambda r: r.role != "auto"):
        if runtime.role == MAIN or not [name for name in elsewhere if name not in routes]:
            continue
        try:
            there = generation_precisions_unavailable(runtime, base_env)
        except UserError as exc:
            there = dict.fromkeys(elsewhere, str(exc))
        for name in elsewhere:
            if name not in there:
                routes.setdefault(name, [runtime.name])
            elif name not in routes:
                reasons[name] = f"{main[name]}; in runtime {runtime.name}: {there[name]}"
    return GenerationProbe({k: v for k, v in reasons.items() if k not in routes}, routes)


def generation_precisions_unavailable(runtime: Runtime, base_env: dict[str, str]) -> dict[str, str]:
    """Which generation precisions the runtime's torchao cannot run on CPU, and which engines (llama.cpp)
    cannot run at all (keyed by the backend's name), probed in a fresh process of that runtime (APIs move
    between torchao versions: what imports may still have no CPU kernel)."""
    probed = cached_report(
        Path(runtime.python), "generation", lambda: _probe(runtime, base_env), probe_inputs(runtime, base_env)
    )
    # an engine that cannot run at all is keyed by its backend's name (never a precision's)
    return {**probed["unavailable"], **probed.get("engines", {})}


def _probe(runtime: Runtime, base_env: dict[str, str]) -> dict[str, Any]:
    """`python -m autotune.backends.generation` in a fresh process of the runtime (5-10 s: torchao's
    configurations tried, every engine imported)."""
    command = [runtime.python, "-m", "autotune.backends.generation"]
    env = runtime_env(runtime, dict(base_env))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True)
        probed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        if not isinstance(probed.get("unavailable"), dict):
            raise ValueError(f"no precisions in its report: {done.stdout[-200:]!r}")
        return probed
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError) as exc:
        raise UserError(f"cannot probe which precisions run in {runtime.python}: {exc}") from None


def probe_inputs(runtime: Runtime, base_env: dict[str, str]) -> tuple[str, ...]:
    """What the probe's answer depends on besides the runtime's packages and autotune's code (which its
    cache keys on already): the variables the engines' checks read (where their tools lie), and the
    folders under the runtime's share/ where make setup puts those tools (llama.cpp's converter,
    optimum-intel's overlay), as they are now."""
    names = sorted({name for spec in backend_specs("generate").values() for name in spec.probe_environment})
    share = Path(runtime.python).parent.parent / "share"
    tools = sorted(share.iterdir()) if share.is_dir() else []
    return (
        *(f"{name}={base_env.get(name, '')}" for name in names),
        *(f"{tool.name}:{tool.stat().st_mtime_ns}" for tool in tools if tool.is_dir()),
    )

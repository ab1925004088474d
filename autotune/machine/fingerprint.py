"""Hardware and software fingerprint: what a result is only valid for."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from typing import Any

from autotune.backends import backend_packages
from autotune.machine.probe import MachineProbe

# Everyone's packages; each backend's own are in its SPEC (packages).
CORE_PACKAGES = ("autotune", "torch", "torchvision", "numpy", "optuna")


def fingerprint_packages() -> tuple[str, ...]:
    """The packages whose versions a result is valid for: the core ones and every registered backend's."""
    return tuple(dict.fromkeys((*CORE_PACKAGES, *backend_packages())))


def package_versions(names: tuple[str, ...] | None = None) -> dict[str, str]:
    """The installed versions of `names` (default: fingerprint_packages()); those not installed left out."""
    versions = {}
    names = fingerprint_packages() if names is None else names
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def fingerprint(machine: MachineProbe, runtimes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`runtimes`: name -> autotune.machine.runtimes.Runtime, whose interpreters and torch versions are recorded too."""
    return {
        "hardware": {
            "cpu_model": machine.cpu_model,
            "isa": machine.isa,
            "physical_cores": machine.physical_cores,
            "allowed_cpus": list(machine.allowed_cpus),
            "smt_per_core": machine.smt_per_core,
            "numa_nodes": len(machine.numa_nodes),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        },
        "software": {
            "python": platform.python_version(),
            "packages": package_versions(),
            "allocators": {name: os.path.realpath(path) for name, path in machine.allocators.items()},
            "libc": "-".join(platform.libc_ver()),
            "kernel": machine.kernel,
            "transparent_hugepages": machine.thp,
            "runtimes": {
                name: {"python": r.python, "torch": r.torch, "packages": r.packages}
                for name, r in (runtimes or {}).items()
            },
        },
        "host": socket.gethostname(),
    }


def fingerprint_differences(recorded: dict[str, Any] | None, here: dict[str, Any]) -> list[str]:
    """One line per hardware or software fact that differs: 'hardware: cpu_model 'A' -> 'B''."""
    if not recorded:
        return ["best.json has no fingerprint: cannot tell what it was tuned on"]
    lines = []
    for part in ("hardware", "software"):
        old, new = recorded.get(part) or {}, here.get(part) or {}
        for key in sorted(old):  # a fact best.json did not record is unknown, not different
            if key == "runtimes":
                continue  # compared below, by torch version
            if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
                for sub in sorted(old[key]):  # likewise a sub-fact (an ISA flag probed since) it did not record
                    if old[key].get(sub) != new[key].get(sub):
                        lines.append(f"{part}: {key}.{sub} {old[key].get(sub)!r} -> {new[key].get(sub)!r}")
            elif old.get(key) != new.get(key):
                lines.append(f"{part}: {key} {old.get(key)!r} -> {new.get(key)!r}")
    old_rt, new_rt = (
        (recorded.get("software") or {}).get("runtimes") or {},
        (here.get("software") or {}).get("runtimes") or {},
    )
    for name in sorted(set(old_rt) & set(new_rt)):
        if old_rt[name].get("torch") != new_rt[name].get("torch"):
            lines.append(
                f"software: runtime {name} torch {old_rt[name].get('torch')!r} -> {new_rt[name].get('torch')!r}"
            )
    return lines

"""Hardware and software fingerprint: what a result is only valid for."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
from typing import Any

from autotune.probe import MachineProbe

PACKAGES = ("autotune", "torch", "torchvision", "numpy", "optuna", "onnxruntime", "openvino", "nncf", "torchao", "intel-extension-for-pytorch")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def fingerprint(machine: MachineProbe, runtimes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`runtimes`: name -> autotune.runtimes.Runtime, whose interpreters and torch versions are recorded too."""
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
            "runtimes": {name: {"python": r.python, "torch": r.torch, "packages": r.packages} for name, r in (runtimes or {}).items()},
        },
        "host": socket.gethostname(),
    }

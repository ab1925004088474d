"""Checks from inside a trial process that it was started as asked: the allocator really mapped, the
OpenMP runtime it asked for (and only that one), torch's thread count. A process that fails them
refuses to measure, so no number is ever recorded for an environment it did not have.
"""

from __future__ import annotations

import os

from autotune.records.config import TrialConfig
from autotune.records.metrics import AllocatorCheck, OpenMPCheck, ThreadsCheck


class EnvironmentMismatch(RuntimeError):
    """The process does not run with the environment its config asked for."""


def mapped_libraries() -> list[str]:
    """Paths of every shared object mapped into this process."""
    paths: set[str] = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and ".so" in parts[5]:
                paths.add(parts[5].strip())
    return sorted(paths)


def check_allocator(allocator: str) -> AllocatorCheck:
    """Verify the allocator asked for is mapped (and that no other one sneaked in)."""
    preload = os.environ.get("LD_PRELOAD", "")
    mapped = mapped_libraries()
    found = [p for p in mapped if "tcmalloc" in os.path.basename(p) or "jemalloc" in os.path.basename(p)]
    if allocator == "glibc":
        ok = not found
    else:
        wanted = {os.path.realpath(p) for p in preload.split(":") if allocator in os.path.basename(p)}
        ok = bool(wanted) and any(os.path.realpath(p) in wanted for p in found)
    report = AllocatorCheck(asked=allocator, ld_preload=preload, mapped=found, verified=ok)
    if not ok:
        raise EnvironmentMismatch(
            f"allocator {allocator!r} asked for, but mapped allocator libraries are {found or 'none (glibc)'}"
        )
    return report


def check_openmp(config: TrialConfig) -> OpenMPCheck:
    """After torch is imported: Intel OpenMP mapped when asked for (and only then), with its settings."""
    mapped = mapped_libraries()
    intel = [p for p in mapped if os.path.basename(p).startswith("libiomp5")]
    gnu = [p for p in mapped if os.path.basename(p).startswith("libgomp")]
    report = OpenMPCheck(
        asked=config.openmp,
        intel=intel,
        gnu=gnu,
        KMP_AFFINITY=os.environ.get("KMP_AFFINITY"),
        KMP_BLOCKTIME=os.environ.get("KMP_BLOCKTIME"),
        THP_MEM_ALLOC_ENABLE=os.environ.get("THP_MEM_ALLOC_ENABLE"),
    )
    if config.openmp == "intel" and not intel:
        raise EnvironmentMismatch(
            f"Intel OpenMP asked for, but libiomp5 is not mapped (mapped OpenMP: {gnu or 'none'})"
        )
    if config.openmp == "gnu" and intel:
        raise EnvironmentMismatch(f"GNU OpenMP asked for, but Intel OpenMP is mapped: {intel}")
    return report


def check_threads(expected: int) -> ThreadsCheck:
    import torch

    actual = torch.get_num_threads()
    report = ThreadsCheck(asked=expected, torch=actual, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS"))
    if actual != expected:
        raise EnvironmentMismatch(f"asked for {expected} threads, torch runs with {actual}")
    return report

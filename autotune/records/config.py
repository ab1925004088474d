"""TrialConfig: the one record of a candidate configuration.

It knows the environment its processes need, how its instances are pinned, which of its fields change
the numbers a model produces, and how to travel as JSON (into the study, best.json and the worker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.common.json_record import Record
from autotune.machine.probe import JEMALLOC_CONF, MachineProbe, format_cpu_list

# Variables autotune owns: removed from the inherited environment so a trial gets exactly what it asks for.
MANAGED_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCHINDUCTOR_")
MANAGED_ENV_VARS = ("LD_PRELOAD", "MALLOC_CONF", "THP_MEM_ALLOC_ENABLE", "TBB_ENABLE_SANITIZERS")
# What a pasted launch command unsets so the shell's own settings cannot leak in.
UNSET_IN_COMMANDS = (
    *MANAGED_ENV_VARS,
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCHINDUCTOR_FREEZING",
)


@dataclass(frozen=True)
class TrialConfig(Record):
    # closed loop: stored as before the server scenario existed
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ("max_wait_ms",)

    backend: str
    precision: str
    batch_size: int
    allocator: str = "glibc"
    instances: int = 1
    threads_per_instance: int = 1
    # The backend's own options (its SPEC's names and values), kept in name order: free-form here, each
    # backend reads its own.
    options: dict[str, Any] = field(default_factory=dict)
    runtime: str = "main"  # the Python environment its processes run in (autotune.machine.runtimes)
    # PyTorch's thread pool and allocations (torch backends only): GNU OpenMP as bundled with torch, or
    # Intel OpenMP preloaded (with its affinity and spin-wait settings); THP_MEM_ALLOC_ENABLE.
    openmp: str = "gnu"
    kmp_affinity: str | None = None
    kmp_blocktime: int | None = None
    thp: bool = False
    # The server scenario's batching policy: a batch is sent when full (batch_size) or when its oldest request
    # has waited this long (None: the closed-loop scenarios, which run full batches back to back).
    max_wait_ms: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", dict(sorted(self.options.items())))

    # ---- identity -------------------------------------------------------------------------------
    def numerics_key(self, without: tuple[str, ...] = (), builder: int | None = None) -> str:
        """What changes the outputs: backend, precision, backend options, the artifact builder's version
        (`builder`: a new quantization scheme under the same options) and the runtime (another torch may
        compute differently), not threads, allocator or OpenMP; nor the options named in `without`."""
        options = {k: v for k, v in self.options.items() if k not in without}
        key: dict[str, object] = {"backend": self.backend, "precision": self.precision, "options": options}
        if builder is not None:
            key["builder"] = builder
        if self.runtime != "main":
            key["runtime"] = self.runtime
        return json.dumps(key, sort_keys=True)

    def summary(self) -> str:
        """The configuration in one line (`bs` is per instance: a generation trial runs bs x instances
        sequences in all)."""
        opts = " ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        extras = [f"runtime={self.runtime}"] if self.runtime != "main" else []
        if self.openmp != "gnu":
            extras.append(f"iomp(affinity={self.kmp_affinity},blocktime={self.kmp_blocktime})")
        if self.thp:
            extras.append("thp")
        if self.max_wait_ms is not None:
            extras.append(f"wait={self.max_wait_ms:g}ms")
        return (
            f"{self.backend}/{self.precision} bs={self.batch_size} {self.instances}x{self.threads_per_instance}thr "
            f"{self.allocator}{' ' + opts if opts else ''}{' ' + ' '.join(extras) if extras else ''}"
        )

    # ---- launch -----------------------------------------------------------------------------------
    @property
    def total_batch(self) -> int:
        """Samples (a generation trial's sequences) in flight on the machine: every instance's batch together."""
        return self.batch_size * self.instances

    @property
    def split(self) -> str:
        """The total batch and its split over instances: "8 = 2 x 4"."""
        return f"{self.total_batch} = {self.instances} x {self.batch_size}"

    @property
    def total_cores(self) -> int:
        return self.instances * self.threads_per_instance

    def to_env(self, machine: MachineProbe, openmp_libraries: dict[str, str] | None = None) -> dict[str, str]:
        """The environment variables this config sets (on top of a cleaned inherited environment).
        `openmp_libraries` are the runtime's (autotune.machine.runtimes.Runtime.openmp): Intel OpenMP is preloaded
        from the environment the trial runs in."""
        threads = str(self.threads_per_instance)
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        preload = []
        if self.allocator != "glibc":
            if self.allocator not in machine.allocators:
                raise ValueError(f"allocator {self.allocator!r} was not found on this machine")
            preload.append(machine.allocators[self.allocator])
        if self.allocator == "jemalloc":
            env["MALLOC_CONF"] = JEMALLOC_CONF
        if self.openmp == "intel":
            library = (openmp_libraries or {}).get("intel")
            if not library:
                raise ValueError(
                    f"Intel OpenMP (libiomp5.so from the intel-openmp wheel) was not found in runtime {self.runtime!r}"
                )
            preload.append(library)
            if self.kmp_affinity is not None:
                env["KMP_AFFINITY"] = self.kmp_affinity
            if self.kmp_blocktime is not None:
                env["KMP_BLOCKTIME"] = str(self.kmp_blocktime)
        if self.thp:
            env["THP_MEM_ALLOC_ENABLE"] = "1"
        if preload:
            env["LD_PRELOAD"] = ":".join(preload)
        return env

    def instance_cpus(self, machine: MachineProbe) -> list[tuple[int, ...]]:
        """Disjoint physical cores per instance: one logical CPU of each core, SMT siblings left idle."""
        if self.total_cores > machine.physical_cores:
            raise ValueError(
                f"{self.instances} instances x {self.threads_per_instance} threads needs {self.total_cores} cores; "
                f"this machine allows {machine.physical_cores}"
            )
        t = self.threads_per_instance
        return [tuple(core.cpus[0] for core in machine.cores[i * t : (i + 1) * t]) for i in range(self.instances)]


def pin_prefix(cpus: tuple[int, ...], machine: MachineProbe) -> list[str]:
    """The command prefix that pins a process to `cpus` (and binds its memory to their NUMA node)."""
    cpu_list = format_cpu_list(cpus)
    if machine.pinning.startswith("numactl"):
        prefix = ["numactl", f"--physcpubind={cpu_list}"]
        if machine.pinning == "numactl":
            nodes = {core.numa_node for core in machine.cores if core.cpus[0] in cpus}
            prefix.append(f"--membind={nodes.pop()}" if len(nodes) == 1 else "--localalloc")
        return prefix
    if machine.pinning == "taskset":
        return ["taskset", "-c", cpu_list]
    return []


def clean_environment(base: dict[str, str]) -> dict[str, str]:
    """The inherited environment minus every variable autotune manages."""
    return {k: v for k, v in base.items() if k not in MANAGED_ENV_VARS and not k.startswith(MANAGED_ENV_PREFIXES)}

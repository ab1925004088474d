"""`autotune probe`: what this machine and its runtimes offer, as the lines a user reads (or as JSON).

The search space is narrowed from exactly this: cores and their SMT siblings, the CPU set this process
may use, NUMA nodes, the pinning tool that works here, allocators and OpenMP runtimes, which backends
each runtime imports (backend plugins among them, and those that did not load, with why), and which
text-generation precisions and engines run where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.backends import backend_specs, plugin_problems, plugins
from autotune.backends.generation import PRECISIONS
from autotune.common.errors import UserError
from autotune.machine.generation_probe import GenerationProbe, own_engines, probe_generation
from autotune.machine.probe import SYS_CPU, MachineProbe, format_cpu_ranges
from autotune.machine.runtimes import Runtime

PINNING = {
    "numactl": "numactl --physcpubind with --membind to the cores' NUMA node (tested here)",
    "numactl-cpu": "numactl --physcpubind; memory binding is refused here (container), so no --membind",
    "taskset": "taskset -c (numactl is missing)",
    "none": "none: neither numactl nor taskset is installed, instances are not pinned",
}
THP = {
    "madvise": "THP_MEM_ALLOC_ENABLE=1 makes PyTorch's large allocations huge pages: searched",
    "always": "every allocation may use huge pages already: THP_MEM_ALLOC_ENABLE has no effect, not searched",
    "never": "huge pages are off: THP_MEM_ALLOC_ENABLE has no effect, not searched",
}


def _online() -> str:
    try:
        return (SYS_CPU / "online").read_text().strip()
    except OSError:
        return "unknown"


def probe_lines(machine: MachineProbe, runtimes: dict[str, Runtime]) -> list[str]:
    present = [flag for flag, on in machine.isa.items() if on]
    missing = [flag for flag, on in machine.isa.items() if not on]
    lines = [
        f"CPU          {machine.cpu_model}",
        f"ISA          {' '.join(present) or '-'}" + (f"  (absent: {' '.join(missing)})" if missing else ""),
        f"CPU set      {format_cpu_ranges(machine.allowed_cpus)} allowed to this process (online: {_online()})",
        f"cores        {machine.physical_cores} physical, {machine.smt_per_core} logical CPU(s) per core usable; "
        "instances get disjoint physical cores, one CPU each, SMT siblings left idle",
    ]
    for core in machine.cores:
        lines.append(
            f"  core {core.core_id:<3} package {core.package} node {core.numa_node}: uses cpu {core.cpus[0]}, "
            f"siblings {format_cpu_ranges(core.siblings or core.cpus)}"
        )
    lines.append(
        "NUMA         " + "; ".join(f"node {n}: cpus {format_cpu_ranges(c)}" for n, c in machine.numa_nodes.items())
    )
    lines.append(f"pinning      {PINNING.get(machine.pinning, machine.pinning)}")
    lines.append(f"huge pages   {machine.thp}: {THP.get(machine.thp, 'unknown mode: not searched')}")
    if machine.allocators:
        for name, path in machine.allocators.items():
            lines.append(f"allocator    {name:<9} {path} ({machine.allocator_versions.get(name, 'version unknown')})")
    else:
        lines.append("allocator    glibc only (install libgoogle-perftools4 / libjemalloc2 for tcmalloc / jemalloc)")
    lines.extend(plugin_lines())
    for runtime in runtimes.values():
        lines.extend(runtime_lines(runtime))
    return lines


def plugin_lines() -> list[str]:
    """The backends added through the `autotune.backends` entry points, and those left out, with why."""
    lines = []
    for point, (task, name) in plugins().items():
        spec = backend_specs(task)[name]
        lines.append(f"plugin       {point}: {task} backend {name} ({spec.description})")
    for point, why in plugin_problems().items():
        lines.append(f"plugin       {point} left out: {why}")
    return lines


def runtime_lines(runtime: Runtime) -> list[str]:
    role = {"main": "main", "auto": "for backends the main runtime lacks", "explicit": "--runtime"}[runtime.role]
    lines = [
        f"runtime      {runtime.name} ({role}): {runtime.python}, python {runtime.python_version}, torch "
        f"{runtime.torch or 'missing'}"
    ]
    runs = [name for name in runtime.backends if runtime.runs(name)]
    lines.append(f"  backends   {' '.join(runs) or 'none'}")
    for why in runtime.backends.values():
        if why is not None:
            lines.append(f"  missing    {why}")
    versions = {
        "gnu": f"bundled with torch {runtime.torch}",
        "intel": f"intel-openmp {runtime.packages.get('intel-openmp', '?')}",
    }
    for kind, path in sorted(runtime.openmp.items()):
        lines.append(f"  OpenMP     {kind:<5} {path} ({versions[kind]})")
    return lines


def probe_json(machine: MachineProbe, runtimes: dict[str, Runtime]) -> dict[str, Any]:
    return {
        **machine.to_json(),
        "runtimes": {name: runtime.to_json() for name, runtime in runtimes.items()},
        "backend_plugins": {
            "registered": {point: {"task": task, "backend": name} for point, (task, name) in plugins().items()},
            "left_out": plugin_problems(),
        },
    }


@dataclass(frozen=True)
class ProbeReport:
    """What `autotune probe` says: the machine, its runtimes, and what text generation runs where (or
    why that could not be probed). Text generation runs in the main runtime; its precisions are torchao
    configs whose CPU support moves between versions, so they are tried there, in a fresh process; an
    engine that runs only in another runtime (IPEX's) is tried there."""

    machine: MachineProbe
    runtimes: dict[str, Runtime]
    generation: GenerationProbe | str  # str: why it was not probed

    @classmethod
    def of(cls, machine: MachineProbe, runtimes: dict[str, Runtime], base_env: dict[str, str]) -> ProbeReport:
        """`base_env`: the environment the generation probes start from (autotune's own variables removed)."""
        try:
            generation: GenerationProbe | str = probe_generation(runtimes, base_env)
        except UserError as exc:
            generation = str(exc)
        return cls(machine, runtimes, generation)

    def to_json(self) -> dict[str, Any]:
        report: dict[str, Any] = probe_json(self.machine, self.runtimes)
        if isinstance(self.generation, str):
            report["generation_precisions_unavailable"] = self.generation
            return report
        unavailable, routes = self.generation.unavailable, self.generation.routes
        engines = own_engines()
        # the precisions of PyTorch's path apart from the engines
        report["generation_precisions_unavailable"] = {p: w for p, w in unavailable.items() if p not in engines}
        report["generation_engines"] = {
            name: {"runs": False, "reason": unavailable[name]}
            if name in unavailable
            else {"runs": True, "runtime": routes.get(name, ["main"])[0], "precisions": list(spec.precisions)}
            for name, spec in engines.items()
        }
        return report

    def lines(self) -> list[str]:
        lines = probe_lines(self.machine, self.runtimes)
        if isinstance(self.generation, str):
            return [*lines, f"text generation in runtime main: not probed ({self.generation})"]
        unavailable, routes = self.generation.unavailable, self.generation.routes
        engines = own_engines()
        runs = [p for p in PRECISIONS if p not in unavailable]
        left_out = "".join(f"; {p} left out: {why}" for p, why in unavailable.items() if p not in engines)
        lines.append(f"text generation in runtime main: {', '.join(runs) or 'nothing'} run{left_out}")
        for name, spec in engines.items():
            where = f" in runtime {routes[name][0]}" if name in routes else ""
            status = f"left out: {unavailable[name]}" if name in unavailable else ", ".join(spec.precisions) + " run"
            lines.append(f"text generation engine {name} ({spec.description}): {status}{where}")
        return lines

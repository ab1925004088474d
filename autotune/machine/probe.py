"""What this machine offers: CPU and ISA, physical cores we may use, NUMA, allocators, pinning tools.

The search space is derived from this, so nothing is assumed: cores come from sysfs (numbering is not
assumed contiguous), the usable set from this process's affinity (containers), libraries from the disk.
"""

from __future__ import annotations

import functools
import glob
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.common.cpuinfo import read_cpuinfo

ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)

# Each allocator: file-name patterns in order of preference (full tcmalloc before the minimal one).
ALLOCATOR_PATTERNS: dict[str, tuple[str, ...]] = {
    "tcmalloc": (r"libtcmalloc\.so(\.\d+)*", r"libtcmalloc_minimal\.so(\.\d+)*"),
    "jemalloc": (r"libjemalloc\.so(\.\d+)*",),
}

# jemalloc settings suited to inference (the ones PyTorch's Xeon launcher uses): keep freed memory
# around instead of returning it to the OS between batches, background purging thread.
JEMALLOC_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class PhysicalCore:
    """One physical core: its package, id, and the logical CPUs (SMT siblings) we may use on it."""

    package: int
    core_id: int
    cpus: tuple[int, ...]
    numa_node: int
    siblings: tuple[int, ...] = ()  # every logical CPU of the core (thread_siblings_list), allowed or not


@dataclass(frozen=True)
class MachineProbe:
    cpu_model: str
    isa: dict[str, bool]
    allowed_cpus: tuple[int, ...]
    cores: tuple[PhysicalCore, ...]
    numa_nodes: dict[int, tuple[int, ...]]
    allocators: dict[str, str]
    pinning: str  # "numactl" (with memory binding), "numactl-cpu" (no membind), "taskset" or "none"
    kernel: str = field(default_factory=platform.release)
    thp: str = "unknown"  # transparent huge pages mode: always / madvise / never
    allocator_versions: dict[str, str] = field(default_factory=dict)  # name -> Debian package and version

    @property
    def physical_cores(self) -> int:
        return len(self.cores)

    @property
    def smt_per_core(self) -> int:
        return max((len(c.cpus) for c in self.cores), default=1)

    def to_json(self) -> dict:
        data = asdict(self)
        data["physical_cores"] = self.physical_cores
        data["numa_nodes"] = {str(k): list(v) for k, v in self.numa_nodes.items()}
        return data


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_cpu_list(text: str) -> list[int]:
    """Parse the kernel's CPU list format: '0-3,8,10-11'."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def format_cpu_list(cpus: list[int] | tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def format_cpu_ranges(cpus: list[int] | tuple[int, ...]) -> str:
    """The kernel's compact form, for people: [0, 1, 2, 5] -> '0-2,5'."""
    parts: list[str] = []
    for cpu in sorted(set(cpus)):
        if parts and cpu == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{cpu}"
        else:
            parts.append(str(cpu))
    return ",".join(parts) or "-"


def _numa_of_cpus() -> dict[int, int]:
    mapping: dict[int, int] = {}
    for node_dir in glob.glob(str(SYS_NODE / "node[0-9]*")):
        node = int(Path(node_dir).name[4:])
        cpulist = _read(Path(node_dir) / "cpulist")
        for cpu in parse_cpu_list(cpulist or ""):
            mapping[cpu] = node
    return mapping


def discover_cores(allowed: list[int]) -> list[PhysicalCore]:
    """Group allowed logical CPUs into physical cores using sysfs topology."""
    numa = _numa_of_cpus()
    groups: dict[tuple[int, int], list[int]] = {}
    siblings: dict[tuple[int, int], tuple[int, ...]] = {}
    for cpu in allowed:
        topo = SYS_CPU / f"cpu{cpu}" / "topology"
        package = _read(topo / "physical_package_id")
        core = _read(topo / "core_id")
        key = (int(package), int(core)) if package is not None and core is not None else (0, 10_000 + cpu)
        groups.setdefault(key, []).append(cpu)
        siblings[key] = tuple(parse_cpu_list(_read(topo / "thread_siblings_list") or str(cpu)))
    cores = [
        PhysicalCore(
            package=pkg,
            core_id=core,
            cpus=tuple(sorted(cpus)),
            numa_node=numa.get(min(cpus), 0),
            siblings=siblings[(pkg, core)],
        )
        for (pkg, core), cpus in groups.items()
    ]
    return sorted(cores, key=lambda c: c.cpus[0])


def _library_dirs() -> list[str]:
    machine = platform.machine()
    dirs = [
        os.path.join(os.environ.get("CONDA_PREFIX", ""), "lib") if os.environ.get("CONDA_PREFIX") else "",
        f"/usr/lib/{machine}-linux-gnu",
        f"/lib/{machine}-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/lib64",
    ]
    return [d for d in dirs if d and os.path.isdir(d)]


def _ldconfig_libraries() -> list[str]:
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not ldconfig:
        return []
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.rsplit("=>", 1)[1].strip() for line in out.splitlines() if "=>" in line]


def find_allocators() -> dict[str, str]:
    """Locate tcmalloc and jemalloc shared libraries (versioned and multiarch names included)."""
    candidates = _ldconfig_libraries()
    for directory in _library_dirs():
        candidates.extend(glob.glob(os.path.join(directory, "lib*malloc*.so*")))
    found: dict[str, str] = {}
    for name, patterns in ALLOCATOR_PATTERNS.items():
        for pattern in patterns:
            matches = sorted(
                {p for p in candidates if re.fullmatch(pattern, os.path.basename(p)) and os.path.isfile(p)},
                key=lambda p: (len(os.path.basename(p)), p),
            )
            if matches:
                found[name] = matches[0]
                break
    return found


def debian_package_version(path: str) -> str:
    """'libjemalloc2 5.3.0-3' for a library Debian installed, else the file name (no dpkg: not Debian)."""
    try:
        owner = subprocess.run(["dpkg-query", "-S", os.path.realpath(path)], capture_output=True, text=True, timeout=10)
        if owner.returncode != 0:
            owner = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True, timeout=10)
        package = owner.stdout.split(":", 1)[0].strip() if owner.returncode == 0 else ""
        if package:
            version = subprocess.run(
                ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, timeout=10
            )
            if version.returncode == 0:
                return f"{package} {version.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return os.path.basename(os.path.realpath(path))


def transparent_huge_pages() -> str:
    """The kernel's THP mode: the bracketed word of 'always [madvise] never'."""
    text = _read(Path("/sys/kernel/mm/transparent_hugepage/enabled")) or ""
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else "unknown"


UNPINNED_WARNING = (
    "warning: neither numactl nor taskset works here, so instances run UNPINNED (the scheduler may put two on "
    "one core): every measurement is marked unpinned and is weaker evidence; install numactl to pin them"
)


def detect_pinning(cpu: int) -> str:
    """Prefer numactl with memory binding; containers often forbid membind, so test it for real."""
    numactl = shutil.which("numactl")
    if numactl:
        for mode, args in (
            ("numactl", [f"--physcpubind={cpu}", "--localalloc"]),
            ("numactl-cpu", [f"--physcpubind={cpu}"]),
        ):
            try:
                if subprocess.run([numactl, *args, "true"], capture_output=True, timeout=10).returncode == 0:
                    return mode
            except (OSError, subprocess.SubprocessError):
                pass
    if shutil.which("taskset"):
        return "taskset"
    return "none"


@functools.lru_cache(maxsize=1)
def probe_machine() -> MachineProbe:
    model, flags = read_cpuinfo()
    allowed = sorted(os.sched_getaffinity(0))
    cores = discover_cores(allowed)
    allocators = find_allocators()
    nodes: dict[int, list[int]] = {}
    for core in cores:
        nodes.setdefault(core.numa_node, []).extend(core.cpus)
    return MachineProbe(
        cpu_model=model,
        isa={flag: flag in flags for flag in ISA_FLAGS},
        allowed_cpus=tuple(allowed),
        cores=tuple(cores),
        numa_nodes={k: tuple(sorted(v)) for k, v in sorted(nodes.items())},
        allocators=allocators,
        pinning=detect_pinning(allowed[0]),
        thp=transparent_huge_pages(),
        allocator_versions={name: debian_package_version(path) for name, path in allocators.items()},
    )

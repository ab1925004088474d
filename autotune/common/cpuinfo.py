"""The CPU's model name and flags as the kernel reports them (/proc/cpuinfo).

In common because both the machine probe and the backends' quantizers read them: a quantizer picks its
int8 scheme from the CPU it runs on.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path


def read_cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown", set[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    if match := re.search(r"^model name\s*:\s*(.+)$", text, re.M):
        model = match.group(1).strip()
    if match := re.search(r"^flags\s*:\s*(.+)$", text, re.M):
        flags = set(match.group(1).split())
    return model, flags


# The /proc/cpuinfo flags of instructions that multiply int8 into int32 in one step.
INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_dot_products() -> bool:
    """Whether the CPU has one of INT8_DOT. Without it the x86 int8 kernels multiply u8 x s8 pairs into a
    16-bit sum that saturates, so the quantizers keep weights to 7 bits there (the toolkits' advice for
    non-VNNI CPUs)."""
    return bool(read_cpuinfo()[1] & set(INT8_DOT))


# The /proc/cpuinfo flag of AMX's bf16 tiles: OpenVINO's CPU plugin runs bf16 on them by itself, and some of
# its bf16 kernels exist only there.
BF16_TILES = "amx_bf16"


def bf16_tiles() -> bool:
    """Whether the CPU has AMX bf16 tiles (BF16_TILES)."""
    return BF16_TILES in read_cpuinfo()[1]

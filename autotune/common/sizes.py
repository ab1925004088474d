"""Human sizes ("800M", "8G", "1.5T", "50%" of this machine's memory) to MiB."""

from __future__ import annotations

import re

import psutil

from autotune.common.errors import UserError

_UNIT_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_size_mib(text: str, option: str, share_of_mib: float | None = None) -> float:
    """'8G' -> 8192.0; '50%' is a share of `share_of_mib` when given. Raises UserError on anything else."""
    cleaned = text.strip().lower().replace(" ", "").removesuffix("ib").removesuffix("b")
    if share_of_mib is not None and (match := re.fullmatch(r"(\d+(?:\.\d+)?)%", cleaned)):
        value = float(match.group(1)) / 100 * share_of_mib
    elif match := re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt])", cleaned):
        value = float(match.group(1)) * _UNIT_MIB[match.group(2)]
    else:
        examples = "800M, 8G" + (" or 50%" if share_of_mib is not None else "")
        raise UserError(f"{option}: cannot read size {text!r}: use a number with a unit, e.g. {examples}")
    if value <= 0:
        raise UserError(f"{option}: size {text!r} must be positive")
    return value


def machine_memory_mib() -> float:
    return psutil.virtual_memory().total / 2**20


# A trial that grows past this is killed before it takes the machine (and the orchestrator) down with it.
DEFAULT_TRIAL_MEMORY = "80%"
DEFAULT_CACHE_SIZE = "20G"

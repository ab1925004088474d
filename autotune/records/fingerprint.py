"""The fingerprint a study keeps (its `fingerprint` attribute, best.json's `fingerprint`), typed: the
hardware and software a result is valid for (machine/fingerprint.py takes it; its comparison reads the
JSON). Every field may be missing from a fingerprint written before it was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autotune.common.json_record import OpenRecord, Record
from autotune.machine.runtimes import RuntimeRecord
from autotune.records.attributes import Attr


@dataclass(frozen=True)
class HardwareFacts(OpenRecord):
    cpu_model: str | None = None
    isa: dict[str, bool] = field(default_factory=dict)
    physical_cores: int | None = None
    allowed_cpus: list[int] = field(default_factory=list)
    smt_per_core: int | None = None
    numa_nodes: int | None = None
    memory_gib: float | None = None


@dataclass(frozen=True)
class SoftwareFacts(OpenRecord):
    NESTED_MAPS: ClassVar[dict[str, type[Record]]] = {"runtimes": RuntimeRecord}

    python: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    allocators: dict[str, str] = field(default_factory=dict)
    libc: str | None = None
    kernel: str | None = None
    transparent_hugepages: str | None = None
    runtimes: dict[str, RuntimeRecord] = field(default_factory=dict)  # each runtime's, by its name


@dataclass(frozen=True)
class Fingerprint(OpenRecord):
    NESTED: ClassVar[dict[str, type[Record]]] = {"hardware": HardwareFacts, "software": SoftwareFacts}

    hardware: HardwareFacts | None = None
    software: SoftwareFacts | None = None
    host: str | None = None

    @classmethod
    def of(cls, study: Any) -> Fingerprint | None:
        """The fingerprint stored on an Optuna study (None: it stored none)."""
        stored = study.user_attrs.get(Attr.FINGERPRINT)
        return cls.from_json(stored) if stored else None

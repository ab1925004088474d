"""A dataclass that travels as JSON (into the study's user attributes, best.json, a worker's job and result).

One `to_json` / `from_json` for every record: a field read by a misspelt name is an AttributeError (and a
type error for mypy), not a silent None; a stored record lacking a required field is one clear error
naming the record and the field; a field a file written before it existed lacks reads at its default.

The layouts files already hold are kept by a few class-level settings rather than hand-written
serialisers: `NESTED` / `NESTED_MAPS` (fields holding other records, lists or mappings of them),
`FLATTENED` (a record whose fields are written among this one's), `TUPLES` (tuples stored as lists),
`OMIT_IF_NONE` (fields written only when set) and `OMIT_DEFAULTS` with `ALWAYS_WRITTEN` (a field at its
default left out, except those). `Record` ignores the fields it does not know; `OpenRecord` keeps them
(`extra`) and writes them back, and leaves out again the fields the JSON it was read from lacked, so a
file read and written again is the file it was.

A record that crosses processes names its layout and version in a `format` field (metadata `FORMAT`): a
file without one was written before versions were named and reads as version 1; another version is
refused in one line (`UnknownFormat`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Record")
OpenT = TypeVar("OpenT", bound="OpenRecord")

# A JSON object as Python holds it: what `to_json` returns and `from_json` reads.
JsonObject = dict[str, Any]

# Marks the fields of OpenRecord that remember how a record was read; they are not written as fields.
_BOOKKEEPING = {"bookkeeping": True}


class RecordError(ValueError):
    """A stored record cannot be read: not a mapping, or a required field is missing."""


class UnknownFormat(RecordError):
    """A record names a format version this autotune does not read."""


# The metadata of the `format` field of a record that names its layout and version, e.g.
# `format: str = field(default="autotune.job/1", kw_only=True, metadata=FORMAT)`: always written; read,
# a missing one is version 1 and any other than its default is refused.
FORMAT = {"format": True}


def _first_version(current: str) -> str:
    return current.rpartition("/")[0] + "/1"


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


class Record:
    """Base of the JSON records; subclasses are dataclasses."""

    NESTED: ClassVar[dict[str, type[Record]]] = {}  # field -> the record it holds (or a list of)
    NESTED_MAPS: ClassVar[dict[str, type[Record]]] = {}  # field -> the record each value of its mapping is
    FLATTENED: ClassVar[dict[str, type[Record]]] = {}  # field -> the record whose fields are written inline
    TUPLES: ClassVar[tuple[str, ...]] = ()  # tuples in Python, lists in JSON
    OMIT_IF_NONE: ClassVar[tuple[str, ...]] = ()  # fields only some files have: left out when None
    OMIT_DEFAULTS: ClassVar[bool] = False  # every field at its default is left out ...
    ALWAYS_WRITTEN: ClassVar[tuple[str, ...]] = ()  # ... except these

    @classmethod
    def record_fields(cls) -> list[dataclasses.Field[Any]]:
        """The fields written to and read from JSON."""
        return [f for f in dataclasses.fields(cls) if not f.metadata.get("bookkeeping")]  # type: ignore[arg-type]

    @classmethod
    def json_keys(cls) -> list[str]:
        """The keys this record's JSON may hold (a flattened record's among them)."""
        keys: list[str] = []
        for f in cls.record_fields():
            flat = cls.FLATTENED.get(f.name)
            keys += flat.json_keys() if flat is not None else [f.name]
        return keys

    def to_json(self) -> JsonObject:
        data: JsonObject = {}
        for f in self.record_fields():
            value = getattr(self, f.name)
            if f.name in self.FLATTENED:
                data.update(value.to_json() if value is not None else {})
            elif not self._left_out(f, value):
                data[f.name] = _dump(value)
        return data

    def _left_out(self, f: dataclasses.Field[Any], value: Any) -> bool:
        if f.metadata.get("format"):
            return False
        if value is None and f.name in self.OMIT_IF_NONE:
            return True
        return self.OMIT_DEFAULTS and f.name not in self.ALWAYS_WRITTEN and _at_default(f, value)

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise RecordError(f"a {cls.__name__} record must be a mapping, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for f in cls.record_fields():
            if f.metadata.get("format"):
                cls._check_format(data.get(f.name, _first_version(str(f.default))), str(f.default))
            flat = cls.FLATTENED.get(f.name)
            if flat is not None:  # present when its required fields are
                inline = all(g.name in data for g in flat.record_fields() if _required(g))
                values[f.name] = flat.from_json({k: data[k] for k in flat.json_keys() if k in data}) if inline else None
                continue
            if f.name not in data:
                if _required(f):
                    raise RecordError(f"the {cls.__name__} record lacks its {f.name!r} field")
                continue
            values[f.name] = cls._load(f.name, data[f.name])
        return cls(**values)

    @classmethod
    def _check_format(cls, got: Any, current: str) -> None:
        if got != current:
            raise UnknownFormat(f"format {got!r} is not one this autotune reads (it reads {current})")

    @classmethod
    def _load(cls, name: str, value: Any) -> Any:
        """One field's value as read from JSON: the records it holds built, its lists made tuples."""
        if value is None:
            return None
        nested = cls.NESTED.get(name)
        if nested is not None:
            return [nested.from_json(v) for v in value] if isinstance(value, list) else nested.from_json(value)
        mapped = cls.NESTED_MAPS.get(name)
        if mapped is not None and isinstance(value, dict):
            return {k: mapped.from_json(v) for k, v in value.items()}
        if name in cls.TUPLES and isinstance(value, list):
            return tuple(value)
        return value


def _at_default(f: dataclasses.Field[Any], value: Any) -> bool:
    default = _default_of(f)
    return default is not dataclasses.MISSING and bool(value == default)


@dataclass(frozen=True)
class OpenRecord(Record):
    """A record of a file that lives long and travels (best.json, a job best.json keeps): the fields it does
    not know (a newer autotune wrote them) are kept in `extra` and written back; the fields the JSON it was
    read from lacked (an older autotune wrote it) read at their defaults and are left out again while still
    there, so reading and writing a file keeps it as it was."""

    extra: JsonObject = field(default_factory=dict, kw_only=True, repr=False, compare=False, metadata=_BOOKKEEPING)
    absent: tuple[str, ...] = field(default=(), kw_only=True, repr=False, compare=False, metadata=_BOOKKEEPING)

    @classmethod
    def from_json(cls: type[OpenT], data: Any) -> OpenT:
        if isinstance(data, cls):
            return data
        record = super().from_json(data)
        known = cls.json_keys()
        return dataclasses.replace(
            record,
            extra={k: v for k, v in data.items() if k not in known},
            absent=tuple(f.name for f in cls.record_fields() if f.name not in data and f.name not in cls.FLATTENED),
        )

    def to_json(self) -> JsonObject:
        return {**super().to_json(), **self.extra}

    def _left_out(self, f: dataclasses.Field[Any], value: Any) -> bool:
        return (f.name in self.absent and _at_default(f, value)) or super()._left_out(f, value)

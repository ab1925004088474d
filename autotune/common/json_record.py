"""A dataclass that travels as JSON (into the study's user attributes, best.json, a worker's result).

One `to_json` / `from_json` per record: a field read by a misspelt name is an AttributeError (and a
type error for mypy), not a silent None; a stored record lacking a required field is one clear
error naming the record and the field; fields a newer autotune added are ignored when read back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Record")


class RecordError(ValueError):
    """A stored record cannot be read: not a mapping, or a required field is missing."""


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


class Record:
    """Base of the JSON records; subclasses are dataclasses. `NESTED` names the fields that hold other
    records (or lists of them), so reading builds them too."""

    NESTED: ClassVar[dict[str, type[Record]]] = {}

    def to_json(self) -> dict[str, Any]:
        return {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise RecordError(f"a {cls.__name__} record must be a mapping, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"the {cls.__name__} record lacks its {f.name!r} field")
                continue
            value = data[f.name]
            nested = cls.NESTED.get(f.name)
            if nested is not None and value is not None:
                value = [nested.from_json(v) for v in value] if isinstance(value, list) else nested.from_json(value)
            values[f.name] = value
        return cls(**values)

"""The one way a record becomes its dict form (a JSON file's entry) and is read back from it.

A record is a dataclass. Its dict form holds its fields in order, the records it holds in their own dict
forms; the class's `OPTIONAL` names the entries only some records have, in groups each left out where the
record lacks the group's key (None), as the files always have. Reading back checks the required fields,
reads the old names of `RENAMED` under their new ones, takes `DEFAULTS` for required entries older files
lack, reads the entries of `RECORDS` as those records and drops keys of no field, so files written before
a field was added or renamed read unchanged. `Record` gives a record both as methods.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Self, TypeVar

from specbench.core.errors import SpecbenchError

R = TypeVar("R")


def plain(value: Any) -> Any:
    """A value read from a frame or parquet as the JSON reader gives it: lists, Python numbers, None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def required(cls: type) -> list[str]:
    """The fields every dict form of `cls` holds (no default)."""
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def _form(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, list):
        return [_form(v) for v in value]
    if isinstance(value, dict):
        return {k: _form(v) for k, v in value.items()}
    return value


def to_dict(record: Any) -> dict[str, Any]:
    """A record's dict form: each group of its OPTIONAL entries left out where the record lacks the group's key."""
    data = {f.name: getattr(record, f.name) for f in fields(record)}
    optional: dict[str, tuple[str, ...]] = getattr(record, "OPTIONAL", {})
    absent = {k for key, group in optional.items() if data[key] is None for k in group}
    return {k: _form(v) for k, v in data.items() if k not in absent}


def from_dict(cls: type[R], data: dict[str, Any], where: str) -> R:
    """A record from its dict form (a JSON entry, a frame's row); keys of no field are not the record's."""
    renamed: dict[str, str] = getattr(cls, "RENAMED", {})
    data = getattr(cls, "DEFAULTS", {}) | {renamed.get(k, k): v for k, v in data.items()}
    missing = [k for k in required(cls) if k not in data]
    if missing:
        raise SpecbenchError(f"{where} lack key(s): {', '.join(missing)}")
    records: dict[str, Any] = getattr(cls, "RECORDS", {})
    names = {f.name for f in fields(cls)}
    return cls(**{k: read(records[k], v, where) if k in records else plain(v) for k, v in data.items() if k in names})


def read(kind: Any, value: Any, where: str) -> Any:
    """An entry of RECORDS read back: `kind` is a record class, or `[cls]` for a list of them; None stays None."""
    if value is None:
        return None
    if isinstance(kind, list):
        return [from_dict(kind[0], v, where) for v in value]
    return from_dict(kind, value, where)


class Record:
    """A record written with `to_dict` and read with `from_dict`."""

    def as_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "a record") -> Self:
        return from_dict(cls, data, where)

"""JSON output of the CLI: exactly one document on stdout, 2-space indent plus newline."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Mapping
from datetime import date, datetime
from pathlib import PurePath
from typing import Any, TextIO

__all__ = ["emit", "jsonable"]


def jsonable(value: Any) -> Any:
    """Convert a value to JSON types: enums as bare names, times ISO 8601, paths as strings.

    Objects with a ``to_json()`` method are converted through it; dataclasses field by
    field, except a ``raw`` field (raw API payloads are never printed).
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return jsonable(to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "raw"}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


def emit(value: Any, stream: TextIO | None = None) -> None:
    """Write ``value`` as the command's one JSON document."""
    out = stream or sys.stdout
    out.write(json.dumps(jsonable(value), indent=2) + "\n")
    out.flush()

"""JSON documents from outside: parsed with a bound on how deeply they nest.

Everything cwtrain parses that a user, a variable or a remote peer wrote (request files,
``CWTRAIN_API_HEADERS``, API and completions answers, the local stack's request bodies,
NeMo Gym's files and requests) goes through :func:`load_json`::

    from cwtrain.jsondoc import load_json

    try:
        body = load_json(raw)                     # bytes or str
    except ValueError as exc:                     # not JSON, or nested too deeply
        raise UsageError(f"request file {name} is not valid JSON: {exc}") from None

``json.loads`` itself fails on a deeply nested document with ``RecursionError`` (not a
``ValueError``), and a document just under the interpreter's limit parses but breaks the
next recursive walk of it (``json.dumps``, a placeholder scan). :func:`load_json` refuses
any document nested deeper than :data:`MAX_DEPTH` with a ``ValueError`` before parsing it,
so callers need one ``except ValueError`` for every bad document. The check costs two
counts for most documents, and one regular-expression pass for those with many brackets.
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import accumulate
from typing import Any

__all__ = ["MAX_DEPTH", "JSONDepthError", "json_depth", "load_json"]

#: The deepest nesting of arrays and objects accepted (a request body nests 5-20 levels).
MAX_DEPTH = 128

# A JSON string (brackets inside it do not nest): the unrolled form runs in linear time.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Every byte but the four brackets is dropped; then [ and { count +1, ] and } count -1.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


class JSONDepthError(ValueError):
    """A JSON document nests arrays and objects deeper than allowed.

    Attributes:
        depth: the document's nesting depth (at least ``limit + 1``).
        limit: the deepest nesting allowed.
    """

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"it nests arrays and objects {depth} levels deep; at most {limit} are accepted")
        self.depth = depth
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.depth, self.limit))


def _as_bytes(data: str | bytes | bytearray | memoryview) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    raw = bytes(data)
    encoding = json.detect_encoding(raw)
    if encoding != "utf-8":  # UTF-16/32: scan the text as UTF-8
        return raw.decode(encoding, "replace").encode("utf-8")
    return raw


def json_depth(data: str | bytes | bytearray | memoryview) -> int:
    """The deepest nesting of arrays and objects in ``data`` (0 for a scalar), brackets inside
    strings left out. Malformed text gets a number too (its brackets counted as they stand)."""
    raw = _as_bytes(data)
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = array("b", brackets.translate(_STEPS))
    return max(0, max(accumulate(steps)))


def load_json(data: str | bytes | bytearray | memoryview, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, refusing documents nested deeper than ``max_depth``.

    Args:
        data: the document (text, or UTF-8/16/32 bytes as ``json.loads`` takes them).
        max_depth: the deepest nesting of arrays and objects accepted.

    Raises:
        JSONDepthError: (a ``ValueError``) the document nests deeper than ``max_depth``.
        ValueError: the text is not JSON (``json.JSONDecodeError``) or not decodable.
    """
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if isinstance(data, bytes):
        opening = data.count(b"[") + data.count(b"{")
    else:
        opening = data.count("[") + data.count("{")
    if opening > max_depth:  # fewer opening brackets than the limit cannot nest past it
        depth = json_depth(data)
        if depth > max_depth:
            raise JSONDepthError(depth, max_depth)
    try:
        return json.loads(data)
    except RecursionError:  # a lower interpreter limit than MAX_DEPTH needs
        raise JSONDepthError(max_depth + 1, max_depth) from None

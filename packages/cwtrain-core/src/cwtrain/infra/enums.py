"""Enumerations of the Dedicated Inference API v1alpha1 (service-api.md section 4).

Each enum knows its wire form (:attr:`~ApiEnum.wire`, what requests send) and parses
responses leniently with :meth:`~ApiEnum.parse`: the prefixed name, the bare name in
any case, any prefix ending in ``_<NAME>`` (``HOT_LOAD_REPLICA_STATE_READY``), an
integer or a digit string. Anything else becomes ``UNSPECIFIED`` and is logged once::

    >>> HotLoadState.parse("HOT_LOAD_STATE_COMPLETED")
    <HotLoadState.COMPLETED: 3>
    >>> SnapshotType.INCREMENTAL.wire
    'SNAPSHOT_TYPE_INCREMENTAL'
    >>> ConditionStatus.parse("True")
    <ConditionStatus.TRUE: 1>

The JSON views of the CLI print the bare name (``"READY"``).
"""

from __future__ import annotations

import enum
import logging
from typing import Self

__all__ = [
    "ApiEnum",
    "ChecksumFormat",
    "CompressionFormat",
    "ConditionStatus",
    "HotLoadState",
    "PromptCachePolicy",
    "ReplicaState",
    "ResourceStatus",
    "SnapshotType",
    "TransitionMode",
]

log = logging.getLogger(__name__)

_warned: set[tuple[str, str]] = set()

# Wire prefixes by enum class name (an attribute inside the class would become a member).
_PREFIXES = {
    "ResourceStatus": "STATUS_",
    "HotLoadState": "HOT_LOAD_STATE_",
    "SnapshotType": "SNAPSHOT_TYPE_",
    "CompressionFormat": "COMPRESSION_FORMAT_",
    "ChecksumFormat": "CHECKSUM_FORMAT_",
    "PromptCachePolicy": "PROMPT_CACHE_POLICY_",
    "TransitionMode": "TRANSITION_MODE_",
    "ReplicaState": "",
    "ConditionStatus": "STATUS_",
}


class ApiEnum(enum.IntEnum):
    """An API enum: integer values as in the proto, a wire prefix, lenient parsing."""

    @property
    def wire(self) -> str:
        """The name requests send (the prefixed proto name)."""
        return f"{_PREFIXES.get(type(self).__name__, '')}{self.name}"

    @classmethod
    def parse(cls, value: object) -> Self:
        """Read a response value; unknown values become ``UNSPECIFIED`` (logged once).

        Args:
            value: a string (prefixed or bare, any case), an integer, a digit string, an
                instance of this enum, or ``None``.
        """
        if isinstance(value, cls):
            return value
        if value is None or value == "":
            return cls["UNSPECIFIED"]
        if isinstance(value, bool):
            return cls._unknown(value)
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                return cls._unknown(value)
        if isinstance(value, str):
            text = value.strip()
            if text.isdigit():
                return cls.parse(int(text))
            upper = text.upper()
            if upper in cls.__members__:
                return cls[upper]
            for name in sorted(cls.__members__, key=len, reverse=True):
                if upper.endswith("_" + name):
                    return cls[name]
        return cls._unknown(value)

    @classmethod
    def _unknown(cls, value: object) -> Self:
        key = (cls.__name__, repr(value))
        if key not in _warned:
            _warned.add(key)
            log.warning("unknown %s value %r from the API; treating it as UNSPECIFIED", cls.__name__, value)
        return cls["UNSPECIFIED"]

    def __str__(self) -> str:
        return self.name


class ResourceStatus(ApiEnum):
    """``status.status`` of a gateway or deployment. ERROR is recoverable, FAILED terminal."""

    UNSPECIFIED = 0
    CREATING = 1
    UPDATING = 2
    DELETING = 3
    ERROR = 4
    FAILED = 5
    READY = 6


class HotLoadState(ApiEnum):
    """Aggregate state of a hot-load; COMPLETED, FAILED and CANCELED are terminal."""

    UNSPECIFIED = 0
    PENDING = 1
    IN_PROGRESS = 2
    COMPLETED = 3
    FAILED = 4
    CANCELED = 5

    @property
    def terminal(self) -> bool:
        """Whether the hot-load has ended."""
        return self in (HotLoadState.COMPLETED, HotLoadState.FAILED, HotLoadState.CANCELED)


class SnapshotType(ApiEnum):
    """FULL (a checkpoint) or INCREMENTAL (an XOR+zstd delta)."""

    UNSPECIFIED = 0
    FULL = 1
    INCREMENTAL = 2


class CompressionFormat(ApiEnum):
    """Compression of delta payloads."""

    UNSPECIFIED = 0
    ZSTD = 1


class ChecksumFormat(ApiEnum):
    """Per-tensor checksum of delta snapshots."""

    UNSPECIFIED = 0
    ADLER32 = 1


class PromptCachePolicy(ApiEnum):
    """What happens to the prompt cache on a hot-load (server default PRESERVE)."""

    UNSPECIFIED = 0
    RESET_ALL = 1
    PRESERVE = 2


class TransitionMode(ApiEnum):
    """How replicas switch to a new snapshot; only ASYNC exists."""

    UNSPECIFIED = 0
    ASYNC = 1


class ReplicaState(ApiEnum):
    """State of one replica during a hot-load; the wire form is the bare name."""

    UNSPECIFIED = 0
    PENDING_UPDATE = 1
    UPDATING = 2
    READY = 3
    ERROR = 4


class ConditionStatus(ApiEnum):
    """Status of a resource condition (the documented wire example is ``"True"``)."""

    UNSPECIFIED = 0
    TRUE = 1
    FALSE = 2
    UNKNOWN = 3

"""Snapshot and hot-load errors, re-exported from :mod:`cwtrain.errors` (same classes)."""

from __future__ import annotations

from cwtrain.errors import (
    HotLoadError,
    HotLoadFailedError,
    HotLoadTimeoutError,
    HotLoadVerificationError,
    MirrorError,
    SnapshotAccessError,
    SnapshotChecksumError,
    SnapshotConflictError,
    SnapshotError,
    SnapshotNotFoundError,
)

__all__ = [
    "HotLoadError",
    "HotLoadFailedError",
    "HotLoadTimeoutError",
    "HotLoadVerificationError",
    "MirrorError",
    "SnapshotAccessError",
    "SnapshotChecksumError",
    "SnapshotConflictError",
    "SnapshotError",
    "SnapshotNotFoundError",
]

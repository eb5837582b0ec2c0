"""Checkpoint hot-load: the snapshot format and codec, uploads, and :class:`HotLoader`.

Layers, bottom up: :mod:`~cwtrain.hotload.format` (wire format, no I/O beyond
files), :mod:`~cwtrain.hotload.codec` (XOR + zstd + Adler-32 on numpy buffers),
:mod:`~cwtrain.hotload.torch` (the same on torch tensors where they live),
:mod:`~cwtrain.hotload.mirror` (the trainer's copy of what replicas serve),
:mod:`~cwtrain.hotload.upload` (immutable, resumable uploads), and
:mod:`~cwtrain.hotload.loader` (publish, trigger, wait, rollback). Names are
resolved on first use so that importing this package stays cheap.
"""

from __future__ import annotations

from cwtrain.hotload import errors
from cwtrain.lazy import lazy_exports

_LAZY = {
    "HotLoader": "cwtrain.hotload.loader",
    "ProgressEvent": "cwtrain.hotload.follow",
    "SnapshotInfo": "cwtrain.hotload.inspect",
    "inspect_snapshot": "cwtrain.hotload.inspect",
    "delta_index_for_upload": "cwtrain.hotload.inspect",
    "snapshot_prefix": "cwtrain.hotload.identity",
    "SnapshotStore": "cwtrain.hotload.store",
    "upload_snapshot": "cwtrain.hotload.upload",
    "check_snapshot_access": "cwtrain.hotload.upload",
    "DeltaEncoder": "cwtrain.hotload.codec",
    "WeightMirror": "cwtrain.hotload.mirror",
    "DeltaReport": "cwtrain.hotload.mirror",
    "TensorData": "cwtrain.hotload.tensors",
    "DtypeWarning": "cwtrain.hotload.tensors",
}

__all__ = [
    "DeltaEncoder",
    "DeltaReport",
    "DtypeWarning",
    "HotLoader",
    "ProgressEvent",
    "SnapshotInfo",
    "SnapshotStore",
    "TensorData",
    "WeightMirror",
    "check_snapshot_access",
    "delta_index_for_upload",
    "inspect_snapshot",
    "snapshot_prefix",
    "upload_snapshot",
]
__all__ += errors.__all__  # the snapshot and hot-load errors (cwtrain.errors' classes)
_LAZY.update(dict.fromkeys(errors.__all__, "cwtrain.hotload.errors"))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

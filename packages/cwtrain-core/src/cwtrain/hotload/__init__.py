"""Checkpoint hot-load: the snapshot format and codec, uploads, and :class:`HotLoader`.

Layers, bottom up: :mod:`~cwtrain.hotload.format.index` (wire format, no I/O beyond
files), :mod:`~cwtrain.hotload.codec.encode` (XOR + zstd + Adler-32 on numpy buffers),
:mod:`~cwtrain.hotload.codec.device` (the same on torch tensors where they live),
:mod:`~cwtrain.hotload.files.mirror` (the trainer's copy of what replicas serve),
:mod:`~cwtrain.hotload.publish.upload` (immutable, resumable uploads), and
:mod:`~cwtrain.hotload.loader` (publish, trigger, wait, rollback). Names are
resolved on first use so that importing this package stays cheap.
"""

from __future__ import annotations

from cwtrain.hotload import errors
from cwtrain.lazy import lazy_exports

_LAZY = {
    "HotLoader": "cwtrain.hotload.loader",
    "ProgressEvent": "cwtrain.hotload.follow",
    "SnapshotInfo": "cwtrain.hotload.files.validate",
    "inspect_snapshot": "cwtrain.hotload.files.validate",
    "delta_index_for_upload": "cwtrain.hotload.files.validate",
    "snapshot_prefix": "cwtrain.hotload.format.identity",
    "SnapshotStore": "cwtrain.hotload.publish.store",
    "upload_snapshot": "cwtrain.hotload.publish.upload",
    "check_snapshot_access": "cwtrain.hotload.publish.upload",
    "DeltaEncoder": "cwtrain.hotload.codec.encode",
    "WeightMirror": "cwtrain.hotload.files.mirror",
    "DeltaReport": "cwtrain.hotload.files.mirror",
    "TensorData": "cwtrain.hotload.format.tensors",
    "DtypeWarning": "cwtrain.hotload.publish.tensor_checks",
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

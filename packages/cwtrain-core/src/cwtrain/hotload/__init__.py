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

from typing import TYPE_CHECKING

from cwtrain.hotload import errors
from cwtrain.lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names below, typed for checkers (nothing is imported at run time)
    from cwtrain.hotload.codec.device import tensor_data
    from cwtrain.hotload.format.identity import identity_version, version_identity
    from cwtrain.hotload.publish.distributed import RankShare, SharePlan, ShareResult, layout_by_sizes
    from cwtrain.hotload.publish.session import PublishOutcome, PublishSession, VersionPlan
    from cwtrain.hotload.settings import HotLoadSettings

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
    # the settings, the publish session and the distributed publisher every integration drives
    "HotLoadSettings": "cwtrain.hotload.settings",
    "PublishSession": "cwtrain.hotload.publish.session",
    "PublishOutcome": "cwtrain.hotload.publish.session",
    "VersionPlan": "cwtrain.hotload.publish.session",
    "RankShare": "cwtrain.hotload.publish.distributed",
    "SharePlan": "cwtrain.hotload.publish.distributed",
    "ShareResult": "cwtrain.hotload.publish.distributed",
    "layout_by_sizes": "cwtrain.hotload.publish.distributed",
    "identity_version": "cwtrain.hotload.format.identity",
    "version_identity": "cwtrain.hotload.format.identity",
    "tensor_data": "cwtrain.hotload.codec.device",  # needs torch (imported only when resolved)
}

__all__ = [
    "DeltaEncoder",
    "DeltaReport",
    "HotLoadSettings",
    "HotLoader",
    "ProgressEvent",
    "PublishOutcome",
    "PublishSession",
    "RankShare",
    "SharePlan",
    "ShareResult",
    "SnapshotInfo",
    "SnapshotStore",
    "VersionPlan",
    "WeightMirror",
    "check_snapshot_access",
    "delta_index_for_upload",
    "identity_version",
    "inspect_snapshot",
    "layout_by_sizes",
    "snapshot_prefix",
    "tensor_data",
    "upload_snapshot",
    "version_identity",
]
__all__ += errors.__all__  # the snapshot and hot-load errors (cwtrain.errors' classes)
_LAZY.update(dict.fromkeys(errors.__all__, "cwtrain.hotload.errors"))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

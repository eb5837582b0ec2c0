"""Checkpoint hot-load: the snapshot format and codec, uploads, the publish session and :class:`HotLoader`.

The public surface is what this package exports; plug-ins and ``cwtrain-local`` import
from here (a test holds them to it), and the modules behind it may move. The wings, bottom
up (``docs/internals.md`` maps every module):

* :mod:`~cwtrain.hotload.format` — the bytes on the wire: safetensors headers, the index,
  checksums, exact file reads, tensors, identities, chain rules;
* :mod:`~cwtrain.hotload.codec` — tensors to frames and back: the encoder, the decoders,
  zstd frames, the device path;
* :mod:`~cwtrain.hotload.files` — directories on disk: the one opener, writers,
  validation, the trainer's mirror of what is served;
* :mod:`~cwtrain.hotload.publish` — object storage and the cycle of one version: uploads,
  the store, manifests, the permission check, stored-object verification, the
  distributed publisher and :class:`PublishSession`;
* :mod:`~cwtrain.hotload.lifecycle.settings` (the hot-load settings, declared once) and
  :mod:`~cwtrain.hotload.loader` (:class:`HotLoader`, one deployment's hot-loads).

Names are resolved on first use, so importing this package stays cheap (no torch, no boto3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cwtrain.hotload import errors
from cwtrain.lazy import lazy_exports

if TYPE_CHECKING:  # the same names for type checkers (tests/test_imports.py keeps the three lists equal)
    from cwtrain.hotload.codec.decode import apply_delta, load_full
    from cwtrain.hotload.codec.device import TORCH_DTYPES, TorchDeltaEncoder, safetensors_dtype, tensor_data
    from cwtrain.hotload.codec.encode import DeltaEncoder
    from cwtrain.hotload.files.checkpoint import SnapshotDirectory, open_checkpoint, open_snapshot_dir, side_files
    from cwtrain.hotload.files.mirror import DeltaReport, WeightMirror
    from cwtrain.hotload.files.validate import SnapshotInfo, delta_index_for_upload, inspect_snapshot
    from cwtrain.hotload.files.write import checkpoint_checksums, write_delta, write_full_snapshot
    from cwtrain.hotload.follow import HotLoadStatus, ProgressEvent
    from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS
    from cwtrain.hotload.format.dtypes import DtypeWarning
    from cwtrain.hotload.format.identity import (
        RESERVED_IDENTITIES,
        identity_version,
        snapshot_prefix,
        split_version_identity,
        validate_identity,
        version_identity,
    )
    from cwtrain.hotload.format.index import (
        DEFAULT_SHARD_BYTES,
        INDEX_NAME,
        SINGLE_FILE_NAME,
        SnapshotFile,
        check_delta_metadata,
        generated_index_bytes,
        index_metadata,
        is_delta_index,
        parse_index,
        read_index_file,
    )
    from cwtrain.hotload.format.safetensors import header_of_bytes
    from cwtrain.hotload.format.tensors import FileRegion, TensorData, as_tensor_data
    from cwtrain.hotload.lifecycle.ahead import AHEAD_MAX_STALENESS, PublishAhead
    from cwtrain.hotload.lifecycle.cadence import (
        MAX_FULL_EVERY,
        ChainCadence,
        CutReason,
        FullEvery,
        check_full_every,
        parse_full_every,
    )
    from cwtrain.hotload.lifecycle.cycle import CyclePolicy, VersionCycle
    from cwtrain.hotload.lifecycle.protocol import (
        Collective,
        Ranks,
        SingleProcess,
        TorchCollective,
        publish_baseline_spmd,
        publish_shares,
        publish_spmd,
    )
    from cwtrain.hotload.lifecycle.rank import DEFAULT_CHUNK_BYTES, RankShare, chunked, host_copy
    from cwtrain.hotload.lifecycle.session import PublishSession
    from cwtrain.hotload.lifecycle.settings import (
        DEFAULT_TIMEOUT,
        HotLoadSettings,
        parse_prompt_cache_policy,
        validate_run_id,
    )
    from cwtrain.hotload.lifecycle.shares import SharePlan, ShareResult, layout_by_sizes
    from cwtrain.hotload.lifecycle.sources import DirectorySource, TensorSource, VersionSource
    from cwtrain.hotload.lifecycle.target import Target
    from cwtrain.hotload.lifecycle.version import PublishOutcome, VersionPlan
    from cwtrain.hotload.loader import HotLoader, build_loader
    from cwtrain.hotload.store.object_writer import SHA256_METADATA
    from cwtrain.hotload.store.prefix import SnapshotStore, StoredSnapshot
    from cwtrain.hotload.store.prefix_access import check_snapshot_access
    from cwtrain.hotload.store.prefix_manifests import snapshot_manifest
    from cwtrain.hotload.store.snapshot_upload import SnapshotUpload, upload_snapshot

_MODULES = {
    "cwtrain.hotload.loader": ("HotLoader", "build_loader"),
    "cwtrain.hotload.follow": ("HotLoadStatus", "ProgressEvent"),
    "cwtrain.hotload.lifecycle.settings": (
        "DEFAULT_TIMEOUT",
        "HotLoadSettings",
        "parse_prompt_cache_policy",
        "validate_run_id",
    ),
    "cwtrain.hotload.lifecycle.session": ("PublishSession",),
    "cwtrain.hotload.lifecycle.ahead": ("AHEAD_MAX_STALENESS", "PublishAhead"),
    "cwtrain.hotload.lifecycle.version": ("PublishOutcome", "VersionPlan"),
    "cwtrain.hotload.lifecycle.cycle": ("CyclePolicy", "VersionCycle"),
    "cwtrain.hotload.lifecycle.target": ("Target",),
    "cwtrain.hotload.lifecycle.sources": ("DirectorySource", "TensorSource", "VersionSource"),
    "cwtrain.hotload.lifecycle.cadence": (
        "MAX_FULL_EVERY",
        "ChainCadence",
        "CutReason",
        "FullEvery",
        "check_full_every",
        "parse_full_every",
    ),
    "cwtrain.hotload.lifecycle.protocol": (
        "Collective",
        "Ranks",
        "SingleProcess",
        "TorchCollective",
        "publish_baseline_spmd",
        "publish_shares",
        "publish_spmd",
    ),
    "cwtrain.hotload.lifecycle.rank": ("DEFAULT_CHUNK_BYTES", "RankShare", "chunked", "host_copy"),
    "cwtrain.hotload.lifecycle.shares": ("SharePlan", "ShareResult", "layout_by_sizes"),
    "cwtrain.hotload.store.prefix": ("SnapshotStore", "StoredSnapshot"),
    "cwtrain.hotload.format.dtypes": ("DtypeWarning",),
    "cwtrain.hotload.store.snapshot_upload": ("SnapshotUpload", "upload_snapshot"),
    "cwtrain.hotload.store.prefix_access": ("check_snapshot_access",),
    "cwtrain.hotload.store.object_writer": ("SHA256_METADATA",),
    "cwtrain.hotload.store.prefix_manifests": ("snapshot_manifest",),
    "cwtrain.hotload.files.validate": ("SnapshotInfo", "delta_index_for_upload", "inspect_snapshot"),
    "cwtrain.hotload.files.checkpoint": ("SnapshotDirectory", "open_checkpoint", "open_snapshot_dir", "side_files"),
    "cwtrain.hotload.files.write": ("checkpoint_checksums", "write_delta", "write_full_snapshot"),
    "cwtrain.hotload.files.mirror": ("DeltaReport", "WeightMirror"),
    "cwtrain.hotload.codec.encode": ("DeltaEncoder",),
    "cwtrain.hotload.codec.decode": ("apply_delta", "load_full"),
    "cwtrain.hotload.codec.device": ("TORCH_DTYPES", "TorchDeltaEncoder", "safetensors_dtype", "tensor_data"),
    "cwtrain.hotload.format.identity": (
        "RESERVED_IDENTITIES",
        "identity_version",
        "snapshot_prefix",
        "split_version_identity",
        "validate_identity",
        "version_identity",
    ),
    "cwtrain.hotload.format.chain": ("MAX_CHAIN_DELTAS",),
    "cwtrain.hotload.format.index": (
        "DEFAULT_SHARD_BYTES",
        "INDEX_NAME",
        "SINGLE_FILE_NAME",
        "SnapshotFile",
        "check_delta_metadata",
        "generated_index_bytes",
        "index_metadata",
        "is_delta_index",
        "parse_index",
        "read_index_file",
    ),
    "cwtrain.hotload.format.safetensors": ("header_of_bytes",),
    "cwtrain.hotload.format.tensors": ("FileRegion", "TensorData", "as_tensor_data"),
}

__all__ = [
    "AHEAD_MAX_STALENESS",
    "publish_shares",
    "publish_baseline_spmd",
    "chunked",
    "TorchCollective",
    "Ranks",
    "DEFAULT_CHUNK_BYTES",
    "VersionSource",
    "VersionCycle",
    "TensorSource",
    "Target",
    "DirectorySource",
    "CyclePolicy",
    "ChainCadence",
    "Collective",
    "CutReason",
    "DEFAULT_SHARD_BYTES",
    "DEFAULT_TIMEOUT",
    "DeltaEncoder",
    "DeltaReport",
    "DtypeWarning",
    "FileRegion",
    "FullEvery",
    "HotLoadSettings",
    "HotLoadStatus",
    "HotLoader",
    "INDEX_NAME",
    "MAX_CHAIN_DELTAS",
    "MAX_FULL_EVERY",
    "ProgressEvent",
    "PublishAhead",
    "PublishOutcome",
    "PublishSession",
    "RESERVED_IDENTITIES",
    "RankShare",
    "SHA256_METADATA",
    "SINGLE_FILE_NAME",
    "SharePlan",
    "ShareResult",
    "SingleProcess",
    "SnapshotDirectory",
    "SnapshotFile",
    "SnapshotInfo",
    "SnapshotStore",
    "SnapshotUpload",
    "StoredSnapshot",
    "TORCH_DTYPES",
    "TensorData",
    "TorchDeltaEncoder",
    "VersionPlan",
    "WeightMirror",
    "apply_delta",
    "as_tensor_data",
    "build_loader",
    "check_delta_metadata",
    "check_full_every",
    "check_snapshot_access",
    "checkpoint_checksums",
    "delta_index_for_upload",
    "generated_index_bytes",
    "header_of_bytes",
    "host_copy",
    "identity_version",
    "index_metadata",
    "inspect_snapshot",
    "is_delta_index",
    "layout_by_sizes",
    "load_full",
    "open_checkpoint",
    "open_snapshot_dir",
    "parse_full_every",
    "parse_index",
    "parse_prompt_cache_policy",
    "publish_spmd",
    "read_index_file",
    "safetensors_dtype",
    "side_files",
    "snapshot_manifest",
    "snapshot_prefix",
    "split_version_identity",
    "tensor_data",
    "upload_snapshot",
    "validate_identity",
    "validate_run_id",
    "version_identity",
    "write_delta",
    "write_full_snapshot",
]
_LAZY = {name: module for module, names in _MODULES.items() for name in names}
__all__ += errors.__all__  # the snapshot and hot-load errors (cwtrain.errors' classes)
_LAZY.update(dict.fromkeys(errors.__all__, "cwtrain.hotload.errors"))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

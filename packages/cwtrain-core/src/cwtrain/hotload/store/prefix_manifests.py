"""Snapshot manifests: ``P/_manifests/<identity>.json`` (snapshot-format.md section 8.1).

A manifest records the Adler-32 of every tensor of the full weights at an identity, so a
resumed baseline or a re-activated identity can be proven to hold the trainer's exact
weights. The API never reads it. Written create-only (``If-None-Match: *``; identical
content already there counts as success), JSON with sorted keys, one per line, no
indentation; ``HotLoader.upload_manifest`` / ``read_manifest`` are the usual entry points,
and :func:`snapshot_manifest` is the one builder of a manifest's content::

    manifest = snapshot_manifest("run1-v000012", "dep-1", "run1", checksums, version="000012")
    write_manifest(s3, "weights", "hotload", "run1-v000012", manifest)
    read_manifest(s3, "weights", "hotload", "run1-v000012")   # dict, or None when absent
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cwtrain.errors import SnapshotConflictError, SnapshotError
from cwtrain.hotload.format.identity import validate_identity
from cwtrain.hotload.format.index import CHECKSUM_FORMAT
from cwtrain.infra.objectstore import (
    ConditionalConflictError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreNotImplementedError,
)
from cwtrain.infra.s3 import ObjectStoreLike, as_object_store

__all__ = ["manifest_bytes", "manifest_key", "read_manifest", "snapshot_manifest", "write_manifest"]


def manifest_key(path_prefix: str, identity: str) -> str:
    """``P/_manifests/<identity>.json`` (``_manifests/<identity>.json`` when ``P`` is empty)."""
    validate_identity(identity)
    prefix = (path_prefix or "").strip("/")
    return f"{prefix}/_manifests/{identity}.json" if prefix else f"_manifests/{identity}.json"


def snapshot_manifest(
    identity: str,
    deployment_id: str,
    run_id: str,
    checksums: Mapping[str, str],
    version: str | None = None,
) -> dict[str, Any]:
    """The manifest of ``identity`` (section 8.1): who published it and every tensor's Adler-32.

    Args:
        identity: the snapshot identity.
        deployment_id: the deployment it was hot-loaded on.
        run_id: the run (identity prefix) that published it.
        checksums: tensor name -> Adler-32 (8 lowercase hex digits) of the full weights.
        version: the trainer's local version string (slime/miles: ``"000012"``); omitted when ``None``.

    Returns:
        the manifest, keys sorted and ``tensors`` sorted by name (what :func:`manifest_bytes` writes).
    """
    manifest: dict[str, Any] = {
        "checksum_format": CHECKSUM_FORMAT,
        "deployment_id": deployment_id,
        "identity": identity,
        "run_id": run_id,
        "tensors": dict(sorted(checksums.items())),
    }
    if version is not None:
        manifest["version"] = version
    return manifest


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """A manifest's bytes: JSON, sorted keys, one per line, no indentation."""
    return json.dumps(dict(manifest), sort_keys=True, indent=0).encode("utf-8")


def read_manifest(s3: ObjectStoreLike, bucket: str, path_prefix: str, identity: str) -> dict[str, Any] | None:
    """The manifest of ``identity``, or ``None`` when absent (other store errors raise)."""
    key = manifest_key(path_prefix, identity)
    try:
        body = as_object_store(s3).get(bucket, key)
    except ObjectNotFoundError:
        return None
    with body:
        value = json.loads(body.read())
    if not isinstance(value, dict):
        raise SnapshotError(f"manifest s3://{bucket}/{key} is not a JSON object")
    return value


def write_manifest(
    s3: ObjectStoreLike, bucket: str, path_prefix: str, identity: str, manifest: Mapping[str, Any]
) -> str:
    """Write the manifest create-only; returns its ``s3://`` URI.

    Args:
        s3: the object store (a boto3 client is wrapped).
        bucket: the hot-load bucket.
        path_prefix: the hot-load path prefix.
        identity: the snapshot identity.
        manifest: the manifest (see the module docstring).

    Raises:
        SnapshotConflictError: a different manifest is stored under this identity.
    """
    store = as_object_store(s3)
    key = manifest_key(path_prefix, identity)
    body = manifest_bytes(manifest)
    uri = f"s3://{bucket}/{key}"
    try:
        store.put(bucket, key, body, content_type="application/json", if_none_match=True)
        return uri
    except StoreNotImplementedError:
        if read_manifest(store, bucket, path_prefix, identity) is None:
            # A store without conditional writes: checked absent, then written.
            store.put(bucket, key, body, content_type="application/json")
            return uri
    except (PreconditionFailedError, ConditionalConflictError):
        pass  # stored already (or being stored): compared below
    existing = read_manifest(store, bucket, path_prefix, identity)
    if existing is not None and manifest_bytes(existing) == body:
        return uri
    raise SnapshotConflictError(identity, [f"{key} (a different manifest)"])

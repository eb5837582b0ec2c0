"""Model staging: copy a model from object storage to local disk before training.

The trainer reads ``--hf-checkpoint`` from disk; recipes stage it first with the command
line of :mod:`cwtrain.integrations.launch`
(``python -m cwtrain.integrations.launch stage-model s3://models/qwen3-4b /work/hf/base``)
or from Python::

    from cwtrain.integrations.staging import stage_from_s3

    stage_from_s3("s3://models/qwen3-4b", "/work/hf/base", workers=16)

It copies the objects directly under the prefix (not deeper) into ``DEST`` through
``DEST.partial``, renamed when complete, so an interrupted copy never looks finished.
When ``DEST/config.json`` exists nothing is copied. No objects under the prefix, or no
``config.json`` among them, is an error. The object-store client comes from
:func:`cwtrain.infra.s3.object_store` (``CW_S3_ENDPOINT``, ``AWS_*``) unless one is passed.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from cwtrain.errors import CWTrainError, UsageError

if TYPE_CHECKING:
    from cwtrain.infra.objectstore import ObjectStore
    from cwtrain.infra.s3 import ObjectStoreLike

__all__ = ["parse_s3_uri", "stage_from_s3"]

log = logging.getLogger(__name__)

_CONFIG = "config.json"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → ``(bucket, "prefix/")`` (the prefix empty or ending in ``/``).

    Raises:
        UsageError: not an ``s3://`` URI with a bucket.
    """
    if not uri.startswith("s3://"):
        raise UsageError(f"{uri!r} is not an s3:// URI (expected s3://<bucket>/<prefix>)")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise UsageError(f"{uri!r} names no bucket (expected s3://<bucket>/<prefix>)")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


def _list_direct(s3: ObjectStore, bucket: str, prefix: str) -> list[tuple[str, int]]:
    return [(o.key, o.size) for o in s3.list_objects(bucket, prefix, delimiter="/") if o.key != prefix]


def stage_from_s3(
    uri: str, dest: str | os.PathLike[str], *, workers: int = 16, s3: ObjectStoreLike | None = None
) -> Path:
    """Copy the objects directly under ``uri`` into ``dest`` (see the module docstring).

    Args:
        uri: ``s3://<bucket>/<prefix>``.
        dest: the local directory; left alone when ``dest/config.json`` exists.
        workers: objects downloaded in parallel.
        s3: the object store, or a boto3 client (default :func:`cwtrain.infra.s3.object_store`).

    Returns:
        ``dest``.

    Raises:
        UsageError: ``workers`` below 1, or ``uri`` not an ``s3://`` URI with a bucket.
        CWTrainError: no objects under the prefix, or no ``config.json`` among them.
    """
    target = Path(dest)
    if (target / _CONFIG).is_file():
        log.info("%s already holds a model (%s exists); nothing to copy", target, _CONFIG)
        return target
    if workers < 1:
        raise UsageError(f"--workers {workers} must be at least 1")
    bucket, prefix = parse_s3_uri(uri)
    from cwtrain.infra.s3 import as_object_store

    store = as_object_store(s3)
    objects = _list_direct(store, bucket, prefix)
    if not objects:
        raise CWTrainError(f"no objects directly under s3://{bucket}/{prefix}: check the URI and the credentials")
    names = {key[len(prefix) :]: key for key, _ in objects}
    if _CONFIG not in names:
        raise CWTrainError(f"s3://{bucket}/{prefix} has no {_CONFIG}: it does not look like a HuggingFace model")
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    total = sum(size for _, size in objects)
    log.info("copying %d objects (%d bytes) from s3://%s/%s to %s", len(objects), total, bucket, prefix, target)

    def fetch(item: tuple[str, str]) -> None:
        name, key = item
        path = partial / name
        tmp = path.with_name(path.name + ".tmp")
        store.download(bucket, key, tmp)
        os.replace(tmp, path)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cwtrain-stage") as pool:
        list(pool.map(fetch, sorted(names.items())))
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return target

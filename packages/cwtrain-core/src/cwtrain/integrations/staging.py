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

The checkpoint a deployment serves (its ``spec.model`` prefix, ``model_bucket`` and
``model_path`` in ``cwtrain deployment get``) is fetched the same way, with core alone
(``cwtrain deployment base-checkpoint --out DIR``)::

    from cwtrain.integrations.staging import fetch_base_checkpoint

    fetched = fetch_base_checkpoint("3b1d2c54-...", "base")   # BaseCheckpoint(path, source, ...)

Unlike :func:`stage_from_s3` it refuses a ``DIR`` that exists and is not an empty directory
(it never leaves a copy it did not make looking like the deployment's).
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cwtrain.errors import CWTrainError, UsageError

if TYPE_CHECKING:
    from cwtrain.infra.client import InferenceClient
    from cwtrain.infra.objectstore import ObjectStore
    from cwtrain.infra.s3 import ObjectStoreLike

__all__ = ["BaseCheckpoint", "fetch_base_checkpoint", "parse_s3_uri", "refuse_unless_new", "stage_from_s3"]

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


@dataclass(frozen=True)
class BaseCheckpoint:
    """What :func:`fetch_base_checkpoint` copied.

    Attributes:
        path: the local directory.
        source: the ``s3://bucket/path/`` it was copied from (the deployment's ``spec.model``).
        deployment_id: the deployment.
        model: the deployment's model name (its ``CWTRAIN_ROLLOUT_MODEL``).
        files: the file names in ``path``, sorted.
    """

    path: Path
    source: str
    deployment_id: str
    model: str
    files: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"path", "source", "deployment_id", "model", "files"}`` (what the CLI prints)."""
        return {
            "path": str(self.path),
            "source": self.source,
            "deployment_id": self.deployment_id,
            "model": self.model,
            "files": list(self.files),
        }


def refuse_unless_new(path: str | os.PathLike[str], label: str | None = None) -> None:
    """Refuse a ``path`` that exists and is not an empty directory: it cannot take a new copy.

    Args:
        path: the directory to copy into.
        label: how the error names it (e.g. ``"--out base"``; default the path).

    Raises:
        CWTrainError: ``<label> is not a directory`` or ``is not empty``; name a new or empty directory.
    """
    target = Path(path)
    if not target.exists():
        return
    problem = "is not a directory" if not target.is_dir() else "is not empty" if any(target.iterdir()) else None
    if problem is not None:
        raise CWTrainError(f"{label or target} {problem}; name a new or empty directory")


def fetch_base_checkpoint(
    deployment_id: str,
    out: str | os.PathLike[str],
    *,
    api: InferenceClient | None = None,
    s3: ObjectStoreLike | None = None,
    workers: int = 16,
) -> BaseCheckpoint:
    """Copy the checkpoint a deployment was created with (its ``spec.model`` prefix) into ``out``.

    The objects directly under ``s3://<model_bucket>/<model_path>/`` are copied through
    ``out.partial``, renamed when complete (:func:`stage_from_s3`).

    Args:
        deployment_id: the deployment.
        out: a directory that does not exist or is empty.
        api: the API client (default ``InferenceClient()``, from the environment; closed after).
        s3: the object store holding the model, or a boto3 client (default from the environment).
        workers: objects downloaded in parallel.

    Raises:
        CWTrainError: ``out`` exists and is not an empty directory, the deployment names no
            model source, or the prefix holds no model (no objects, no ``config.json``).
        APIError: the deployment cannot be read (``NotFoundError`` for an unknown id).
    """
    target = Path(out)
    refuse_unless_new(target)
    if api is None:
        from cwtrain.infra.client import InferenceClient

        with InferenceClient() as own:
            deployment = own.get_deployment(deployment_id)
    else:
        deployment = api.get_deployment(deployment_id)
    bucket, path = deployment.model_bucket.strip("/"), deployment.model_path.strip("/")
    if not bucket:
        raise CWTrainError(
            f"deployment {deployment_id} has no model source (spec.model names no bucket): no base checkpoint to fetch"
        )
    uri = f"s3://{bucket}/{path}/" if path else f"s3://{bucket}/"
    stage_from_s3(uri, target, workers=workers, s3=s3)
    files = tuple(sorted(p.name for p in target.iterdir()))
    return BaseCheckpoint(target, uri, deployment_id, deployment.model_name, files)

"""Preflight: prove the trainer may publish snapshots, before a long job starts.

Run it as the first step of a training job (the recipes do)::

    CWTRAIN_HOTLOAD_DEPLOYMENT_ID=3b1d2c54-... COREWEAVE_API_TOKEN=... AWS_REGION=US-EAST-04A \\
        python -m cwtrain.integrations.preflight

It reads the deployment (``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``) with the API token
(``COREWEAVE_API_TOKEN``, then ``CW_API_TOKEN``; ``COREWEAVE_API_URL``,
``CWTRAIN_API_HEADERS`` and ``CWTRAIN_API_INSECURE`` apply), takes its
``spec.hotLoad.bucket`` and ``pathPrefix``, and runs the permission check of spec
``snapshot-format.md`` section 9 (:func:`cwtrain.hotload.store.prefix_access.check_snapshot_access`)
with the standard object-storage settings (``AWS_REGION``, ``CW_S3_ENDPOINT``, the boto3
credential chain). The check lists the prefix, HEADs a random ``_preflight/`` key, creates
a multipart upload there and aborts it: nothing stays behind.

Success: stdout ``snapshot access OK: s3://<bucket>/<prefix>/ (list, read, multipart write
and abort)``, exit 0. Failure: stderr ``snapshot access check failed: <reason>``, exit 1.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cwtrain.config import env_str
from cwtrain.errors import ConfigError, CWTrainError, describe

if TYPE_CHECKING:
    from cwtrain.infra.client import InferenceClient
    from cwtrain.infra.s3 import ObjectStoreLike

__all__ = ["check_from_env", "main"]

log = logging.getLogger(__name__)


def check_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    client: InferenceClient | None = None,
    s3: ObjectStoreLike | None = None,
) -> str:
    """Run the permission check for the deployment named by the environment.

    Args:
        environ: environment to read (default ``os.environ``).
        client: an :class:`~cwtrain.infra.InferenceClient` (default: built from the environment).
        s3: the object store, or a boto3 client (default :func:`cwtrain.infra.s3.object_store`).

    Returns:
        The checked ``s3://<bucket>/<prefix>/``.

    Raises:
        ConfigError: no deployment id, or the deployment has no hot-load settings.
        SnapshotAccessError: the object store refused one of the four calls.
    """
    deployment_id = env_str("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", environ)
    if not deployment_id:
        raise ConfigError("CWTRAIN_HOTLOAD_DEPLOYMENT_ID is not set: export the id of the hot-load deployment")
    from cwtrain.hotload.store.prefix_access import check_snapshot_access
    from cwtrain.infra.client import InferenceClient

    if client is None:
        with InferenceClient() as own:
            deployment = own.get_deployment(deployment_id)
    else:
        deployment = client.get_deployment(deployment_id)
    settings = deployment.hot_load
    if settings is None or not settings.bucket:
        raise ConfigError(
            f"deployment {deployment_id} has no spec.hotLoad bucket: hot-load must be enabled when it is created"
        )
    return check_snapshot_access(s3, settings.bucket, settings.path_prefix)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``python -m cwtrain.integrations.preflight`` entry point; returns the exit code."""
    if list(argv if argv is not None else sys.argv[1:]):
        print("usage: python -m cwtrain.integrations.preflight  (configured by the environment)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        uri = check_from_env()
    except Exception as exc:
        if not isinstance(exc, (CWTrainError, OSError)):
            raise
        log.debug("preflight failed", exc_info=True)
        print(f"snapshot access check failed: {describe(exc)}", file=sys.stderr)
        return 1
    print(f"snapshot access OK: {uri} (list, read, multipart write and abort)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

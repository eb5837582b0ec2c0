"""The CoreWeave control plane and object store: client, models, lifecycle, S3 factory.

Layers, bottom up: :mod:`~cwtrain.infra.client` (:class:`InferenceClient`, one method
per endpoint of the Dedicated Inference API v1alpha1, safe retries, client-chosen
ids), :mod:`~cwtrain.infra.models` and :mod:`~cwtrain.infra.enums` (frozen, leniently
parsed views of the API's JSON), :mod:`~cwtrain.infra.lifecycle` (wait until READY,
rollout base URL, delete and wait until gone), :mod:`~cwtrain.infra.objectstore` (the
``ObjectStore`` protocol: the one seam under every object read and write) and
:mod:`~cwtrain.infra.s3` (``s3_client`` and ``object_store`` for CoreWeave AI Object
Storage, boto3 underneath)::

    from cwtrain.infra import InferenceClient, lifecycle

    api = InferenceClient()                     # COREWEAVE_API_TOKEN, COREWEAVE_API_URL
    dep = lifecycle.wait_for_deployment(api, "3b1d2c54-...")
    print(lifecycle.deployment_base_url(api, dep), dep.model_name)

``s3_client``, ``object_store`` and ``DEFAULT_S3_ENDPOINT`` are resolved on first use, so
importing this package does not import boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cwtrain.errors import LifecycleError
from cwtrain.infra import enums, lifecycle, models
from cwtrain.infra.client import (
    DEFAULT_BASE_URL,
    TOKEN_ENV_VAR,
    TOKEN_ENV_VARS,
    InferenceClient,
    token_from_env,
)
from cwtrain.infra.enums import *  # noqa: F403  (every API enum, listed in enums.__all__)
from cwtrain.infra.lifecycle import (
    delete_deployment,
    delete_gateway,
    endpoints,
    rollout_base_url,
    wait_for_deployment,
    wait_for_gateway,
)
from cwtrain.infra.models import *  # noqa: F403  (every API model, listed in models.__all__)
from cwtrain.infra.objectstore import ObjectStore
from cwtrain.lazy import lazy_exports

if TYPE_CHECKING:
    from cwtrain.infra.s3 import DEFAULT_S3_ENDPOINT, object_store, s3_client

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_S3_ENDPOINT",
    "TOKEN_ENV_VAR",
    "TOKEN_ENV_VARS",
    "InferenceClient",
    "LifecycleError",
    "ObjectStore",
    "delete_deployment",
    "delete_gateway",
    "endpoints",
    "lifecycle",
    "object_store",
    "rollout_base_url",
    "s3_client",
    "token_from_env",
    "wait_for_deployment",
    "wait_for_gateway",
]
__all__ += enums.__all__ + models.__all__

_LAZY = {"s3_client": "cwtrain.infra.s3", "object_store": "cwtrain.infra.s3", "DEFAULT_S3_ENDPOINT": "cwtrain.infra.s3"}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

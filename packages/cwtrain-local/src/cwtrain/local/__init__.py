"""cwtrain-local: the remote side of cwtrain on one machine.

Object storage (moto's S3 server), the v1alpha1 inference control plane, engine replicas
serving a tiny causal LM, and an OpenAI-compatible gateway, all on loopback, faithful to
the service contract, so every part of cwtrain runs for real in tests and in
``cwtrain demo``::

    from cwtrain.local import LocalStack

    with LocalStack(replicas=2) as stack:
        target = stack.deploy()
        ...

Command line: ``cwtrain local up [--replicas N] [--port P]``, ``cwtrain local down``,
``cwtrain demo``. Importing this package loads neither torch nor boto3; the names below
are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cwtrain.lazy import lazy_exports

if TYPE_CHECKING:
    from cwtrain.local.harness.faults import Faults
    from cwtrain.local.harness.objectstore import MotoS3Server
    from cwtrain.local.stack import DeployedModel, LocalStack

__all__ = ["DeployedModel", "Faults", "LocalStack", "MotoS3Server"]

_LAZY = {
    "LocalStack": "cwtrain.local.stack",
    "DeployedModel": "cwtrain.local.stack",
    "Faults": "cwtrain.local.harness.faults",
    "MotoS3Server": "cwtrain.local.harness.objectstore",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

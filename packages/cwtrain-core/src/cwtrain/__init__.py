"""cwtrain: reinforcement-learning training against a remote inference fleet.

Publish a trainer's weights to a CoreWeave Dedicated Inference deployment by
checkpoint hot-load, and sample rollouts from its OpenAI-compatible endpoint::

    from cwtrain import HotLoader, InferenceClient

    loader = HotLoader(InferenceClient(), deployment_id="3b1d2c54-...")
    loader.publish("checkpoints/step-7", identity="run1-v000007",
                   previous_identity="run1-v000006")

Weights in memory are a mapping of name to numpy array, torch tensor or
:class:`TensorData` (dtype name, shape, raw bytes: how BF16 goes over from numpy, which
has no bfloat16); see :meth:`HotLoader.publish` for what is checked before an upload.

``cwtrain`` and ``cwtrain.integrations`` are shared by several distributions
(``cwtrain-local``, ``cwtrain-slime``, ...); this package makes both extendable.
Importing ``cwtrain`` loads neither torch nor ray: the names below are resolved on
first use.
"""

from __future__ import annotations

import pkgutil
from typing import TYPE_CHECKING

from cwtrain._version import __version__
from cwtrain.lazy import lazy_exports

__path__ = pkgutil.extend_path(__path__, __name__)

if TYPE_CHECKING:
    from cwtrain.hotload.files.validate import inspect_snapshot
    from cwtrain.hotload.format.tensors import TensorData
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.hotload.store.snapshot_upload import upload_snapshot
    from cwtrain.infra.client import InferenceClient

__all__ = ["HotLoader", "InferenceClient", "TensorData", "__version__", "inspect_snapshot", "upload_snapshot"]

_LAZY = {
    "HotLoader": "cwtrain.hotload.loader",
    "InferenceClient": "cwtrain.infra.client",
    "TensorData": "cwtrain.hotload.format.tensors",
    "inspect_snapshot": "cwtrain.hotload.files.validate",
    "upload_snapshot": "cwtrain.hotload.store.snapshot_upload",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

"""cwtrain's NeMo-RL policy workers: publish weights from the GPU by hot-load.

Imports NeMo-RL and Ray at its top, so import it only inside NeMo-RL. Both classes are
Ray actors (decorated as NeMo-RL decorates its own workers) that add the methods of
:class:`~cwtrain.integrations.nemo_rl.worker_mixin.HotLoadWorkerMixin`:

- :class:`CoreWeaveDTensorPolicyWorker` subclasses ``DTensorPolicyWorkerV2Impl`` and
  walks ``dtensor_params_generator(self.model, self.dtype)``;
- :class:`CoreWeaveMegatronPolicyWorker` subclasses ``MegatronPolicyWorkerImpl`` and
  walks ``self._iter_params_with_optional_kv_scales()``.

Select one with ``Policy(..., worker_extension_cls_fqn=DTENSOR_WORKER_FQN)`` (the launcher
passes ``policy_factory=functools.partial(Policy, worker_extension_cls_fqn=...)`` to
``setup``) after :func:`cwtrain.integrations.nemo_rl.register_workers` registered the
names in NeMo-RL's actor environment registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray
import torch

from cwtrain.integrations.frameworks import NEMO_RL, require
from cwtrain.integrations.nemo_rl.worker_mixin import HotLoadWorkerMixin

_utils = require(NEMO_RL, "nemo_rl.models.policy.utils")
_dtensor = require(NEMO_RL, "nemo_rl.models.policy.workers.dtensor_policy_worker_v2")

__all__ = ["CoreWeaveDTensorPolicyWorker", "CoreWeaveMegatronPolicyWorker"]


class _DTensorImpl(HotLoadWorkerMixin, _dtensor.DTensorPolicyWorkerV2Impl):  # type: ignore[misc,name-defined]
    def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        return _dtensor.dtensor_params_generator(self.model, self.dtype)  # type: ignore[no-any-return]


CoreWeaveDTensorPolicyWorker = ray.remote(
    runtime_env=_utils.get_runtime_env_for_policy_worker("dtensor_policy_worker_v2")
)(_DTensorImpl)


def _megatron() -> Any:
    try:
        module = require(NEMO_RL, "nemo_rl.models.policy.workers.megatron_policy_worker")
    except ImportError:
        return None

    class _MegatronImpl(HotLoadWorkerMixin, module.MegatronPolicyWorkerImpl):  # type: ignore[misc,name-defined]
        def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
            return self._iter_params_with_optional_kv_scales()  # type: ignore[no-any-return]

    return ray.remote(runtime_env=_utils.get_runtime_env_for_policy_worker("megatron_policy_worker"))(_MegatronImpl)


#: ``None`` where NeMo-RL was installed without Megatron support.
CoreWeaveMegatronPolicyWorker = _megatron()

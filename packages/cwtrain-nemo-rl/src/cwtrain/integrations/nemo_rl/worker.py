"""cwtrain's NeMo-RL policy workers: publish weights from the GPU by hot-load.

Imports NeMo-RL and Ray at its top, so import it only inside NeMo-RL. Both classes are
Ray actors (decorated as NeMo-RL decorates its own workers) that add the methods of
:class:`~cwtrain.integrations.nemo_rl.worker_mixin.HotLoadWorkerMixin`:

- :data:`CoreWeaveDTensorPolicyWorker` subclasses ``DTensorPolicyWorkerV2Impl`` and
  walks ``dtensor_params_generator(self.model, self.dtype)``;
- :data:`CoreWeaveMegatronPolicyWorker` subclasses ``MegatronPolicyWorkerImpl`` and
  walks ``self._iter_params_with_optional_kv_scales()``.

Select one with ``Policy(..., worker_extension_cls_fqn=DTENSOR_WORKER_FQN)`` (the launcher
passes ``policy_factory=functools.partial(Policy, worker_extension_cls_fqn=...)`` to
``setup``) after :func:`cwtrain.integrations.nemo_rl.register_workers` registered the
names in NeMo-RL's actor environment registry.

Each worker is built only where NeMo-RL's module for it imports: this module is
imported inside the worker's own environment, and NeMo-RL's DTensor environment has no
Megatron while its Megatron environment has no ``nemo_automodel``. A worker whose base
does not import is ``None`` here, and :data:`IMPORT_ERRORS` says why; any exception
counts (a broken Transformer Engine raises ``AssertionError``, ``OSError`` or
``RuntimeError`` rather than ``ImportError``), so one worker's failure never hides the
other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import ray
import torch

from cwtrain.integrations.frameworks import require
from cwtrain.integrations.nemo_rl.framework import NEMO_RL
from cwtrain.integrations.nemo_rl.worker_mixin import HotLoadWorkerMixin

__all__ = ["IMPORT_ERRORS", "CoreWeaveDTensorPolicyWorker", "CoreWeaveMegatronPolicyWorker"]

log = logging.getLogger(__name__)

_DTENSOR_MODULE = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2"
_MEGATRON_MODULE = "nemo_rl.models.policy.workers.megatron_policy_worker"

#: NeMo-RL module -> the exception its import raised here (its worker is ``None``).
IMPORT_ERRORS: dict[str, BaseException] = {}


def _import(module_name: str) -> Any:
    try:
        return require(NEMO_RL, module_name)
    except Exception as exc:  # not only ImportError: see the module docstring
        IMPORT_ERRORS[module_name] = exc
        level = logging.DEBUG if isinstance(exc, ImportError) else logging.WARNING
        log.log(level, "%s does not import here (%s: %s); its cwtrain worker is None", module_name,
                type(exc).__name__, exc)  # fmt: skip
        return None


def _remote(worker_name: str, impl: type) -> Any:
    utils = require(NEMO_RL, "nemo_rl.models.policy.utils")
    return ray.remote(runtime_env=utils.get_runtime_env_for_policy_worker(worker_name))(impl)


def _dtensor() -> Any:
    module = _import(_DTENSOR_MODULE)
    if module is None:
        return None
    generator: Callable[..., Iterator[tuple[str, torch.Tensor]]] = module.dtensor_params_generator

    class _DTensorImpl(HotLoadWorkerMixin, module.DTensorPolicyWorkerV2Impl):  # type: ignore[misc,name-defined]
        def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
            return generator(self.model, self.dtype)

    return _remote("dtensor_policy_worker_v2", _DTensorImpl)


def _megatron() -> Any:
    module = _import(_MEGATRON_MODULE)
    if module is None:
        return None

    class _MegatronImpl(HotLoadWorkerMixin, module.MegatronPolicyWorkerImpl):  # type: ignore[misc,name-defined]
        def cwtrain_params(self) -> Iterator[tuple[str, torch.Tensor]]:
            return self._iter_params_with_optional_kv_scales()  # type: ignore[no-any-return]

    return _remote("megatron_policy_worker", _MegatronImpl)


#: ``None`` where NeMo-RL's DTensor v2 worker does not import (e.g. its Megatron environment).
CoreWeaveDTensorPolicyWorker = _dtensor()
#: ``None`` where NeMo-RL's Megatron worker does not import (no Megatron, or a broken
#: Transformer Engine).
CoreWeaveMegatronPolicyWorker = _megatron()

"""cwtrain-nemo-rl: NeMo-RL GRPO sampling from a CoreWeave deployment, weights by hot-load.

Install in the NeMo-RL (v0.7.0) image from a cwtrain checkout (``pip install
./packages/cwtrain-nemo-rl``), then apply the GRPO patch once
(``python -m cwtrain.integrations.nemo_rl.patch``) and set::

    policy:
      generation:
        backend: coreweave
        colocated: {enabled: true}
        coreweave_cfg:
          deployment_id: 3b1d2c54-...          # or CWTRAIN_HOTLOAD_DEPLOYMENT_ID
          base_url: https://.../v1             # or CWTRAIN_ROLLOUT_BASE_URL
          model: qwen3-4b                      # or CWTRAIN_ROLLOUT_MODEL
          max_model_len: 8192
          full_every: 20
    grpo:
      async_grpo: {enabled: false}

In the launcher, before ``setup``::

    from cwtrain.integrations.nemo_rl import install

    install()   # register the worker, wrap grpo.setup (policy worker + synchronizer), route refit

Pieces: :class:`CoreWeaveGeneration` (the ``GenerationInterface``),
:class:`HotLoadWeightSynchronizer` (refit by hot-load: FULL at step 0 and every
``full_every``, XOR deltas otherwise, published by every worker from its GPU tensors),
``CoreWeaveDTensorPolicyWorker`` / ``CoreWeaveMegatronPolicyWorker`` (in
:mod:`~cwtrain.integrations.nemo_rl.worker`), :func:`install_refit`, :func:`register_workers`,
:func:`worker_env` (ship cwtrain to NeMo-RL's per-role worker environments). Variables:
``CWTRAIN_ROLLOUT_*`` and ``CWTRAIN_HOTLOAD_*`` (config keys win; see
:mod:`~cwtrain.integrations.nemo_rl.config`). NeMo-RL itself is not a dependency:
importing a piece that needs it without it raises ``ImportError`` naming the install
(:func:`cwtrain.integrations.frameworks.require`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cwtrain.config import environ_or
from cwtrain.integrations.frameworks import NEMO_RL, require

if TYPE_CHECKING:
    from cwtrain.integrations.nemo_rl.refit import GrpoHooks

__all__ = [
    "DTENSOR_WORKER_FQN",
    "MEGATRON_WORKER_FQN",
    "CoreWeaveConfig",
    "CoreWeaveDTensorPolicyWorker",
    "CoreWeaveGeneration",
    "CoreWeaveMegatronPolicyWorker",
    "HotLoadWeightSynchronizer",
    "install",
    "install_refit",
    "register_workers",
    "worker_env",
]

DTENSOR_WORKER_FQN = "cwtrain.integrations.nemo_rl.worker.CoreWeaveDTensorPolicyWorker"
MEGATRON_WORKER_FQN = "cwtrain.integrations.nemo_rl.worker.CoreWeaveMegatronPolicyWorker"

_LAZY = {
    "CoreWeaveConfig": "cwtrain.integrations.nemo_rl.config",
    "CoreWeaveGeneration": "cwtrain.integrations.nemo_rl.generation",
    "HotLoadWeightSynchronizer": "cwtrain.integrations.nemo_rl.synchronizer",
    "CoreWeaveDTensorPolicyWorker": "cwtrain.integrations.nemo_rl.worker",
    "CoreWeaveMegatronPolicyWorker": "cwtrain.integrations.nemo_rl.worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cwtrain.integrations.nemo_rl' has no attribute {name!r}")
    return getattr(import_module(module), name)


def install(worker_fqn: str = DTENSOR_WORKER_FQN) -> GrpoHooks:
    """Everything a NeMo-RL launcher needs before ``grpo.setup``: register cwtrain's workers,
    wrap ``setup`` (policy built with ``worker_fqn``, synchronizer attached) and route
    ``grpo_train``'s refit through hot-load. Idempotent.

    Returns:
        the process's :class:`~cwtrain.integrations.nemo_rl.refit.GrpoHooks` (``uninstall()``
        puts NeMo-RL's functions back).
    """
    from cwtrain.integrations.nemo_rl.refit import grpo_hooks

    register_workers()
    hooks = grpo_hooks()
    hooks.install_setup(worker_fqn)
    hooks.install_refit()
    return hooks


def install_refit() -> Any:
    """Route ``grpo_train``'s refit through the hot-load synchronizer (see :mod:`.refit`)."""
    from cwtrain.integrations.nemo_rl.refit import grpo_hooks

    return grpo_hooks().install_refit()


def register_workers() -> None:
    """Register cwtrain's workers in NeMo-RL's actor environment registry.

    The DTensor worker runs in the ``AUTOMODEL`` environment, the Megatron worker in
    ``MCORE``, like the workers they extend.
    """
    registry = require(NEMO_RL, "nemo_rl.distributed.ray_actor_environment_registry").ACTOR_ENVIRONMENT_REGISTRY
    executables = require(NEMO_RL, "nemo_rl.distributed.virtual_cluster").PY_EXECUTABLES
    registry[DTENSOR_WORKER_FQN] = executables.AUTOMODEL
    registry[MEGATRON_WORKER_FQN] = executables.MCORE


def worker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for NeMo-RL's per-role worker venvs so they can import cwtrain.

    NeMo-RL starts workers in their own uv environments that do not have cwtrain
    installed; it passes the driver's ``PYTHONPATH`` on. This returns ``PYTHONPATH`` with
    the directories cwtrain's packages are imported from prepended (set it in the
    driver's environment before ``ray.init``), or use ``NEMO_RL_PY_EXECUTABLES_SYSTEM=1``
    to run every worker with the driver's interpreter.
    """
    import cwtrain

    roots: list[str] = []
    for path in cwtrain.__path__:
        root = str(Path(path).parent)
        if root not in roots:
            roots.append(root)
    existing = [p for p in environ_or(environ).get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(roots + [p for p in existing if p not in roots])}

"""cwtrain-nemo-rl: NeMo-RL GRPO sampling from a CoreWeave deployment, weights by hot-load.

Install in the NeMo-RL (v0.7.0) image from a cwtrain checkout (``pip install
./packages/cwtrain-gym ./packages/cwtrain-nemo-rl``), then apply the GRPO patch once
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
          full_every: auto
    grpo:
      async_grpo: {enabled: false}

In the launcher, before ``setup``::

    from cwtrain.integrations.nemo_rl import install

    install()   # register the worker, wrap grpo.setup (policy worker + synchronizer), route refit

Pieces: :class:`CoreWeaveGeneration` (the ``GenerationInterface``),
:class:`HotLoadWeightSynchronizer` (refit by hot-load: FULL at step 0 and when
``full_every`` cuts the chain, XOR deltas otherwise, published by every worker from its GPU tensors),
``CoreWeaveDTensorPolicyWorker`` / ``CoreWeaveMegatronPolicyWorker`` (in
:mod:`~cwtrain.integrations.nemo_rl.worker`), :func:`install_refit`, :func:`register_workers`
(cwtrain's workers get the prebuilt environments of the NeMo-RL workers they extend,
:func:`worker_executable`), :func:`worker_env` (ship cwtrain to those environments),
:mod:`~cwtrain.integrations.nemo_rl.metrics` (the run logger that writes ``hotload/*`` and
``coreweave/*``); with NeMo Gym, the generation starts cwtrain-gym's
:mod:`~cwtrain.integrations.gym.model_server` (the OpenAI endpoint NeMo Gym's model server
samples the deployment through). Variables:
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
from cwtrain.integrations.frameworks import require
from cwtrain.integrations.nemo_rl.framework import NEMO_RL

if TYPE_CHECKING:
    from cwtrain.integrations.nemo_rl.refit import GrpoHooks

__all__ = [
    "DTENSOR_WORKER_FQN",
    "MEGATRON_WORKER_FQN",
    "UPSTREAM_DTENSOR_WORKER_FQN",
    "UPSTREAM_MEGATRON_WORKER_FQN",
    "CoreWeaveConfig",
    "CoreWeaveDTensorPolicyWorker",
    "CoreWeaveGeneration",
    "CoreWeaveMegatronPolicyWorker",
    "HotLoadWeightSynchronizer",
    "install",
    "install_refit",
    "register_workers",
    "worker_env",
    "worker_executable",
]

DTENSOR_WORKER_FQN = "cwtrain.integrations.nemo_rl.worker.CoreWeaveDTensorPolicyWorker"
MEGATRON_WORKER_FQN = "cwtrain.integrations.nemo_rl.worker.CoreWeaveMegatronPolicyWorker"
#: NeMo-RL's workers that cwtrain's extend.
UPSTREAM_DTENSOR_WORKER_FQN = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
UPSTREAM_MEGATRON_WORKER_FQN = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
_UPSTREAM_WORKERS = {
    DTENSOR_WORKER_FQN: UPSTREAM_DTENSOR_WORKER_FQN,
    MEGATRON_WORKER_FQN: UPSTREAM_MEGATRON_WORKER_FQN,
}
_UPSTREAM_ENVIRONMENTS = {UPSTREAM_DTENSOR_WORKER_FQN: "AUTOMODEL", UPSTREAM_MEGATRON_WORKER_FQN: "MCORE"}

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


def register_workers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Register cwtrain's workers in NeMo-RL's actor environment registry.

    Each runs with the interpreter of the NeMo-RL worker it extends, never one built for
    it (:func:`worker_executable`): the DTensor worker with that of
    ``DTensorPolicyWorkerV2``, the Megatron worker with that of ``MegatronPolicyWorker``.

    Args:
        environ: variables to read instead of ``os.environ`` (``NEMO_RL_VENV_DIR``).

    Returns:
        cwtrain's worker name -> the executable registered for it.
    """
    registry = require(NEMO_RL, "nemo_rl.distributed.ray_actor_environment_registry").ACTOR_ENVIRONMENT_REGISTRY
    chosen = {ours: worker_executable(upstream, environ) for ours, upstream in _UPSTREAM_WORKERS.items()}
    registry.update(chosen)
    return chosen


def worker_executable(upstream_fqn: str, environ: Mapping[str, str] | None = None) -> str:
    """The interpreter NeMo-RL starts the worker ``upstream_fqn`` with, as a registry value.

    NeMo-RL's registry maps a worker to either an interpreter path (used as is) or a ``uv
    run`` command, for which it looks up ``<NEMO_RL_VENV_DIR>/<worker name>/bin/python``
    and builds that environment when it is missing (``uv sync`` of NeMo-RL's project).
    The image prebuilds one per NeMo-RL worker, named after *that* worker, so a worker of
    another name registered with the same command would get an environment built on first
    use. This returns, in order: NeMo-RL's own value when it is a path (e.g. the driver's
    interpreter under ``NEMO_RL_PY_EXECUTABLES_SYSTEM=1``, which NeMo-RL honours for its
    Megatron worker but not for its DTensor v2 worker); else the prebuilt
    ``<NEMO_RL_VENV_DIR>/<upstream_fqn>/bin/python`` when it exists (checked on this node;
    the image has the same environments on every node); else NeMo-RL's command unchanged
    (outside the image NeMo-RL then builds an environment, as it would for its own worker).
    """
    registry = require(NEMO_RL, "nemo_rl.distributed.ray_actor_environment_registry").ACTOR_ENVIRONMENT_REGISTRY
    executable = registry.get(upstream_fqn)
    if executable is None:  # not in NeMo-RL's registry: the environment NeMo-RL v0.7.0 gives that worker
        executables = require(NEMO_RL, "nemo_rl.distributed.virtual_cluster").PY_EXECUTABLES
        executable = getattr(executables, _UPSTREAM_ENVIRONMENTS.get(upstream_fqn, "SYSTEM"))
    executable = str(executable)
    if not executable.startswith("uv"):
        return executable
    default_dir = require(NEMO_RL, "nemo_rl.utils.venvs").DEFAULT_VENV_DIR
    venv_dir = os.path.normpath(environ_or(environ).get("NEMO_RL_VENV_DIR") or default_dir)
    prebuilt = os.path.join(venv_dir, upstream_fqn, "bin", "python")
    return prebuilt if os.path.isfile(prebuilt) else executable


def worker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for NeMo-RL's per-role worker venvs so they can import cwtrain.

    NeMo-RL starts policy workers in their own environments (the image's prebuilt ones,
    see :func:`worker_executable`), which do not have cwtrain installed; it passes the
    driver's whole environment, ``PYTHONPATH`` included, to every actor. This returns
    ``PYTHONPATH`` with the directories cwtrain's packages are imported from prepended:
    set it in the driver's environment before ``ray.init``. (``NEMO_RL_PY_EXECUTABLES_SYSTEM=1``
    does not replace this: it moves only NeMo-RL's vLLM, SGLang and Megatron workers to the
    driver's interpreter; the DTensor v2 worker keeps its own environment.)
    """
    import cwtrain

    roots: list[str] = []
    for path in cwtrain.__path__:
        root = str(Path(path).parent)
        if root not in roots:
            roots.append(root)
    existing = [p for p in environ_or(environ).get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(roots + [p for p in existing if p not in roots])}

"""Rebind two names of ``nemo_rl.algorithms.grpo`` for the coreweave backend.

::

    from cwtrain.integrations.nemo_rl.refit import grpo_hooks

    hooks = grpo_hooks()          # the process's hooks (found again once installed)
    hooks.install_setup(DTENSOR_WORKER_FQN)
    hooks.install_refit()
    ...
    hooks.uninstall()             # NeMo-RL's own functions are back

- :meth:`GrpoHooks.install_refit` — ``grpo_train`` calls ``refit_policy_generation`` by
  its module-global name when weights are stale. The wrapper calls
  ``policy_generation.weight_synchronizer.sync_weights(timer=..., kv_scales=...)`` for a
  :class:`~cwtrain.integrations.nemo_rl.generation.CoreWeaveGeneration` that has one;
  every other backend goes to NeMo-RL's own function, unchanged.
- :meth:`GrpoHooks.install_setup` — wraps ``setup`` so that with ``policy.generation.backend:
  coreweave`` the policy is built by ``functools.partial(Policy,
  worker_extension_cls_fqn=<worker>)`` and the generation gets a
  :class:`~cwtrain.integrations.nemo_rl.synchronizer.HotLoadWeightSynchronizer` seeded from
  ``policy.model_name`` (a local HF checkpoint). Other backends are untouched.

:class:`GrpoHooks` is the plug-in's only process state: the wrappers it put into
``nemo_rl.algorithms.grpo`` and NeMo-RL's functions they replaced. It lives on the
wrappers themselves, so :func:`grpo_hooks` finds the one installed (installing twice is a
no-op) and :meth:`GrpoHooks.uninstall` puts back exactly what it replaced. The module
functions :func:`install`, :func:`install_setup` and :func:`uninstall` do the same on
the process's hooks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cwtrain.integrations.frameworks import NEMO_RL, require
from cwtrain.integrations.nemo_rl.protocols import WorkerGroup

__all__ = ["GrpoHooks", "grpo_hooks", "install", "install_setup", "uninstall"]

# The attribute of an installed wrapper that holds its GrpoHooks.
_HOOKS = "__cwtrain_hooks__"
_REFIT = "refit_policy_generation"
_SETUP = "setup"


@dataclass
class GrpoHooks:
    """cwtrain's wrappers of ``nemo_rl.algorithms.grpo`` and the functions they replaced.

    Attributes:
        grpo: the ``nemo_rl.algorithms.grpo`` module.
        originals: name → NeMo-RL's function, for every name wrapped now.
    """

    grpo: ModuleType
    originals: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def _installed(self, name: str) -> Callable[..., Any] | None:
        current: Callable[..., Any] = getattr(self.grpo, name)
        return current if name in self.originals and getattr(current, _HOOKS, None) is self else None

    def _bind(self, name: str, wrapper: Callable[..., Any]) -> Callable[..., Any]:
        setattr(wrapper, _HOOKS, self)
        self.originals[name] = getattr(self.grpo, name)
        setattr(self.grpo, name, wrapper)
        return wrapper

    def install_refit(self) -> Callable[..., Any]:
        """Rebind ``grpo.refit_policy_generation``; returns the wrapper (the same one when installed)."""
        installed = self._installed(_REFIT)
        if installed is not None:
            return installed
        from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration

        original = getattr(self.grpo, _REFIT)

        @functools.wraps(original)
        def refit_policy_generation(
            policy: WorkerGroup,
            policy_generation: object,
            colocated_inference: bool,
            _refit_buffer_size_gb: float | None = None,
            timer: object | None = None,
            kv_scales: Mapping[str, float] | None = None,
        ) -> Any:
            sync = policy_generation.weight_synchronizer if isinstance(policy_generation, CoreWeaveGeneration) else None
            if sync is not None:
                return sync.sync_weights(timer=timer, kv_scales=kv_scales)
            return original(
                policy, policy_generation, colocated_inference, _refit_buffer_size_gb, timer=timer, kv_scales=kv_scales
            )

        return self._bind(_REFIT, refit_policy_generation)

    def install_setup(self, worker_fqn: str) -> Callable[..., Any]:
        """Wrap ``grpo.setup`` for the coreweave backend; returns the wrapper (the same one when installed)."""
        installed = self._installed(_SETUP)
        if installed is not None:
            return installed
        policy_cls = require(NEMO_RL, "nemo_rl.models.policy.lm_policy").Policy
        original = getattr(self.grpo, _SETUP)

        @functools.wraps(original)
        def setup(
            master_config: Mapping[str, Any],
            tokenizer: Any,
            dataset: Any,
            val_dataset: Any,
            processor: Any = None,
            policy_factory: Any = None,
        ) -> Any:
            policy_config = master_config["policy"]
            generation = policy_config["generation"] or {}
            coreweave = generation.get("backend") == "coreweave"
            if coreweave and policy_factory is None:
                policy_factory = functools.partial(policy_cls, worker_extension_cls_fqn=worker_fqn)
            result = original(
                master_config, tokenizer, dataset, val_dataset, processor=processor, policy_factory=policy_factory
            )
            if coreweave:
                from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
                from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

                policy, policy_generation = result[0], result[1]
                if isinstance(policy_generation, CoreWeaveGeneration) and policy_generation.weight_synchronizer is None:
                    HotLoadWeightSynchronizer(
                        policy, policy_generation, generation, hf_checkpoint=policy_config["model_name"]
                    )
            return result

        return self._bind(_SETUP, setup)

    def uninstall(self) -> None:
        """Put back NeMo-RL's functions where cwtrain's wrappers still stand."""
        for name, original in list(self.originals.items()):
            if self._installed(name) is not None:
                setattr(self.grpo, name, original)
            del self.originals[name]


def grpo_hooks() -> GrpoHooks:
    """The process's :class:`GrpoHooks`: the installed one, else a new one (nothing installed yet)."""
    grpo = require(NEMO_RL, "nemo_rl.algorithms.grpo")
    for name in (_REFIT, _SETUP):
        hooks = getattr(getattr(grpo, name, None), _HOOKS, None)
        if isinstance(hooks, GrpoHooks):
            return hooks
    return GrpoHooks(grpo)


def install() -> Callable[..., Any]:
    """Rebind ``nemo_rl.algorithms.grpo.refit_policy_generation``; returns the wrapper."""
    return grpo_hooks().install_refit()


def install_setup(worker_fqn: str) -> Callable[..., Any]:
    """Wrap ``nemo_rl.algorithms.grpo.setup`` for the coreweave backend; returns the wrapper."""
    return grpo_hooks().install_setup(worker_fqn)


def uninstall() -> None:
    """Put NeMo-RL's own ``refit_policy_generation`` and ``setup`` back."""
    grpo_hooks().uninstall()

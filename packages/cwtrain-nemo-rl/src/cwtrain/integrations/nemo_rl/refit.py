"""Rebind two names of ``nemo_rl.algorithms.grpo`` for the coreweave backend.

- :func:`install` — ``grpo_train`` calls ``refit_policy_generation`` by its
  module-global name when weights are stale. The wrapper calls
  ``policy_generation.weight_synchronizer.sync_weights(timer=..., kv_scales=...)`` for a
  generation that has one (the coreweave backend); every other backend goes to NeMo-RL's
  own function, unchanged.
- :func:`install_setup` — wraps ``setup`` so that with ``policy.generation.backend:
  coreweave`` the policy is built by ``functools.partial(Policy,
  worker_extension_cls_fqn=<worker>)`` and the generation gets a
  :class:`~cwtrain.integrations.nemo_rl.synchronizer.HotLoadWeightSynchronizer` seeded from
  ``policy.model_name`` (a local HF checkpoint). Other backends are untouched.

Both are idempotent; :func:`uninstall` puts NeMo-RL's own functions back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from cwtrain.integrations.nemo_rl._nemo import require

__all__ = ["install", "install_setup", "uninstall"]

_MARK = "__cwtrain_refit__"


def install() -> Callable[..., Any]:
    """Rebind ``nemo_rl.algorithms.grpo.refit_policy_generation``; returns the wrapper."""
    grpo = require("nemo_rl.algorithms.grpo")
    current = grpo.refit_policy_generation
    if getattr(current, _MARK, False):
        return current  # type: ignore[no-any-return]
    original = current

    @functools.wraps(original)
    def refit_policy_generation(
        policy: Any,
        policy_generation: Any,
        colocated_inference: bool,
        _refit_buffer_size_gb: Any = None,
        timer: Any = None,
        kv_scales: Any = None,
    ) -> Any:
        synchronizer = getattr(policy_generation, "weight_synchronizer", None)
        if synchronizer is not None:
            return synchronizer.sync_weights(timer=timer, kv_scales=kv_scales)
        return original(
            policy, policy_generation, colocated_inference, _refit_buffer_size_gb, timer=timer, kv_scales=kv_scales
        )

    setattr(refit_policy_generation, _MARK, True)
    refit_policy_generation.__cwtrain_original__ = original  # type: ignore[attr-defined]
    grpo.refit_policy_generation = refit_policy_generation
    return refit_policy_generation


def _section(config: Any, key: str) -> Any:
    """``config[key]`` for a dict config, ``config.key`` for NeMo-RL's MasterConfig object."""
    return config[key] if isinstance(config, Mapping) else getattr(config, key)


def install_setup(worker_fqn: str) -> Callable[..., Any]:
    """Wrap ``nemo_rl.algorithms.grpo.setup`` for the coreweave backend; returns the wrapper."""
    grpo = require("nemo_rl.algorithms.grpo")
    if getattr(grpo.setup, _MARK, False):
        return grpo.setup  # type: ignore[no-any-return]
    policy_cls = require("nemo_rl.models.policy.lm_policy").Policy
    original = grpo.setup

    @functools.wraps(original)
    def setup(
        master_config: Any,
        tokenizer: Any,
        dataset: Any,
        val_dataset: Any,
        processor: Any = None,
        policy_factory: Any = None,
    ) -> Any:
        policy_config = _section(master_config, "policy")
        generation = policy_config["generation"] or {}
        coreweave = generation.get("backend") == "coreweave"
        if coreweave and policy_factory is None:
            policy_factory = functools.partial(policy_cls, worker_extension_cls_fqn=worker_fqn)
        result = original(
            master_config, tokenizer, dataset, val_dataset, processor=processor, policy_factory=policy_factory
        )
        if coreweave:
            from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

            policy, policy_generation = result[0], result[1]
            if getattr(policy_generation, "weight_synchronizer", None) is None:
                HotLoadWeightSynchronizer(
                    policy, policy_generation, generation, hf_checkpoint=policy_config["model_name"]
                )
        return result

    setattr(setup, _MARK, True)
    setup.__cwtrain_original__ = original  # type: ignore[attr-defined]
    grpo.setup = setup
    return setup


def uninstall() -> None:
    """Put NeMo-RL's own ``refit_policy_generation`` and ``setup`` back."""
    grpo = require("nemo_rl.algorithms.grpo")
    for name in ("refit_policy_generation", "setup"):
        original = getattr(getattr(grpo, name, None), "__cwtrain_original__", None)
        if original is not None:
            setattr(grpo, name, original)

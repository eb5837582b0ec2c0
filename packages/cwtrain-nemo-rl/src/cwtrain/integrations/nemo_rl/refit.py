"""Route NeMo-RL's refit through the hot-load synchronizer for the coreweave backend.

``grpo_train`` calls ``refit_policy_generation`` by its module-global name in
``nemo_rl.algorithms.grpo`` when weights are stale. :func:`install` rebinds that name
to a wrapper: for a generation that has a ``weight_synchronizer`` (the coreweave
backend) it calls ``sync_weights(timer=..., kv_scales=...)``; every other backend goes
to NeMo-RL's own function, unchanged. Idempotent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from cwtrain.integrations.nemo_rl._nemo import require

__all__ = ["install", "uninstall"]

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


def uninstall() -> None:
    """Put NeMo-RL's own ``refit_policy_generation`` back."""
    grpo = require("nemo_rl.algorithms.grpo")
    original = getattr(grpo.refit_policy_generation, "__cwtrain_original__", None)
    if original is not None:
        grpo.refit_policy_generation = original

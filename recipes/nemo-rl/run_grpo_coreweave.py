"""Driver of the NeMo-RL recipe: NeMo-RL v0.7.0 GRPO with cwtrain's ``coreweave`` backend.

``launch.sh`` runs it on the Ray head after applying
``patches/nemo-rl-coreweave-backend.patch``::

    python run_grpo_coreweave.py --config grpo-coreweave.yaml [hydra overrides ...]

Before NeMo-RL's own ``examples/run_grpo.py`` runs (unchanged, through :mod:`runpy`), it:

1. registers cwtrain's policy worker (``CWTRAIN_POLICY_WORKER``, default
   ``cwtrain.integrations.nemo_rl.CoreWeaveDTensorPolicyWorker``) in
   ``ACTOR_ENVIRONMENT_REGISTRY`` as ``PY_EXECUTABLES.AUTOMODEL`` (``MCORE`` for the
   Megatron worker);
2. wraps ``nemo_rl.algorithms.grpo.setup`` so that with ``policy.generation.backend:
   coreweave`` the policy is built by ``functools.partial(Policy,
   worker_extension_cls_fqn=<worker>)`` and the generation gets a
   ``HotLoadWeightSynchronizer`` seeded from ``policy.model_name`` (a local HF checkpoint,
   published as ``<run>-v000000``);
3. rebinds ``nemo_rl.algorithms.grpo.refit_policy_generation`` (``grpo_train`` calls it by
   its module-global name) so a ``CoreWeaveGeneration`` syncs weights by hot-load; any
   other generation keeps NeMo-RL's refit.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from typing import Any

DEFAULT_WORKER = "cwtrain.integrations.nemo_rl.CoreWeaveDTensorPolicyWorker"


def install() -> None:
    """Apply the three rebindings above (importing NeMo-RL and cwtrain's integration)."""
    import nemo_rl.algorithms.grpo as grpo
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.models.policy.lm_policy import Policy

    from cwtrain.integrations.nemo_rl import CoreWeaveGeneration, HotLoadWeightSynchronizer

    worker = os.environ.get("CWTRAIN_POLICY_WORKER") or DEFAULT_WORKER
    megatron = worker.endswith("MegatronPolicyWorker")
    ACTOR_ENVIRONMENT_REGISTRY[worker] = PY_EXECUTABLES.MCORE if megatron else PY_EXECUTABLES.AUTOMODEL

    original_setup = grpo.setup
    original_refit = grpo.refit_policy_generation

    def setup(
        master_config: Any,
        tokenizer: Any,
        dataset: Any,
        val_dataset: Any,
        processor: Any = None,
        policy_factory: Any = None,
    ) -> Any:
        generation = master_config.policy["generation"] or {}
        coreweave = generation.get("backend") == "coreweave"
        if coreweave and policy_factory is None:
            policy_factory = functools.partial(Policy, worker_extension_cls_fqn=worker)
        result = original_setup(
            master_config, tokenizer, dataset, val_dataset, processor=processor, policy_factory=policy_factory
        )
        if coreweave:
            policy, policy_generation = result[0], result[1]
            if getattr(policy_generation, "weight_synchronizer", None) is None:
                policy_generation.weight_synchronizer = HotLoadWeightSynchronizer(
                    policy, policy_generation, generation, hf_checkpoint=master_config.policy["model_name"]
                )
        return result

    def refit_policy_generation(
        policy: Any,
        policy_generation: Any,
        colocated_inference: bool,
        _refit_buffer_size_gb: float | None = None,
        timer: Any = None,
        kv_scales: dict[str, float] | None = None,
    ) -> None:
        if isinstance(policy_generation, CoreWeaveGeneration):
            policy_generation.weight_synchronizer.sync_weights(timer=timer, kv_scales=kv_scales)
            return
        original_refit(
            policy, policy_generation, colocated_inference, _refit_buffer_size_gb, timer=timer, kv_scales=kv_scales
        )

    grpo.setup = setup
    grpo.refit_policy_generation = refit_policy_generation


def main() -> None:
    """Install the rebindings, then run NeMo-RL's ``examples/run_grpo.py`` with this process's arguments."""
    install()
    script = os.path.join(os.environ.get("NEMO_RL_DIR", "/opt/nemo-rl"), "examples", "run_grpo.py")
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

from typing import Any

CALLS: list[str] = []


def refit_policy_generation(
    policy: Any,
    policy_generation: Any,
    colocated_inference: bool,
    _refit_buffer_size_gb: Any = None,
    timer: Any = None,
    kv_scales: Any = None,
) -> None:
    CALLS.append("nemo-rl refit")


def grpo_train(policy: Any, policy_generation: Any, steps: int = 1) -> list[Any]:
    """Calls refit by its module-global name, as the real grpo_train does."""
    out = []
    for _ in range(steps):
        out.append(refit_policy_generation(policy, policy_generation, True, timer=None, kv_scales=None))
    return out


def setup(
    master_config: Any,
    tokenizer: Any,
    dataset: Any,
    val_dataset: Any,
    processor: Any = None,
    policy_factory: Any = None,
) -> tuple[Any, ...]:
    """Builds the policy through ``policy_factory`` and, for coreweave, the generation (the recipe patch)."""
    policy = policy_factory() if policy_factory is not None else "default policy"
    generation = master_config["policy"]["generation"]
    if generation["backend"] == "coreweave":
        from cwtrain.integrations.nemo_rl import CoreWeaveGeneration

        return policy, CoreWeaveGeneration(generation, tokenizer)
    return policy, None

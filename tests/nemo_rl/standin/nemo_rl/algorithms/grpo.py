from typing import Any

from nemo_rl.utils.logger import Logger

CALLS: list[str] = []


class Timer:
    """NeMo-RL's Timer as refit sees it: ``time(label)`` is a context manager."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def time(self, label: str) -> Any:
        timer = self

        class _Span:
            def __enter__(self) -> None:
                timer.labels.append(label)

            def __exit__(self, *exc: object) -> None:
                pass

        return _Span()


def refit_policy_generation(
    policy: Any,
    policy_generation: Any,
    colocated_inference: bool,
    _refit_buffer_size_gb: Any = None,
    timer: Any = None,
    kv_scales: Any = None,
) -> None:
    CALLS.append("nemo-rl refit")


def grpo_train(
    policy: Any,
    policy_generation: Any,
    logger: Any = None,
    steps: int = 1,
    timer: Any = None,
    batch: Any = None,
) -> None:
    """As the real grpo_train: each step refits by the module-global name (dropping what it returns),
    generates ``batch`` when given, trains the policy when it can, and logs the generation's logger
    metrics nested under ``generation_logger_metrics`` in the step's metrics."""
    logger = logger if logger is not None else Logger()
    for step in range(1, steps + 1):
        refit_policy_generation(policy, policy_generation, True, timer=timer, kv_scales=None)
        if hasattr(policy_generation, "clear_logger_metrics"):
            policy_generation.clear_logger_metrics()
        if batch is not None:
            policy_generation.generate(batch, greedy=False)
        logger.log_metrics({"mean_gen_tokens_per_sample": 1.0}, step, prefix="train")
        if hasattr(policy, "train"):
            policy.train(step)
        metrics: dict[str, Any] = {"loss": 0.5}
        if hasattr(policy_generation, "get_logger_metrics"):
            metrics["generation_logger_metrics"] = policy_generation.get_logger_metrics()
        logger.log_metrics(metrics, step, prefix="train")
        logger.log_metrics({"total_step_time": 1.0}, step, prefix="timing/train", step_finished=True)


def setup(
    master_config: Any,
    tokenizer: Any,
    dataset: Any,
    val_dataset: Any,
    processor: Any = None,
    policy_factory: Any = None,
) -> tuple[Any, ...]:
    """Builds the policy through ``policy_factory`` and, for coreweave, the generation (the recipe
    patch); returns v0.7.0's 13-tuple (policy, generation, gym actor, clusters, dataloader, val
    dataloader, loss, logger, checkpointer, state, config, teachers, aliases)."""
    policy = policy_factory() if policy_factory is not None else "default policy"
    generation_config = master_config["policy"]["generation"]
    generation = None
    if generation_config["backend"] == "coreweave":
        from cwtrain.integrations.nemo_rl import CoreWeaveGeneration

        generation = CoreWeaveGeneration(generation_config, tokenizer)
    state = {"total_steps": 0}
    return (policy, generation, None, (None, None), None, None, None, Logger(), None, state, master_config, None, None)


def compute_and_apply_seq_logprob_error_masking(
    train_data: Any, rewards: Any, seq_logprob_error_threshold: Any
) -> dict[str, Any]:
    """As the real one's signature and return; records the sample mask it was handed."""
    CALLS.append("nemo-rl masking")
    return {"max_seq_mult_prob_error": 1.0, "seen_sample_mask": train_data["sample_mask"].tolist()}

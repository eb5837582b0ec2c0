"""``CoreWeaveRolloutFn``: miles' class-based rollout API served by the deployment.

miles builds the class named by ``--rollout-function-path`` as
``cls(RolloutFnConstructorInput(args, data_source))`` and calls it (awaiting the result) with
``RolloutFnTrainInput(rollout_id, weight_version)``. :func:`make_rollout_fn_cls` derives the
class from miles' ``InferenceRolloutFn`` when first asked for, so importing cwtrain never
imports miles.

Each call takes ``--rollout-batch-size`` groups from the data source and sends one
``/v1/completions`` request per group (``n = --n-samples-per-prompt``) through the rollout
sampler, fills the samples, tags them with the served weight version and scores them with
miles' reward hooks. miles sizes ``GenerateState.generate_fn_semaphore`` from its local
rollout GPUs, which is zero here (and would hang every generate); the semaphore is replaced
by one of ``CWTRAIN_ROLLOUT_CONCURRENCY`` slots.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from cwtrain.errors import ConfigError
from cwtrain.integrations.slime.rollout import (
    process_sampler,
    run_sync,
    sample_groups_into,
    served_version,
    trainer_tokenizer,
)

__all__ = ["MILES_MISSING", "generate_rollout", "make_rollout_fn_cls"]

log = logging.getLogger(__name__)

MILES_MISSING = (
    "cwtrain.integrations.miles.CoreWeaveRolloutFn runs inside miles: install miles "
    '(the radixark/miles image ships it); cwtrain itself: pip install "cwtrain[miles]"'
)


def make_rollout_fn_cls(base: type[Any] | None = None) -> type[Any]:
    """Build ``CoreWeaveRolloutFn`` as a subclass of ``base`` (default: miles' ``InferenceRolloutFn``).

    Raises:
        ImportError: miles is not installed (naming the install).
    """
    if base is None:
        try:
            from miles.rollout.inference_rollout.inference_rollout_common import (  # type: ignore[import-not-found]
                InferenceRolloutFn,
            )
        except ImportError as exc:
            raise ImportError(MILES_MISSING) from exc
        base = InferenceRolloutFn

    class CoreWeaveRolloutFn(base):  # type: ignore[misc, valid-type]
        """miles rollout function sampling from the deployment's ``/v1/completions``."""

        def __init__(self, input: Any) -> None:
            super().__init__(input)
            from cwtrain.integrations.rollout import RolloutConfig

            self.args = input.args
            self.rollout_config = RolloutConfig.for_trainer(input.args)
            # miles sizes this from local rollout GPUs (zero here): bound work by our own budget
            self.state.generate_fn_semaphore = asyncio.Semaphore(self.rollout_config.concurrency)
            self.sampler = process_sampler(
                self.rollout_config, getattr(self.state, "tokenizer", None), int(input.args.n_samples_per_prompt)
            )

        async def __call__(self, input: Any) -> Any:
            if input.evaluation:
                raise ConfigError(
                    "evaluation rollouts are not served by cwtrain.integrations.miles.CoreWeaveRolloutFn: "
                    "unset --eval-interval"
                )
            return await self._call_train(input)

        async def _call_train(self, input: Any) -> Any:
            from miles.rollout import rm_hub  # type: ignore[import-not-found]
            from miles.rollout.base_types import RolloutFnTrainOutput  # type: ignore[import-not-found]

            args = self.args
            groups = self.data_source.get_samples(int(args.rollout_batch_size))
            version = await asyncio.to_thread(served_version, args)
            if version is None:
                version = input.weight_version
            metrics = await sample_groups_into(args, groups, rm=rm_hub, version=version, sampler=self.sampler)
            metrics["coreweave/rollout_id"] = float(input.rollout_id)
            return RolloutFnTrainOutput(samples=groups, metrics=metrics)

    CoreWeaveRolloutFn.__module__ = "cwtrain.integrations.miles"
    CoreWeaveRolloutFn.__qualname__ = "CoreWeaveRolloutFn"
    return CoreWeaveRolloutFn


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """The function-style rollout for ``MILES_USE_LEGACY_ROLLOUT_V1=1`` (miles wraps it in its adapter).

    Same behaviour as :class:`CoreWeaveRolloutFn`:
    ``--rollout-function-path cwtrain.integrations.miles.generate_rollout``.
    """
    try:
        from miles.rollout import rm_hub
        from miles.rollout.base_types import RolloutFnTrainOutput
    except ImportError as exc:
        raise ImportError(MILES_MISSING) from exc
    if evaluation:
        raise ConfigError("evaluation rollouts are not served by cwtrain.integrations.miles: unset --eval-interval")
    from cwtrain.integrations.rollout import RolloutConfig

    config = RolloutConfig.for_trainer(args)
    sampler = process_sampler(config, trainer_tokenizer(args), int(args.n_samples_per_prompt))
    groups = data_source.get_samples(int(args.rollout_batch_size))
    version = served_version(args)
    metrics = run_sync(sample_groups_into(args, groups, rm=rm_hub, version=version, sampler=sampler))
    metrics["coreweave/rollout_id"] = float(rollout_id)
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)

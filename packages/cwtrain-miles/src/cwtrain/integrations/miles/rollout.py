"""``CoreWeaveRolloutFn``: miles' class-based rollout API served by the deployment.

miles builds the class named by ``--rollout-function-path`` as
``cls(RolloutFnConstructorInput(args, data_source))`` and calls it (awaiting the result) with
``RolloutFnTrainInput(rollout_id, weight_version)``. :func:`make_rollout_fn_cls` derives the
class from miles' ``InferenceRolloutFn`` when first asked for, so importing cwtrain never
imports miles.

Each call takes ``--rollout-batch-size`` groups from the data source and sends one
``/v1/completions`` request per group (``n = --n-samples-per-prompt``) through the rollout
sampler, fills the samples, tags them with the served weight version (only this run's
identities become numbers, see :func:`cwtrain.integrations.rollout.version_tag`; the sampler
samples for the run, fences by ``CWTRAIN_ROLLOUT_MAX_STALENESS`` and reports the versions it
served in ``coreweave/served_version_*``) and scores them with miles' reward hooks. ``--use-session-server`` (miles' session server, which
slime does not have) is refused, like the other flags that replace the part of the rollout
cwtrain owns. miles sizes ``GenerateState.generate_fn_semaphore`` from its local
rollout GPUs, which is zero here (and would hang every generate); the semaphore is replaced
by one of ``CWTRAIN_ROLLOUT_CONCURRENCY`` slots.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any, cast

from cwtrain.errors import ConfigError
from cwtrain.integrations.frameworks import install_line, require
from cwtrain.integrations.miles.framework import MILES
from cwtrain.integrations.slime import REFUSED_FLAGS as SLIME_REFUSED_FLAGS
from cwtrain.integrations.slime import (
    DataSource,
    RewardHooks,
    SlimeRuntime,
    rollout_run_id,
    run_sync,
    sample_groups_into,
    served_version,
    trainer_sampler,
)

__all__ = ["MILES_MISSING", "REFUSED_FLAGS", "generate_rollout", "make_rollout_fn_cls"]

log = logging.getLogger(__name__)

REFUSED_FLAGS: tuple[str, ...] = (*SLIME_REFUSED_FLAGS, "--use-session-server")
"""miles' flags the rollout function refuses: slime's, and miles' own session server.

Every one is a flag of miles' parser (the contract suite checks).
"""

MILES_MISSING = (
    "cwtrain.integrations.miles.CoreWeaveRolloutFn runs inside miles "
    f"({MILES.where}); install the plug-in from a cwtrain checkout: {install_line(MILES.plugin)}"
)
"""What is missing when miles is not importable (the message :func:`require` raises says the same)."""


def make_rollout_fn_cls(base: type[Any] | None = None) -> type[Any]:
    """Build ``CoreWeaveRolloutFn`` as a subclass of ``base`` (default: miles' ``InferenceRolloutFn``).

    Raises:
        ImportError: miles is not installed (naming the install).
    """
    if base is None:
        base = require(MILES, "miles.rollout.inference_rollout.inference_rollout_common").InferenceRolloutFn

    class CoreWeaveRolloutFn(base):  # type: ignore[misc, valid-type]
        """miles rollout function sampling from the deployment's ``/v1/completions``."""

        def __init__(self, input: Any) -> None:
            super().__init__(input)
            from cwtrain.integrations.rollout import RolloutConfig

            self.args = input.args
            self.rollout_config = RolloutConfig.for_trainer(input.args)
            # miles sizes this from local rollout GPUs (zero here): bound work by our own budget
            self.state.generate_fn_semaphore = asyncio.Semaphore(self.rollout_config.concurrency)
            self.sampler = SlimeRuntime.current().sampler(
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
            rm_hub = cast(RewardHooks, require(MILES, "miles.rollout.rm_hub"))
            base_types = require(MILES, "miles.rollout.base_types")

            args = self.args
            groups = self.data_source.get_samples(int(args.rollout_batch_size))
            served = await asyncio.to_thread(served_version, args)
            version = served if served is not None else input.weight_version
            run_id = await asyncio.to_thread(rollout_run_id, args)
            metrics = await sample_groups_into(
                args, groups, rm=rm_hub, version=version, sampler=self.sampler, run_id=run_id, published=served
            )
            metrics["coreweave/rollout_id"] = float(input.rollout_id)
            return base_types.RolloutFnTrainOutput(samples=groups, metrics=metrics)

    CoreWeaveRolloutFn.__module__ = "cwtrain.integrations.miles"
    CoreWeaveRolloutFn.__qualname__ = "CoreWeaveRolloutFn"
    return CoreWeaveRolloutFn


def generate_rollout(
    args: argparse.Namespace, rollout_id: int, data_source: DataSource, evaluation: bool = False
) -> Any:
    """The function-style rollout for ``MILES_USE_LEGACY_ROLLOUT_V1=1`` (miles wraps it in its adapter).

    Same behaviour as :class:`CoreWeaveRolloutFn`:
    ``--rollout-function-path cwtrain.integrations.miles.generate_rollout``.

    Raises:
        ImportError: miles is not installed (naming the install).
        ConfigError: a refused flag is set, or ``evaluation`` is requested.
    """
    rm_hub = cast(RewardHooks, require(MILES, "miles.rollout.rm_hub"))
    base_types = require(MILES, "miles.rollout.base_types")
    if evaluation:
        raise ConfigError("evaluation rollouts are not served by cwtrain.integrations.miles: unset --eval-interval")
    sampler = trainer_sampler(args)
    groups = data_source.get_samples(int(args.rollout_batch_size))
    version = served_version(args)
    run_id = rollout_run_id(args)
    metrics = run_sync(
        sample_groups_into(args, groups, rm=rm_hub, version=version, sampler=sampler, run_id=run_id, published=version)
    )
    metrics["coreweave/rollout_id"] = float(rollout_id)
    return base_types.RolloutFnTrainOutput(samples=groups, metrics=metrics)

"""Remote rollouts for slime: ``--rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout``.

slime calls :func:`generate_rollout` with its contract
``generate_rollout(args, rollout_id, data_source, evaluation=False)``. Each call takes
``--rollout-batch-size`` groups from ``data_source.get_samples``, sends **one**
``/v1/completions`` request per group with ``n = --n-samples-per-prompt`` through the rollout
sampler (:mod:`cwtrain.integrations.rollout`), fills every ``Sample`` with its ``fill_group`` (``tokens``,
``response``, ``response_length``, ``rollout_log_probs``, ``rollout_routed_experts``,
``status``) and appends the weight version that served it to ``weight_versions``. Rewards
come from slime's own reward hooks (``--custom-rm-path``, ``--rm-type``, ``--group-rm``).

Flags to copy::

    --rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout
    --rollout-num-gpus 0                     # no local engines (slime starts only its router)
    --rollout-top-p 1.0                      # other values need a patched SGLang's token ids
    --apply-chat-template                    # prompts are strings, tokenised by the trainer

slime sizes its own rollout semaphore from the engine count (zero here); this function never
uses it, it bounds its requests by ``CWTRAIN_ROLLOUT_CONCURRENCY``.

Refused, naming the flag (they replace the part of the rollout cwtrain owns; slime has no
``--use-session-server``, a fork that has one refuses it in its own plug-in):
``--custom-generate-function-path``, ``--dynamic-sampling-filter-path``,
``--rollout-sample-filter-path``, ``--rollout-all-samples-process-path``, and
``--over-sampling-batch-size`` above ``--rollout-batch-size``. ``--use-tis``,
``--use-rollout-logprobs`` and ``--get-mismatch-metrics`` make log-probs required (and need
``--rollout-temperature 1.0``). A slime run that could never publish (no local engine and an
unpatched slime, see :func:`~cwtrain.integrations.slime.barrier.check_standalone_publish`)
is refused at the first rollout, before any training step.

Variables: ``CWTRAIN_ROLLOUT_BASE_URL``, ``CWTRAIN_ROLLOUT_MODEL`` (required) and the other
``CWTRAIN_ROLLOUT_*`` of the sampler (``CWTRAIN_ROLLOUT_MAX_STALENESS`` among them). Each
sample's ``weight_versions`` gets the version that served it, for off-policy correction: the
endpoint's ``x-cwtrain-snapshot-identity`` when it sends one, else the deployment's current
identity (``CWTRAIN_HOTLOAD_DEPLOYMENT_ID``), else the hook's state directory. Only this run's
identities become version numbers (``"7"`` for ``<run>-v000007``,
:func:`cwtrain.integrations.rollout.version_tag`); another run's identity, or ``initial``, is
tagged as it is, so it never counts as one of this run's versions. The run id is
:func:`rollout_run_id`'s; the sampler samples for it, and learns the version the deployment
serves as the newest one published (the trainer's publish path tells it newer ones), so
``CWTRAIN_ROLLOUT_MAX_STALENESS`` fences samples from the first rollout on, on both sides (a
version newer than that one is re-requested too, unless the deployment, asked again, says it
serves it: a hot-load that completed while the rollout ran). The batch's ``coreweave/served_version_*``,
``coreweave/stale_rerequested``, ``coreweave/unpublished_rerequested`` and
``coreweave/mixed_groups_resampled`` go to slime's rollout metrics, beside ``hotload/*``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from cwtrain.config import env_str
from cwtrain.errors import ConfigError
from cwtrain.hotload import identity_version
from cwtrain.integrations.frameworks import require
from cwtrain.integrations.nvext import recorded_run_id, recorded_version
from cwtrain.integrations.rollout import run_sync
from cwtrain.integrations.slime.framework import SLIME

from .barrier import check_standalone_publish
from .canary import save_ledger
from .config import HookConfig, shared_run_id, state_dir_for, state_dir_of
from .runtime import PromptTokenizer, SlimeRuntime

if TYPE_CHECKING:
    from cwtrain.integrations.rollout import CompletionSampler, Prompt, SamplingParams

__all__ = [
    "REFUSED_FLAGS",
    "DataSource",
    "RewardHooks",
    "generate_rollout",
    "prompt_of",
    "rollout_run_id",
    "run_sync",
    "sample_groups_into",
    "sampling_params",
    "served_version",
    "set_tokenizer",
    "trainer_sampler",
]

log = logging.getLogger(__name__)

REFUSED_FLAGS: tuple[str, ...] = (
    "--custom-generate-function-path",
    "--dynamic-sampling-filter-path",
    "--rollout-sample-filter-path",
    "--rollout-all-samples-process-path",
)
"""slime's flags the rollout function refuses: they replace the part of the rollout cwtrain owns.

Every one is a flag of slime's parser (the contract suite checks); ``--over-sampling-batch-size``
is refused only above ``--rollout-batch-size``.
"""


class DataSource(Protocol):
    """slime's data source (or a fork's) as the rollout function uses it."""

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        """``num_samples`` groups of ``Sample`` objects (one prompt each)."""
        ...


class RewardHooks(Protocol):
    """slime's ``rm_hub`` module (or a fork's): the reward hooks (``--custom-rm-path``, ``--rm-type``)."""

    async def async_rm(self, args: argparse.Namespace, sample: Any) -> Any:
        """The reward of one sample."""
        ...

    async def batched_async_rm(self, args: argparse.Namespace, samples: list[Any]) -> list[Any]:
        """The rewards of one group (``--group-rm``)."""
        ...


def set_tokenizer(tokenizer: PromptTokenizer | None) -> None:
    """Use ``tokenizer`` (``encode(text, add_special_tokens=False)``, ``decode``) for prompts.

    By default the trainer's tokenizer is loaded from ``--hf-checkpoint`` with transformers;
    without one (or with ``None``), prompts are sent as text and the endpoint's prompt token
    ids are used. Kept by the process's runtime until ``cwtrain.integrations.slime.reset()``.
    """
    SlimeRuntime.current().set_tokenizer(tokenizer)


def _state_dir(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    return state_dir_of(args, env) or state_dir_for("")


def rollout_run_id(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str | None:
    """The run id the rollout side tags samples against, or ``None`` when it cannot be told.

    :func:`~cwtrain.integrations.slime.config.shared_run_id` (``CWTRAIN_HOTLOAD_RUN_ID``, else
    one derived from the wandb run id), else the run of the identity the hook recorded in its
    state directory (the hook's own run id, when the rollout runs on the trainer's node).
    """
    env = os.environ if environ is None else environ
    return shared_run_id(args, env) or recorded_run_id(_state_dir(args, env))


def served_version(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int | None:
    """The version of this run the deployment serves now, or ``None`` when it cannot be told.

    Asks the control plane for the current identity when ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID`` is
    set, else reads the ``served_identity`` file the hook keeps in its state directory. An
    identity of another run (see :func:`rollout_run_id`) gives ``None``.
    """
    env = dict(os.environ if environ is None else environ)
    run_id = rollout_run_id(args, env)
    if run_id is None:
        return None
    if env_str("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", env):
        try:
            from cwtrain.hotload import build_loader

            loader = build_loader(HookConfig.from_env(env, default_run_id=run_id))
            try:
                return identity_version(loader.current_identity(), run_id)
            finally:
                loader.client.close()
        except Exception as exc:
            log.warning("could not ask the deployment which identity it serves: %s", exc)
    return recorded_version(_state_dir(args, env), run_id)


def prompt_of(sample: Any, tokenizer: PromptTokenizer | None) -> Prompt:
    """The prompt to send for ``sample``: its token ids when it has them or a tokenizer can make them."""
    from cwtrain.integrations.rollout import Prompt

    if getattr(sample, "tokens", None):
        return Prompt(ids=tuple(int(t) for t in sample.tokens), text=sample.prompt or None)
    prompt = sample.prompt
    if not isinstance(prompt, str):
        raise ConfigError(
            "a sample's prompt is a list of messages: cwtrain sends token ids of a string prompt; "
            "pass --apply-chat-template so slime renders the chat template"
        )
    if tokenizer is not None:
        return Prompt(ids=tuple(tokenizer.encode(prompt, add_special_tokens=False)), text=prompt)
    return Prompt(text=prompt)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The sampler's settings from slime's rollout flags (a fork's are the same)."""
    from cwtrain.integrations.rollout import SamplingParams

    stop = getattr(args, "rollout_stop", None) or ()
    stop_ids = getattr(args, "rollout_stop_token_ids", None) or ()
    return SamplingParams(
        max_tokens=int(args.rollout_max_response_len),
        temperature=float(getattr(args, "rollout_temperature", 1.0)),
        top_p=float(getattr(args, "rollout_top_p", 1.0)),
        top_k=max(0, int(getattr(args, "rollout_top_k", -1) or 0)),
        stop=tuple(stop),
        stop_token_ids=tuple(int(t) for t in stop_ids),
        include_stop_str_in_output=bool(stop),
    )


def trainer_sampler(args: argparse.Namespace) -> CompletionSampler:
    """The process's sampler for this run's flags and tokenizer (kept by the runtime across steps).

    Raises:
        ConfigError: a flag cannot work with remote rollouts.
    """
    from cwtrain.integrations.rollout import RolloutConfig

    state = SlimeRuntime.current()
    config = RolloutConfig.for_trainer(args)
    return state.sampler(config, state.tokenizer(args), int(args.n_samples_per_prompt))


async def sample_groups_into(
    args: argparse.Namespace,
    groups: Sequence[Sequence[Any]],
    *,
    rm: RewardHooks,
    version: int | None,
    sampler: CompletionSampler | None = None,
    run_id: str | None = None,
    published: int | None = None,
) -> dict[str, float]:
    """Sample every group with one request each, fill its samples, then score them.

    Args:
        args: slime's namespace, or a fork's.
        groups: lists of ``Sample`` sharing one prompt each; filled in place.
        rm: the framework's reward module (``async_rm``, ``batched_async_rm``).
        version: the samples' version when the endpoint does not report one.
        sampler: the sampler to use (default: the process's, :func:`trainer_sampler`).
        run_id: this run's id: the sampler samples for it (an identity the endpoint reports
            becomes a version number only when it is this run's); ``None`` keeps the
            sampler's run, and without one identities are recorded as they are.
        published: this run's version the deployment serves now, which was published:
            the sampler's newest version until the publish path tells it a newer one.

    Returns:
        the ``coreweave/*`` metrics of the batch.
    """
    from cwtrain.integrations.rollout import fill_group

    if sampler is None:
        sampler = trainer_sampler(args)
    if run_id is not None:
        sampler.set_run(run_id)
    if published is not None and sampler.run_id is not None:
        sampler.note_published(published)  # the deployment serves it: at least this one was published
    if env_str("CWTRAIN_HOTLOAD_DEPLOYMENT_ID"):  # a newer version seen mid-rollout: asked, not guessed
        sampler.look_up_published(lambda: served_version(args))
    tokenizer: PromptTokenizer | None = sampler.tokenizer
    prompts = [prompt_of(group[0], tokenizer) for group in groups]
    params = sampling_params(args)
    started = time.perf_counter()
    batch = await sampler.sample_groups(prompts, [len(group) for group in groups], params)
    save_ledger(args, sampler)  # who served each sample, for the train ranks' sample canary
    for group, completions in zip(groups, batch.groups, strict=True):
        fill_group(group, completions)  # tokens, response, status, log-probs, routes, served version
        for sample, completion in zip(group, completions, strict=True):
            if completion.identity is None and version is not None:  # the endpoint did not say
                sample.weight_versions.append(str(version))
    await _score(args, groups, rm)
    metrics = dict(batch.metrics)
    metrics.setdefault("coreweave/generation_seconds", time.perf_counter() - started)
    return metrics


async def _score(args: argparse.Namespace, groups: Sequence[Sequence[Any]], rm: RewardHooks) -> None:
    """Rewards through the framework's own hooks (``--custom-rm-path``, ``--group-rm``)."""
    if getattr(args, "group_rm", False):
        for group in groups:
            rewards = await rm.batched_async_rm(args, list(group))
            for sample, reward in zip(group, rewards, strict=True):
                sample.reward = reward
        return
    pending = [sample for group in groups for sample in group if sample.reward is None]
    rewards = await asyncio.gather(*(rm.async_rm(args, sample) for sample in pending))
    for sample, reward in zip(pending, rewards, strict=True):
        sample.reward = reward


def generate_rollout(
    args: argparse.Namespace, rollout_id: int, data_source: DataSource, evaluation: bool = False
) -> Any:
    """slime's rollout function: one completions request per group, rewards by slime's hooks.

    Args:
        args: slime's namespace.
        rollout_id: the rollout step.
        data_source: slime's data source (``get_samples(n) -> list[list[Sample]]``).
        evaluation: evaluation rollouts are not served by cwtrain (unset ``--eval-interval``).

    Returns:
        ``RolloutFnTrainOutput(samples, metrics)`` with ``--rollout-batch-size`` groups.

    Raises:
        ImportError: slime is not installed (naming the install).
        ConfigError: a refused flag is set, ``evaluation`` is requested, or the run could never
            publish (no local engine, unpatched slime).
        RolloutError: sampling failed.
    """
    rm_hub = cast(RewardHooks, require(SLIME, "slime.rollout.rm_hub"))
    base_types = require(SLIME, "slime.rollout.base_types")
    if evaluation:
        raise ConfigError(
            "evaluation rollouts are not served by cwtrain.integrations.slime.rollout: unset --eval-interval "
            "(or point --eval-function-path at your own evaluation)"
        )
    check_standalone_publish(args)
    groups = data_source.get_samples(int(args.rollout_batch_size))
    version = served_version(args)
    run_id = rollout_run_id(args)
    metrics = run_sync(sample_groups_into(args, groups, rm=rm_hub, version=version, run_id=run_id, published=version))
    metrics["coreweave/rollout_id"] = float(rollout_id)
    if version is not None:
        metrics["coreweave/served_version"] = float(version)
    return base_types.RolloutFnTrainOutput(samples=groups, metrics=metrics)

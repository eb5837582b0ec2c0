"""cwtrain for slime: publish every weight version by hot-load, sample rollouts remotely.

slime trains with Megatron under Ray and normally pushes weights into local SGLang engines.
With cwtrain there are no local engines: each weight version slime writes is published to a
CoreWeave Dedicated Inference deployment by checkpoint hot-load, and rollouts come from the
deployment's ``/v1/completions``.

Flags to copy (delta mode, recommended; slime carrying the recipe's patch)::

    python train.py ... \\
      --hf-checkpoint /models/Qwen3-4B \\
      --update-weight-mode delta --update-weight-transport disk \\
      --update-weight-disk-dir /shared/run1/weights \\
      --update-weight-local-checkpoint-dir /tmp/run1-local \\
      --update-weight-delta-encoding xor --update-weight-delta-checksum adler32 \\
      --update-weight-standalone-publish \\
      --custom-update-weight-post-write-path cwtrain.integrations.slime.hook \\
      --custom-megatron-init-path cwtrain.integrations.slime.init_hook \\
      --rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout \\
      --rollout-num-gpus 0

Without local engines slime's ``update_weights()`` returns before its updater (and so the
hook) runs; ``recipes/slime/patches/slime-standalone-publish.patch`` adds
``--update-weight-standalone-publish``, which runs it anyway. An unpatched slime drops the
flag silently (it ignores unknown flags): ``init_hook`` and the rollout function stop such a
run at start. ``python -m cwtrain.integrations.slime.launch`` (live tensors) needs no patch.
Megatron's argument check needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor parallelism in
the job's environment (``ray job submit --runtime-env-json``), as slime's own scripts set it.

Full mode (each version a complete HF checkpoint) works too:
``--update-weight-mode full --update-weight-transport disk --update-weight-disk-dir DIR``.

Entry points, all loadable the way slime loads them (``module.attr``):

* ``cwtrain.integrations.slime.hook`` - the post-write hook, ``hook(args, version_dir,
  rollout_engines)``. The first call (slime's delta root, rank 0) publishes ``--hf-checkpoint``
  as ``<run>-v000000``; each ``weight_vNNNNNN`` is then published as a delta over what the
  replicas serve, empty deltas are skipped, and a FULL snapshot from the served copy kept in
  the state directory cuts the chain when ``CWTRAIN_HOTLOAD_FULL_EVERY`` says (``auto``, the
  default: when a delta costs nearly a FULL, when a cold start would replay more than two
  FULLs of deltas, or after 19 deltas; or every N versions). Only rank 0 publishes; its ``hotload/*`` metrics go to the run's logger
  (slime's wandb/TensorBoard, :mod:`~cwtrain.integrations.slime.tracking`), since slime
  discards what the hook returns. See :mod:`~cwtrain.integrations.slime.publisher`.
* ``cwtrain.integrations.slime.actor_hook`` - the same, handed to a long-lived Ray actor on
  the trainer node so upload and hot-load overlap the next step (at most one step ahead;
  a failure raises at the next step). See :mod:`~cwtrain.integrations.slime.actor`.
* ``cwtrain.integrations.slime.init_hook`` - for ``--custom-megatron-init-path``: the other
  ranks wait in slime's gloo barrier while rank 0 publishes, and slime creates that group
  with torch's 30-minute default, not ``--distributed-timeout-minutes``; this gives it
  max(``--distributed-timeout-minutes``, 2 × ``CWTRAIN_HOTLOAD_TIMEOUT``) on every rank.
  See :mod:`~cwtrain.integrations.slime.barrier`. It also installs the sample canary, which
  judges each served version from the log-probs slime computes before the loss and refuses a
  wrong one (:mod:`~cwtrain.integrations.slime.canary`).
* ``cwtrain.integrations.slime.rollout.generate_rollout`` - slime's rollout function, one
  ``/v1/completions`` request per GRPO group. See :mod:`~cwtrain.integrations.slime.rollout`.
* ``python -m cwtrain.integrations.slime.launch train.py ARGS`` - runs slime's ``train.py``
  with a ``MegatronTrainRayActor`` subclass whose ``update_weights()`` publishes from the
  model's tensors (no HF export to disk, no patch). See
  :mod:`~cwtrain.integrations.slime.train_actor`.

Variables (``CWTRAIN_HOTLOAD_*`` for publishing, ``CWTRAIN_ROLLOUT_*`` for rollouts; see
:mod:`~cwtrain.integrations.slime.config`)::

    export CWTRAIN_HOTLOAD_DEPLOYMENT_ID=3b1d2c54-...   COREWEAVE_API_TOKEN=...
    export CWTRAIN_HOTLOAD_RUN_ID=grpo-a                # identities grpo-a-v000000, -v000001, ...
    export CWTRAIN_ROLLOUT_BASE_URL=https://.../v1     CWTRAIN_ROLLOUT_MODEL=Qwen3-4B
    export AWS_REGION=US-EAST-04A                       # plus object-storage credentials

Nothing here imports slime, Ray or torch until it is used; a missing one raises
``ImportError`` naming the install (:func:`cwtrain.integrations.frameworks.require`).

What the plug-in keeps between calls (the run's publisher, the actor client, the tokenizer
and samplers) lives in one object per process, ``SlimeRuntime.current()``
(:class:`~cwtrain.integrations.slime.runtime.SlimeRuntime`); :func:`reset` starts it over.

A fork of slime with the same namespace and hook calls reuses these entry points: its
plug-in registers a :class:`~cwtrain.integrations.slime.dialect.Dialect` (its gloo group,
its logger, its delta flag), which the hooks pick for its runs
(:mod:`~cwtrain.integrations.slime.dialect`).
"""

from __future__ import annotations

from typing import Any

from .barrier import init_hook
from .config import HookConfig, is_rank_zero, state_dir_for
from .dialect import SLIME_DIALECT, Dialect, dialect_of
from .post_write import actor_hook, drain, hook
from .publisher import SlimePublisher
from .rollout import (
    REFUSED_FLAGS,
    DataSource,
    RewardHooks,
    rollout_run_id,
    run_sync,
    sample_groups_into,
    served_version,
    trainer_sampler,
)
from .runtime import SlimeRuntime, default_run_id, reset
from .tracking import log_metrics

# What the plug-in of a fork of slime reuses: the same hooks, rollout glue and logger calls on the
# same argument namespace, its Dialect saying what differs (docs/internals.md says why).
__all__ = [
    "REFUSED_FLAGS",
    "SLIME_DIALECT",
    "DataSource",
    "Dialect",
    "HookConfig",
    "RewardHooks",
    "SlimePublisher",
    "SlimeRuntime",
    "actor_hook",
    "default_run_id",
    "dialect_of",
    "drain",
    "hook",
    "init_hook",
    "is_rank_zero",
    "log_metrics",
    "make_actor_cls",
    "reset",
    "rollout_run_id",
    "run_sync",
    "sample_groups_into",
    "served_version",
    "state_dir_for",
    "trainer_sampler",
]


def make_actor_cls(base: type[Any] | None = None) -> type[Any]:
    """The ``MegatronTrainRayActor`` subclass that publishes from live tensors (see ``train_actor``).

    Raises:
        ImportError: slime, or a module its actor needs, is not importable (named, with the fix).
    """
    from .train_actor import make_actor_cls as make

    return make(base)

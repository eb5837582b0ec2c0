"""cwtrain for miles: publish weight versions by hot-load, sample rollouts from the deployment.

Flags to copy (``--update-weight-transfer-mode disk-delta``; ``--colocate``, PD and LoRA are
rejected by miles in this mode)::

    python train.py ... \\
      --hf-checkpoint /models/Qwen3-4B \\
      --update-weight-transfer-mode disk-delta \\
      --update-weight-disk-dir /shared/run1/weights \\
      --update-weight-local-checkpoint-dir /tmp/run1-local \\
      --update-weight-delta-encoding xor --update-weight-delta-checksum adler32 \\
      --custom-update-weight-post-write-path cwtrain.integrations.miles.hook \\
      --custom-megatron-init-path cwtrain.integrations.miles.init_hook \\
      --rollout-function-path cwtrain.integrations.miles.CoreWeaveRolloutFn \\
      --rollout-num-gpus 0 --sglang-config zero-engines.yaml

No local engines: ``--rollout-num-gpus 0`` alone fails miles' server-group check (a group
needs GPUs), so ``--sglang-config`` names a YAML whose model has no server groups::

    sglang:
      - name: default
        server_groups: []

miles then starts only its router, and its ``update_weights()`` still runs the updater and
the hook (no patch). Not ``--debug-train-only`` (``update_weights`` returns at once), not a
``placeholder`` worker (it reserves GPUs). Megatron's argument check needs
``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor parallelism in the job's environment
(``ray job submit --runtime-env-json``). miles rejects unknown flags, so every flag must exist
in the image's miles.

Entry points (miles loads ``module.attr``; a class is built with
``RolloutFnConstructorInput(args, data_source)``):

* ``cwtrain.integrations.miles.hook`` - the post-write hook, the very function of
  ``cwtrain.integrations.slime.hook`` (same call pattern and delta format in miles): baseline
  ``<run>-v000000`` from ``--hf-checkpoint``, then a delta per version, FULL when
  ``CWTRAIN_HOTLOAD_FULL_EVERY`` cuts the chain, empty deltas skipped, rank 0 only. miles' ``update_weights``
  does not skip when there are no engines, so no patch is needed.
* ``cwtrain.integrations.miles.actor_hook`` - the same through a publishing Ray actor, one
  step ahead.
* ``cwtrain.integrations.miles.init_hook`` - for ``--custom-megatron-init-path``: gives the
  gloo group the other ranks wait in while rank 0 publishes max(``--distributed-timeout-minutes``,
  2 × ``CWTRAIN_HOTLOAD_TIMEOUT``) instead of torch's 30-minute default
  (:mod:`cwtrain.integrations.slime.barrier`), and installs the sample canary on every train
  rank (:mod:`cwtrain.integrations.slime.canary`).
* ``cwtrain.integrations.miles.CoreWeaveRolloutFn`` - an ``InferenceRolloutFn`` subclass: one
  ``/v1/completions`` request per group; it replaces miles' engine semaphore (sized from local
  rollout GPUs, zero here) with ``CWTRAIN_ROLLOUT_CONCURRENCY`` slots.
* ``cwtrain.integrations.miles.generate_rollout`` - the same as a function, for
  ``MILES_USE_LEGACY_ROLLOUT_V1=1``.
* ``cwtrain.integrations.miles.post_save_hook`` - the alternative to the post-write hook:
  ``--custom-megatron-post-save-hook-path cwtrain.integrations.miles.post_save_hook`` with
  ``--save`` and ``--save-hf`` publishes each checkpoint's complete HF export (the critic's
  saves and failed exports publish nothing). See :mod:`~cwtrain.integrations.miles.post_save`.

miles discards what its hooks return: the ``hotload/*`` metrics go to the run's own logger
through miles' tracking. Where miles' words differ from slime's (its namespace, its gloo
group, its tracking, ``disk-delta``), :data:`~cwtrain.integrations.miles.dialect.MILES_DIALECT`
tells slime's hooks, registered in the ``cwtrain.slime.dialects`` entry-point group.

``train.py`` (synchronous) and ``train_async.py`` (generation k+1 overlaps training k) both
work. With ``CWTRAIN_HOTLOAD_WAIT=0`` the hook returns once the hot-load exists and the next
publish waits for it. Variables: ``CWTRAIN_HOTLOAD_*`` and ``CWTRAIN_ROLLOUT_*`` as for slime
(:mod:`cwtrain.integrations.slime`). Nothing here imports miles, Ray or torch until used; a
missing one raises ``ImportError`` naming the install.

What the plug-in keeps between calls (the post-save publisher, the built
``CoreWeaveRolloutFn``) lives in one object per process, ``MilesRuntime.current()``
(:class:`~cwtrain.integrations.miles.runtime.MilesRuntime`); :func:`reset` starts it over.
The post-write hook and the samplers are slime's: ``cwtrain.integrations.slime.reset()``.
"""

from __future__ import annotations

from typing import Any

from cwtrain.integrations.slime import HookConfig, actor_hook, hook, init_hook

from .post_save import post_save_hook
from .rollout import generate_rollout, make_rollout_fn_cls
from .runtime import MilesRuntime, reset

__all__ = [
    "CoreWeaveRolloutFn",
    "HookConfig",
    "MilesRuntime",
    "actor_hook",
    "generate_rollout",
    "hook",
    "init_hook",
    "post_save_hook",
    "reset",
]


def __getattr__(name: str) -> Any:
    # Built on first access (and kept by the runtime) so that importing this package never imports miles.
    if name == "CoreWeaveRolloutFn":
        return MilesRuntime.current().rollout_fn_cls(make_rollout_fn_cls)
    raise AttributeError(f"module 'cwtrain.integrations.miles' has no attribute {name!r}")

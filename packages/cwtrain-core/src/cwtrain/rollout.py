"""The rollout sampler at a short import: ``from cwtrain.rollout import CompletionSampler``.

The same objects as :mod:`cwtrain.integrations.rollout` (its public names, re-exported; that
module's docs describe them)::

    from cwtrain.rollout import CompletionSampler, RolloutConfig, SamplingParams

    sampler = CompletionSampler(RolloutConfig.from_env(), run_id="run1")   # CWTRAIN_ROLLOUT_*
    sampler.note_published(0)                          # run1-v000000 is published
    batch = sampler.sample_groups_sync(["even: "], 4, SamplingParams(max_tokens=16))
    [c.identity for c in batch[0]]                     # ['run1-v000000', ...]; c.version == 0
    sampler.close()

``docs/custom-loop.md`` walks through a training loop built on it.
"""

from __future__ import annotations

from cwtrain.integrations import rollout as _rollout
from cwtrain.integrations.rollout import *  # noqa: F403  (the public names, listed once: in that module's __all__)

__all__ = list(_rollout.__all__)

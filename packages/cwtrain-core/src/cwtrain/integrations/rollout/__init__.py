"""The rollout sampler: GRPO groups from a deployment's OpenAI-compatible ``/v1/completions``.

Every recipe and framework package samples through this module (spec ``interface.md`` §4)::

    from cwtrain.integrations.rollout import RolloutConfig, SamplingParams, sample_groups

    config = RolloutConfig.from_env()          # CWTRAIN_ROLLOUT_BASE_URL, _MODEL, ...
    batch = sample_groups([[101, 7592, 102], [101, 2088]], n=8,
                          params=SamplingParams(max_tokens=256), config=config)
    for group in batch:                        # one group per prompt, n completions each
        for c in group:
            c.prompt_ids, c.response_ids, c.logprobs, c.finish_reason, c.identity, c.latency
    batch.metrics["coreweave/tokens_per_second"]

From async code use the sampler itself: ``await shared_sampler(config).sample_groups(...)``.
slime/miles: ``fill_group(samples, completions)`` fills their ``Sample`` objects, and
``RolloutConfig.for_trainer(args)`` refuses flags that cannot work with remote rollouts.

**Requests.** One ``POST {base_url}/completions`` per group with ``n`` = group size and the
prompt as token ids (``add_special_tokens`` is the trainer's business: send ids without
them). If the endpoint answers a token-id prompt with 400/422, the request is retried once as
text; when that succeeds, text prompts are used for the rest of the run (logged once). An
optional token-id field (``return_token_ids``, ``return_tokens_as_token_ids``) refused with
a 400 naming it is dropped for the run. Routed experts split a group into ``n`` concurrent
``n = 1`` requests, each with a random seed (``CWTRAIN_ROLLOUT_SEEDS``).

**Concurrency.** ``CWTRAIN_ROLLOUT_CONCURRENCY`` groups in flight, counted in sequences (a
split group uses one group's budget).

**Retries.** HTTP 408, 409, 425, 429, 500, 502, 503, 504, transport errors, a per-request
deadline (``CWTRAIN_ROLLOUT_TIMEOUT``) and 2xx bodies that are not JSON objects are retried up
to ``CWTRAIN_ROLLOUT_MAX_ATTEMPTS`` tries, sleeping ``min(30, 2^(k-1)) × U[0.5, 1.5)`` s after
try *k* (or ``Retry-After`` when larger, at most 30 s). Other statuses fail at once with
``RolloutError("completions request failed: HTTP <code>: …")``.

**Exact ids.** Read from ``choices[].token_ids``, ``choices[].logprobs.tokens``
(``token_id:N``) or ``nvext`` (see :mod:`cwtrain.integrations.rollout.responses`); none of them
is a ``RolloutError`` naming what to enable. Re-tokenizing text happens only on explicit
opt-in (``CWTRAIN_ROLLOUT_TOKEN_IDS=0`` plus ``tokenizer=``), checked by decoding back.

**Identity.** Each completion carries the snapshot identity that served it, read from the
``x-cwtrain-snapshot-identity`` header, else the body's ``system_fingerprint``.

**Variables** (explicit argument > framework config key > variable > default):
``CWTRAIN_ROLLOUT_BASE_URL`` (required), ``_MODEL`` (required), ``_API_KEY`` / ``_API_KEY_FILE``,
``_CONCURRENCY`` (16), ``_TIMEOUT`` (600), ``_MAX_ATTEMPTS`` (6), ``_LOGPROBS`` (true),
``_TOKEN_IDS`` (true), ``_TOKEN_ID_PROMPTS`` (true), ``_ROUTED_EXPERTS`` (false), ``_SEEDS`` (true).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from cwtrain.errors import RolloutError
from cwtrain.integrations.rollout.config import FIELD_VARIABLES, RolloutConfig
from cwtrain.integrations.rollout.requests import Prompt, PromptLike, SamplingParams
from cwtrain.integrations.rollout.responses import Completion, decode_routed_experts
from cwtrain.integrations.rollout.sampler import IDENTITY_HEADER, CompletionSampler, RolloutBatch
from cwtrain.integrations.rollout.samples import fill_group, served_version

__all__ = [
    "FIELD_VARIABLES",
    "IDENTITY_HEADER",
    "Completion",
    "CompletionSampler",
    "Prompt",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutError",
    "SamplingParams",
    "decode_routed_experts",
    "fill_group",
    "sample_groups",
    "sample_prompt",
    "served_version",
    "shared_sampler",
]

_SHARED: dict[RolloutConfig, CompletionSampler] = {}
_SHARED_LOCK = threading.Lock()


def shared_sampler(config: RolloutConfig | None = None, *, tokenizer: Any = None) -> CompletionSampler:
    """The process-wide sampler for ``config`` (default: ``RolloutConfig.from_env()``).

    One sampler (one connection pool) per distinct config, reused across steps. A
    ``tokenizer`` given later is attached to an existing sampler that has none.
    """
    config = config or RolloutConfig.from_env()
    with _SHARED_LOCK:
        sampler = _SHARED.get(config)
        if sampler is None:
            sampler = _SHARED[config] = CompletionSampler(config, tokenizer=tokenizer)
        elif tokenizer is not None and sampler.tokenizer is None:
            sampler.tokenizer = tokenizer
        return sampler


def sample_groups(
    prompts: Sequence[PromptLike],
    n: int | Sequence[int],
    params: SamplingParams,
    *,
    config: RolloutConfig | None = None,
    sampler: CompletionSampler | None = None,
    cache_salt: str | None = None,
    split: bool | None = None,
) -> RolloutBatch:
    """Blocking: sample one group of ``n`` per prompt (see :meth:`CompletionSampler.sample_groups`).

    Uses ``sampler``, else :func:`shared_sampler` for ``config``. Safe to call from code
    running inside an event loop (the I/O runs on the sampler's own loop thread).
    """
    sampler = sampler or shared_sampler(config)
    return sampler.sample_groups_sync(prompts, n, params, cache_salt=cache_salt, split=split)


def sample_prompt(
    prompt: PromptLike,
    n: int,
    params: SamplingParams,
    *,
    config: RolloutConfig | None = None,
    sampler: CompletionSampler | None = None,
    cache_salt: str | None = None,
    split: bool | None = None,
) -> list[Completion]:
    """Blocking: sample one group for one prompt; returns its ``n`` completions."""
    batch = sample_groups([prompt], n, params, config=config, sampler=sampler, cache_salt=cache_salt, split=split)
    return batch.groups[0]

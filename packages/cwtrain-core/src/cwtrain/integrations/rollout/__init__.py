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
deadline (``CWTRAIN_ROLLOUT_TIMEOUT``), 2xx bodies that are not JSON objects (or nest deeper
than 128 levels) and answers with a choice that did not finish (no ``finish_reason``, or
``abort``/``error``: cut short on the way, or given up by the engine; never returned as a
finished completion) are retried up to ``CWTRAIN_ROLLOUT_MAX_ATTEMPTS`` tries, sleeping
``min(30, 2^(k-1)) × U[0.5, 1.5)`` s after try *k* (or ``Retry-After`` when larger, at most
30 s). Other statuses fail at once with ``RolloutError("completions request failed: HTTP
<code>: …")``; any other malformed answer is a ``RolloutError`` too, never another exception.

**Exact ids.** Read from ``choices[].token_ids``, ``choices[].logprobs.tokens``
(``token_id:N``) or ``nvext`` (see :mod:`cwtrain.integrations.rollout.responses`); none of them
is a ``RolloutError`` naming what to enable. Re-tokenizing text happens only on explicit
opt-in (``CWTRAIN_ROLLOUT_TOKEN_IDS=0`` plus ``tokenizer=``), checked by decoding back.

**Identity.** Each completion carries the snapshot identity that served it, read from the
``x-cwtrain-snapshot-identity`` header, else the body's ``system_fingerprint``, and, when
the sampler knows its run, the version of that run it names (``Completion.version``).

**Versions.** The sampler learns the newest version the trainer published
(``sampler.note_published(version, run_id=...)``, or :func:`note_published` for every
shared sampler of the process) and the burned ones, whose hot-load was refused and the
fleet re-activated away (``sampler.note_burned(version, run_id=...)``, or :func:`note_burned`).
With ``CWTRAIN_ROLLOUT_MAX_STALENESS=K`` the fence is two-sided: a completion served more
than K versions behind the newest, or by another run's identity, is re-requested
(``coreweave/stale_rerequested``), and so is one served by a version newer than the newest
published or by a burned one (``coreweave/unpublished_rerequested``); a group is never
returned with completions from two identities, nor with some naming an identity and
others none; each batch reports the versions it held
(:mod:`cwtrain.integrations.rollout.sampler`).

**Canary.** :class:`Canary` scores a fixed probe on the deployment (prompt log-probs through
``echo``/``prompt_logprobs``) and compares it with the trainer's own log-probs after a
hot-load (:mod:`cwtrain.integrations.rollout.canary`). :class:`SampleCanary` judges each served
version from the log-probs a framework computes anyway, of the tokens it sampled, and refuses a
wrong one as a failed hot-load; every sampler's :class:`ServedLedger` (``sampler.ledger``) says
which identity served a sample, by its tokens (:mod:`cwtrain.integrations.rollout.sample_canary`).

**Variables** (explicit argument > framework config key > variable > default):
``CWTRAIN_ROLLOUT_BASE_URL`` (required), ``_MODEL`` (required), ``_API_KEY`` / ``_API_KEY_FILE``,
``_CONCURRENCY`` (16), ``_TIMEOUT`` (600), ``_MAX_ATTEMPTS`` (6), ``_LOGPROBS`` (true),
``_TOKEN_IDS`` (true), ``_TOKEN_ID_PROMPTS`` (true), ``_ROUTED_EXPERTS`` (false), ``_SEEDS`` (true),
``_MAX_STALENESS`` (unset: no limit).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from cwtrain.errors import RolloutError, UsageError
from cwtrain.integrations.rollout._runtime import run_sync
from cwtrain.integrations.rollout.canary import (
    DEFAULT_CANARY_BOUND,
    Canary,
    CanaryAnswer,
    CanaryProbe,
    CanaryResult,
    IdentityGap,
    TrainerLogprobs,
)
from cwtrain.integrations.rollout.config import FIELD_VARIABLES, RolloutConfig
from cwtrain.integrations.rollout.ledger import ServedLedger
from cwtrain.integrations.rollout.requests import Prompt, PromptLike, SamplingParams
from cwtrain.integrations.rollout.responses import Completion, decode_routed_experts
from cwtrain.integrations.rollout.sample_canary import (
    SampleCanary,
    SampleGap,
    SampleVerdict,
    judge_gaps,
    judge_on_every_rank,
    sample_gap,
)
from cwtrain.integrations.rollout.sampler import (
    IDENTITY_HEADER,
    CompletionSampler,
    RolloutBatch,
    merge_batches,
    served_version_metrics,
)
from cwtrain.integrations.rollout.samples import fill_group, version_tag

__all__ = [
    "DEFAULT_CANARY_BOUND",
    "FIELD_VARIABLES",
    "IDENTITY_HEADER",
    "Canary",
    "CanaryAnswer",
    "CanaryProbe",
    "CanaryResult",
    "Completion",
    "CompletionSampler",
    "IdentityGap",
    "Prompt",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutError",
    "SampleCanary",
    "SampleGap",
    "SampleVerdict",
    "SamplingParams",
    "ServedLedger",
    "TrainerLogprobs",
    "decode_routed_experts",
    "fill_group",
    "judge_gaps",
    "judge_on_every_rank",
    "merge_batches",
    "note_burned",
    "note_published",
    "sample_groups",
    "sample_gap",
    "sample_prompt",
    "run_sync",
    "served_version_metrics",
    "shared_sampler",
    "version_tag",
]

_SHARED: dict[RolloutConfig, CompletionSampler] = {}
_SHARED_LOCK = threading.Lock()
_PUBLISHED: dict[str, int] = {}  # run id -> the newest version published in this process
_BURNED: dict[str, set[int]] = {}  # run id -> the versions noted burned in this process (the newest run's)


def shared_sampler(config: RolloutConfig | None = None, *, tokenizer: Any = None) -> CompletionSampler:
    """The process-wide sampler for ``config`` (default: ``RolloutConfig.from_env()``).

    One sampler (one connection pool) per distinct config, reused across steps. A
    ``tokenizer`` given later is attached to an existing sampler that has none. A new
    sampler learns the newest version :func:`note_published` recorded and the burned ones
    :func:`note_burned` did.
    """
    config = config or RolloutConfig.from_env()
    with _SHARED_LOCK:
        sampler = _SHARED.get(config)
        if sampler is None:
            sampler = _SHARED[config] = CompletionSampler(config, tokenizer=tokenizer)
            for run_id, version in _PUBLISHED.items():
                sampler.note_published(version, run_id=run_id)
            for run_id, burned in _BURNED.items():
                for version in sorted(burned):
                    sampler.note_burned(version, run_id=run_id)
        elif tokenizer is not None and sampler.tokenizer is None:
            sampler.tokenizer = tokenizer
        return sampler


def note_published(version: int, *, run_id: str) -> None:
    """The trainer published ``version`` of ``run_id``: tell every shared sampler of this process.

    Samplers made later by :func:`shared_sampler` learn it too. A sampler built directly is
    told with its own :meth:`CompletionSampler.note_published`. Only the newest run
    is kept.
    """
    with _SHARED_LOCK:
        if run_id not in _PUBLISHED or version > _PUBLISHED[run_id]:
            _PUBLISHED.clear()
            _PUBLISHED[run_id] = version
        _keep_only(run_id)
        samplers = list(_SHARED.values())
    for sampler in samplers:
        sampler.note_published(version, run_id=run_id)


def note_burned(version: int, *, run_id: str) -> None:
    """Version ``version`` of ``run_id`` is burned: tell every shared sampler of this process.

    A burned version's hot-load was refused or failed and the fleet was re-activated away
    from it (see :meth:`CompletionSampler.note_burned`). Samplers made later by
    :func:`shared_sampler` learn it too. Only the newest run is kept.

    Raises:
        UsageError: ``version`` is not an integer >= 0.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UsageError(f"note_burned(version={version!r}): a version is an integer >= 0")
    with _SHARED_LOCK:
        _keep_only(run_id)
        _BURNED.setdefault(run_id, set()).add(version)
        samplers = list(_SHARED.values())
    for sampler in samplers:
        sampler.note_burned(version, run_id=run_id)


def _keep_only(run_id: str) -> None:
    """Forget what was recorded of other runs than ``run_id`` (holds the lock)."""
    for record in (_PUBLISHED, _BURNED):
        for other in [run for run in record if run != run_id]:
            del record[other]


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

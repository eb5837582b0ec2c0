"""``CompletionSampler``: one ``/v1/completions`` request per GRPO group (interface.md §4.1–4.3).

The sampler owns one ``httpx.AsyncClient`` (one connection pool, reused across steps) on
its own event-loop thread, so the same sampler serves ``await sampler.sample_groups(...)``
from any event loop and ``sampler.sample_groups_sync(...)`` from plain code — including
code that is itself running inside an event loop.

**Samples fenced by version, on both sides.** The sampler knows the run it samples for
(``run_id``), the newest version the trainer published (:meth:`CompletionSampler.note_published`,
called by the publish path after each publish, or by the caller) and the versions it was
told are burned (:meth:`CompletionSampler.note_burned`: a hot-load of the run that was
refused or failed, after which the fleet was re-activated away from it; it is never
announced as served). Each completion's identity becomes a version of that run
(:func:`cwtrain.hotload.format.identity.identity_version`; another run's identity, or
``initial``, is no version of it). With ``max_staleness`` = K
(``CWTRAIN_ROLLOUT_MAX_STALENESS``) a completion is re-requested instead of returned when it
was served

- more than K versions behind the newest published, or by an identity that is no version
  of the run (counted in ``coreweave/stale_rerequested``), or
- by a version newer than the newest published (a hot-load not announced yet, or one
  refused and re-activated away), or by a burned version (counted in
  ``coreweave/unpublished_rerequested``),

up to ``max_attempts`` times with the retries' back-off (the fleet may still be switching),
then the batch fails with a ``RolloutError`` naming the identity; the check is made again on
every group when the batch ends, against what is known then (the newest version, the burned
ones). A completion whose identity the endpoint does not report cannot be fenced and is kept
(``coreweave/samples_without_version`` counts it): such a group is never re-requested for
it. With no limit (the default) nothing is re-requested for its version. Either way a group
is never returned with completions from two identities, nor with some naming an identity
and others naming none: a split group (``n`` requests of ``n = 1``) that came back mixed is
re-sampled whole (the same budget; ``coreweave/mixed_groups_resampled``). Each batch reports
what it held (:class:`RolloutBatch`: ``versions``, and the ``coreweave/served_version_*``
metrics besides those counters).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Concatenate, TypeVar

import httpx

from cwtrain.closing import Closing
from cwtrain.errors import RolloutError, UsageError
from cwtrain.hotload.format.identity import identity_version, version_identity
from cwtrain.integrations.nvext import as_cache_salt
from cwtrain.integrations.rollout._runtime import LoopThread, SequenceLimiter
from cwtrain.integrations.rollout.config import RolloutConfig
from cwtrain.integrations.rollout.ledger import ServedLedger
from cwtrain.integrations.rollout.requests import Prompt, PromptLike, SamplingParams, as_prompt
from cwtrain.integrations.rollout.responses import Completion, read_completions, unfinished
from cwtrain.jsondoc import load_json

__all__ = ["IDENTITY_HEADER", "CompletionSampler", "RolloutBatch", "merge_batches", "served_version_metrics"]

log = logging.getLogger("cwtrain.integrations.rollout")

IDENTITY_HEADER = "x-cwtrain-snapshot-identity"
RETRIED_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
OPTIONAL_ID_FIELDS = ("return_tokens_as_token_ids", "return_token_ids")
MAX_SLEEP = 30.0
MAX_RESAMPLES = 2
#: The least seconds between two look-ups of the newest version published (:meth:`CompletionSampler.look_up_published`).
LOOKUP_INTERVAL = 1.0

T = TypeVar("T")


class _Refused(RolloutError):
    """The endpoint answered with a status that is not retried."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"completions request failed: HTTP {status}: {body[:200]}")


@dataclass(frozen=True)
class _Ask:
    """One completions request of a group: its prompt, ``n``, sampling, salt and the limiter's size."""

    prompt: Prompt
    n: int
    params: SamplingParams
    salt: str | None
    largest: int
    seeded: bool


@dataclass
class _Stats:
    requests: int = 0
    retries: int = 0
    resampled: int = 0
    cached_tokens: int = 0
    stale: int = 0  # completions re-requested for staleness
    unpublished: int = 0  # completions re-requested for a version newer than published, or burned
    mixed: int = 0  # groups re-sampled because they held two identities, or some answers named none
    latencies: list[float] = field(default_factory=list)

    def refused(self, refusal: _Refusal, completions: int) -> None:
        """Count ``completions`` re-requested for ``refusal`` (stale, or unpublished)."""
        if refusal.kind in ("unpublished", "newer"):
            self.unpublished += completions
        else:
            self.stale += completions


@dataclass(frozen=True)
class _Refusal:
    """Why a completion may not be returned: ``stale`` (too far behind, or no version of the run),
    ``newer`` (newer than the newest published) or ``unpublished`` (burned), and the sentence saying so."""

    kind: str
    reason: str

    @property
    def advice(self) -> str:
        """What to check when the deployment keeps serving such completions."""
        if self.kind in ("unpublished", "newer"):
            return (
                "the deployment serves a version the trainer did not publish as served: check its hot-loads "
                "(`cwtrain hotload list`) and that the publish path tells the sampler each version it publishes"
            )
        return (
            "the deployment does not serve a recent version: check its hot-loads (`cwtrain hotload list`), "
            "or raise CWTRAIN_ROLLOUT_MAX_STALENESS"
        )


@dataclass(frozen=True)
class _Fence:
    """What a completion is checked against: the run, the newest version published, the burned ones, the limit."""

    run_id: str | None
    latest: int | None
    limit: int | None
    burned: frozenset[int] = frozenset()
    #: the version the trainer's weights are at, when it publishes ahead of the newest served (note_publishing)
    trainer: int | None = None

    def version(self, identity: str | None) -> int | None:
        """The version of the run ``identity`` names (``None``: no run known, or not one of its versions)."""
        return identity_version(identity, self.run_id) if self.run_id is not None else None

    def refusal(self, identity: str | None) -> _Refusal | None:
        """Why a completion served by ``identity`` may not be returned, or ``None`` when it may."""
        if self.limit is None or self.run_id is None or self.latest is None or identity is None:
            return None
        version = identity_version(identity, self.run_id)
        newest = version_identity(self.run_id, self.latest)
        if version is None:
            return _Refusal(
                "stale",
                f"served by {identity!r}, which is no version of run {self.run_id!r} (newest published: {newest!r})",
            )
        if version in self.burned:
            return _Refusal(
                "unpublished",
                f"served by {identity!r}, a burned version (its hot-load was refused and the fleet re-activated "
                f"away from it; newest published: {newest!r})",
            )
        if version > self.latest:
            return _Refusal(
                "newer",
                f"served by {identity!r}, newer than the newest published {newest!r} (a hot-load not announced yet, "
                "or one refused and re-activated away)",
            )
        if self.latest - version > self.limit:
            return _Refusal(
                "stale",
                f"served by {identity!r}, {self.latest - version} versions behind the newest published {newest!r} "
                f"(CWTRAIN_ROLLOUT_MAX_STALENESS={self.limit})",
            )
        if self.trainer is not None and self.trainer - version > self.limit:
            return _Refusal(
                "stale",
                f"served by {identity!r}, {self.trainer - version} versions behind the trainer's weights "
                f"({version_identity(self.run_id, self.trainer)!r}, publishing; CWTRAIN_ROLLOUT_MAX_STALENESS={self.limit})",
            )
        return None


@dataclass(frozen=True)
class RolloutBatch:
    """The groups of one ``sample_groups`` call, in prompt order, and its metrics.

    Iterating, indexing and ``len`` act on ``groups``.

    Attributes:
        groups: one list of :class:`Completion` per prompt, ``n`` each; never two identities in one group.
        metrics: ``coreweave/*`` numbers (interface.md §4.3 plus latency percentiles,
            tokens/s, requests, retries, identities seen), and what the batch held:
            ``stale_rerequested`` (completions re-requested for staleness),
            ``unpublished_rerequested`` (completions re-requested for a version newer than the
            newest published, or burned), ``mixed_groups_resampled`` (groups re-sampled for
            holding two identities, or answers with an identity and answers without); with a
            known run, ``samples_without_version`` (served by no version of the run), and when
            versions were served ``served_version_min``, ``served_version_max``,
            ``served_versions`` (how many), ``served_version_samples/<N>`` (samples per
            version) and, with the newest published version known, ``staleness_max``.
        identities: the served snapshot identities seen, in first-seen order.
        versions: samples per version of the sampler's run that served them (empty when
            the run is not known).
        published_version: the newest version the sampler knew of when the batch ended.
    """

    groups: list[list[Completion]]
    metrics: dict[str, float]
    identities: tuple[str, ...] = ()
    versions: dict[int, int] = field(default_factory=dict)
    published_version: int | None = None

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Any:
        return iter(self.groups)

    def __getitem__(self, index: int) -> list[Completion]:
        return self.groups[index]


def served_version_metrics(
    versions: Mapping[int, int],
    *,
    published: int | None = None,
    stale: int = 0,
    mixed: int = 0,
    unversioned: int | None = None,
    unpublished: int = 0,
) -> dict[str, float]:
    """The ``coreweave/*`` numbers of what a batch held (see :class:`RolloutBatch`).

    Args:
        versions: samples per version of the run that served them.
        published: the newest version published (``staleness_max`` is measured from it).
        stale: completions re-requested for staleness.
        mixed: groups re-sampled for holding two identities (or some answers without one).
        unversioned: samples served by no version of the run (``None``: the run is not known).
        unpublished: completions re-requested for a version newer than the newest published, or burned.

    :func:`merge_batches` calls it once over several batches.
    """
    metrics = {
        "coreweave/stale_rerequested": float(stale),
        "coreweave/unpublished_rerequested": float(unpublished),
        "coreweave/mixed_groups_resampled": float(mixed),
    }
    if unversioned is not None:
        metrics["coreweave/samples_without_version"] = float(unversioned)
    counted = {v: n for v, n in sorted(versions.items()) if n}
    if counted:
        metrics["coreweave/served_version_min"] = float(min(counted))
        metrics["coreweave/served_version_max"] = float(max(counted))
        metrics["coreweave/served_versions"] = float(len(counted))
        for version, count in counted.items():
            metrics[f"coreweave/served_version_samples/{version}"] = float(count)
        if published is not None:
            metrics["coreweave/staleness_max"] = float(max(0, published - min(counted)))
    return metrics


def merge_batches(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """One batch of several ``sample_groups`` calls of one sampler (one per sampling-parameter bucket, say).

    Groups in call order, identities in first-seen order, versions summed. The metrics are
    the last batch's, except what the batches held (``stale_rerequested``,
    ``unpublished_rerequested``, ``mixed_groups_resampled``, ``samples_without_version``, ``served_version_*``,
    ``staleness_max``): those count every batch's samples (:func:`served_version_metrics`),
    measured from the newest version published when the last batch ended.
    """
    versions: Counter[int] = Counter()
    identities: dict[str, None] = {}
    metrics: dict[str, float] = {}
    for batch in batches:
        versions.update(batch.versions)
        identities.update(dict.fromkeys(batch.identities))
        metrics.update(batch.metrics)
    published = batches[-1].published_version if batches else None
    held = {
        key: sum(int(batch.metrics.get(f"coreweave/{key}", 0)) for batch in batches)
        for key in ("stale_rerequested", "unpublished_rerequested", "mixed_groups_resampled", "samples_without_version")
    }
    unversioned = held["samples_without_version"] if "coreweave/samples_without_version" in metrics else None
    metrics = {
        k: v for k, v in metrics.items() if not k.startswith(("coreweave/served_version", "coreweave/staleness_max"))
    }
    metrics.update(
        served_version_metrics(
            versions,
            published=published,
            stale=held["stale_rerequested"],
            mixed=held["mixed_groups_resampled"],
            unversioned=unversioned,
            unpublished=held["unpublished_rerequested"],
        )
    )
    return RolloutBatch(
        groups=[group for batch in batches for group in batch.groups],
        metrics=metrics,
        identities=tuple(identities),
        versions=dict(sorted(versions.items())),
        published_version=published,
    )


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _answer_of(response: httpx.Response) -> tuple[dict[str, Any], str | None]:
    """A 2xx answer's JSON object, or why it must be asked again: not a JSON object (cut short,
    a proxy's page), or a completion that did not finish (:func:`~.responses.unfinished`)."""
    try:
        payload = load_json(response.content)
    except ValueError as exc:
        return {}, f"HTTP {response.status_code} with a body that is not a JSON object ({exc}): {response.text[:200]!r}"
    if not isinstance(payload, dict):
        return {}, f"HTTP {response.status_code} with a body that is not a JSON object: {response.text[:200]!r}"
    cut = unfinished(payload)
    return payload, None if cut is None else f"HTTP {response.status_code}: {cut}"


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    rank = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[min(rank, len(sorted_values) - 1)]


def _blocking[**P, R](
    method: Callable[Concatenate[CompletionSampler, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[CompletionSampler, P], R]:
    """The blocking twin of a sampler coroutine method: same arguments, run on the sampler's loop thread."""

    def blocking(self: CompletionSampler, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._runner.here():
            raise RolloutError(
                f"{method.__name__}_sync called on the sampler's own loop thread; await {method.__name__}"
            )
        return self._runner.submit(method(self, *args, **kwargs)).result()

    blocking.__name__ = blocking.__qualname__ = f"{method.__name__}_sync"
    blocking.__doc__ = (
        f"Blocking :meth:`{method.__name__}` (same arguments); works with or without a running event loop "
        "in this thread."
    )
    return blocking


class CompletionSampler(Closing):
    """Samples GRPO groups from an OpenAI-compatible ``/v1/completions`` endpoint.

    One request per group with ``n`` = group size (with routed experts: ``n`` concurrent
    ``n = 1`` requests, each with a seed). At most ``config.concurrency`` groups are in
    flight, counted in sequences: the budget is ``concurrency × group size``
    (``group_size``, else the largest ``n`` seen), so a split group takes the same budget
    as an unsplit one.

    Args:
        config: endpoint and behaviour (see :class:`RolloutConfig`).
        tokenizer: the trainer's tokenizer (``encode(text, add_special_tokens=False)``,
            ``decode(ids)``): decodes token-id prompts for the text fallback, and enables the
            explicit re-tokenize opt-in when ``config.token_ids`` is false.
        transport: an ``httpx.AsyncBaseTransport`` (tests use ``httpx.MockTransport``).
        group_size: sequences per group, for the concurrency budget.
        sleep: the coroutine used between retries (default ``asyncio.sleep``).
        seed: seeds the generator of jitter and request seeds (default: from the OS).
        run_id: the run it samples for: served identities become this run's versions
            (see the module docs); also set by :meth:`note_published`.
    """

    def __init__(
        self,
        config: RolloutConfig,
        *,
        tokenizer: Any = None,
        transport: httpx.AsyncBaseTransport | None = None,
        group_size: int | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        seed: int | None = None,
        run_id: str | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self._transport = transport
        self._group_size = max(1, group_size or 1)
        self._sleep = sleep or asyncio.sleep
        self._rng = random.Random(seed)
        self._runner = LoopThread()
        self._client: httpx.AsyncClient | None = None
        self._client_pid = 0
        self._limiter: SequenceLimiter | None = None
        self._dropped: set[str] = set()
        self._text_prompts = not config.token_id_prompts
        self._logged: set[str] = set()
        self._fence_lock = threading.Lock()
        self._run_id = run_id
        self._noted: set[int] = set()  # every version announced as served: the newest not burned is the newest
        self._burned: set[int] = set()
        self._publishing: int | None = None  # the newest version handed over to publish (note_publishing)
        self._lookup: Callable[[], int | None] | None = None
        self._lookup_task: asyncio.Future[int | None] | None = None
        self._looked_up = -math.inf
        #: who served each completion returned lately, by its token ids (the frameworks' sample canary asks it)
        self.ledger = ServedLedger()

    # ------------------------------------------------------------------ public

    @property
    def run_id(self) -> str | None:
        """The run it samples for (``None``: not known; no versions, no fence)."""
        return self._run_id

    @property
    def published_version(self) -> int | None:
        """The newest version of the run the trainer published, as last told (burned ones left out)."""
        with self._fence_lock:
            return self._newest()

    def note_published(self, version: int, *, run_id: str | None = None) -> None:
        """The trainer published ``version`` of ``run_id`` (default: the sampler's run).

        The publish path calls this after each publish; a caller may call it directly. A
        version never goes back within a run (a lower one is ignored); another run id
        replaces the run, its newest version and its burned ones. Thread-safe; batches in
        flight use it from their next check on.

        Raises:
            UsageError: ``version`` is negative, or no run id was ever given.
        """
        with self._fence_lock:
            self._noted_run("note_published", version, run_id)
            self._noted.add(version)

    def note_publishing(self, version: int, *, run_id: str | None = None) -> None:
        """The trainer handed ``version`` of ``run_id`` over to publish; it is not served yet (one step ahead).

        A publisher that trains while the fleet loads its last version
        (:class:`cwtrain.hotload.PublishAhead`) calls this at each hand-over. With a limit
        (``max_staleness`` = K) a completion is then also refused when it is more than K
        versions behind ``version``, the trainer's weights, not only behind the newest version
        served: the samples trained on are never more than K versions older than the weights
        they train. A version newer than the newest served is still refused until
        :meth:`note_published` announces it. Thread-safe.

        Raises:
            UsageError: ``version`` is negative, or no run id was ever given.
        """
        with self._fence_lock:
            self._noted_run("note_publishing", version, run_id)
            self._publishing = max(version, self._publishing or 0)

    def note_burned(self, version: int, *, run_id: str | None = None) -> None:
        """Version ``version`` of ``run_id`` (default: the sampler's run) is burned.

        A burned version's hot-load was created but refused or failed, and the fleet was
        re-activated away from it: the publish path never announces it as served. With a
        limit (``max_staleness``) a completion it served is re-requested like one newer than
        the newest published (``coreweave/unpublished_rerequested``), whatever the newest
        version is; the version stays burned for the run. A version refused after it was
        announced as served (a framework's canary judges it from the next step) stops being
        the newest: the newest is then the highest announced one not burned (the one the fleet
        was brought back to, which the publish path announces next). Another run id replaces the run
        (as :meth:`note_published` does). Thread-safe; batches in flight use it from their next
        check on, and at their end.

        Raises:
            UsageError: ``version`` is negative, or no run id was ever given.
        """
        with self._fence_lock:
            self._noted_run("note_burned", version, run_id)
            self._burned.add(version)

    def look_up_published(self, lookup: Callable[[], int | None] | None) -> None:
        """Ask ``lookup`` for the newest version published before refusing a completion as newer than it.

        For a sampler that learns the newest version by reading the deployment (slime's
        rollout, at each rollout's start) rather than from the publish path: a hot-load that
        completed since is then confirmed (``lookup`` returns the version the deployment
        serves now, which :meth:`note_published` records) instead of refused. Asked at most
        once every :data:`LOOKUP_INTERVAL` seconds, in a worker thread; ``None`` stops asking.
        """
        with self._fence_lock:
            self._lookup, self._lookup_task = lookup, None
            self._looked_up = -math.inf

    async def _confirmed(self, fence: _Fence) -> _Fence:
        """The fence once the deployment was asked for the newest version published (see :meth:`look_up_published`).

        Requests refused at once wait for the one look-up in flight; a look-up is started
        when the last one is :data:`LOOKUP_INTERVAL` seconds old.
        """
        with self._fence_lock:
            lookup, task = self._lookup, self._lookup_task
            idle = task is None or task.done()
            if lookup is not None and idle and time.monotonic() - self._looked_up >= LOOKUP_INTERVAL:
                self._looked_up = time.monotonic()
                task = self._lookup_task = asyncio.ensure_future(asyncio.to_thread(lookup))
        if task is None:
            return fence
        try:
            newest = await asyncio.shield(task)
        except Exception as exc:  # a look-up that fails leaves the fence as it is
            log.warning("could not look up the newest version published: %s", exc)
            return self._fence()
        if newest is not None and fence.run_id is not None:
            self.note_published(newest, run_id=fence.run_id)
        return self._fence()

    @property
    def burned_versions(self) -> frozenset[int]:
        """The versions of the run :meth:`note_burned` named."""
        with self._fence_lock:
            return frozenset(self._burned)

    def set_run(self, run_id: str | None) -> None:
        """Sample for ``run_id`` (a new run forgets the newest version known and the burned ones)."""
        with self._fence_lock:
            if run_id != self._run_id:
                self._run_id = run_id
                self._noted, self._burned, self._publishing = set(), set(), None

    def _noted_run(self, what: str, version: int, run_id: str | None) -> None:
        """Check a note's ``version`` and switch to the run it names when that is new (the fence lock held)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise UsageError(f"{what}(version={version!r}): a version is an integer >= 0")
        run = run_id or self._run_id
        if run is None:
            raise UsageError(f"{what} needs the run id (run_id=...): the sampler knows no run yet")
        if run != self._run_id:
            self._run_id = run
            self._noted, self._burned, self._publishing = set(), set(), None

    def _fence(self) -> _Fence:
        with self._fence_lock:
            return _Fence(
                self._run_id, self._newest(), self.config.max_staleness, frozenset(self._burned), self._publishing
            )

    def _newest(self) -> int | None:
        """The newest version announced that is not burned (the fence lock held)."""
        return max(self._noted - self._burned, default=None)

    @property
    def text_prompts(self) -> bool:
        """Whether prompts are sent as text (configured, or after the endpoint refused token ids)."""
        return self._text_prompts

    @property
    def dropped_fields(self) -> frozenset[str]:
        """Optional token-id request fields the endpoint refused (dropped for the run)."""
        return frozenset(self._dropped)

    @property
    def peak_sequences(self) -> int:
        """Most sequences ever in flight at once."""
        return self._limiter.peak if self._limiter else 0

    async def sample_groups(
        self,
        prompts: Sequence[PromptLike],
        n: int | Sequence[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        split: bool | None = None,
    ) -> RolloutBatch:
        """Sample one group per prompt.

        Args:
            prompts: token ids (preferred), text, or :class:`Prompt` objects.
            n: group size, one for all or one per prompt.
            params: sampling settings.
            cache_salt: sent as ``nvext.cache_salt`` (SHA-256 hex when not a valid salt).
            split: send ``n`` requests of ``n = 1``, each with a seed (always so with routed experts).

        Returns:
            the groups in prompt order, with the batch's metrics.

        Raises:
            RolloutError: a request failed (after retries) or a response is unusable.
        """
        return await self._hop(self._batch(prompts, n, params, cache_salt, split))

    async def sample_group(
        self,
        prompt: PromptLike,
        n: int,
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        split: bool | None = None,
    ) -> list[Completion]:
        """Sample one group (see :meth:`sample_groups`)."""
        batch = await self.sample_groups([prompt], n, params, cache_salt=cache_salt, split=split)
        return batch.groups[0]

    sample_groups_sync = _blocking(sample_groups)

    async def aclose(self) -> None:
        """Close the connection pool and stop the loop thread."""
        if self._runner.here():
            await self._close_client()
            self._runner.stop()
            return
        await asyncio.wrap_future(self._runner.submit(self._close_client()))
        self._runner.stop()

    def close(self) -> None:
        """Blocking :meth:`aclose`."""
        if self._runner.here():
            raise RolloutError("close() called on the sampler's own loop thread; await aclose()")
        if self._client is not None:
            self._runner.submit(self._close_client()).result(timeout=30)
        self._runner.stop()

    # ---------------------------------------------------------------- internals

    async def _hop(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runner.here():
            return await coro
        return await asyncio.wrap_future(self._runner.submit(coro))

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is not None and self._client_pid != os.getpid():
            self._client = None  # a forked child: the parent's pool and loop are not ours
        if self._client is None:
            self._client_pid = os.getpid()
            headers = {"Accept": "application/json"}
            if self.config.api_key:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
            self._client = httpx.AsyncClient(
                transport=self._transport,
                headers=headers,
                timeout=httpx.Timeout(self.config.timeout),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
            )
            self._limiter = SequenceLimiter(self.config.concurrency, self._group_size)
        return self._client

    def _once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    async def _batch(
        self,
        prompts: Sequence[PromptLike],
        n: int | Sequence[int],
        params: SamplingParams,
        cache_salt: str | None,
        split: bool | None,
    ) -> RolloutBatch:
        items = [as_prompt(p) for p in prompts]
        sizes = [n] * len(items) if isinstance(n, int) else [int(k) for k in n]
        if len(sizes) != len(items):
            raise RolloutError(f"{len(sizes)} group sizes given for {len(items)} prompts")
        if any(k < 1 for k in sizes):
            raise RolloutError(f"group sizes must be >= 1, got {sizes}")
        self._http()
        salt = as_cache_salt(cache_salt) if cache_salt else None
        do_split = self.config.routed_experts or bool(split)  # routes are only returned for n = 1
        stats = _Stats()
        started = time.monotonic()
        try:
            async with asyncio.TaskGroup() as tasks:
                futures = [
                    tasks.create_task(self._group(p, k, params, salt, do_split, max(sizes), stats))
                    for p, k in zip(items, sizes, strict=True)
                ]
        except BaseExceptionGroup as group:
            first = group.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
        groups = [f.result() for f in futures]
        groups = await self._refence(groups, items, sizes, params, salt, do_split, stats)
        return self._finish(groups, stats, time.monotonic() - started)

    async def _refence(
        self,
        groups: list[list[Completion]],
        items: list[Prompt],
        sizes: list[int],
        params: SamplingParams,
        salt: str | None,
        split: bool,
        stats: _Stats,
    ) -> list[list[Completion]]:
        """Re-sample the groups that were refused once the batch ran (a newer version published, one burned)."""
        largest = max(sizes)
        for round_ in range(1, self.config.max_attempts + 1):
            fence = self._fence()
            if any(g and (r := fence.refusal(g[0].identity)) and r.kind == "newer" for g in groups):  # published since?
                fence = await self._confirmed(fence)
            refused = {
                i: refusal
                for i, group in enumerate(groups)
                if (refusal := fence.refusal(group[0].identity if group else None)) is not None
            }
            if not refused:
                return groups
            first = next(iter(refused.values()))
            if round_ == self.config.max_attempts:
                raise RolloutError(
                    f"{len(refused)} group(s) were still {first.reason} after {round_} rounds of re-sampling; "
                    f"{first.advice}"
                )
            for i, refusal in refused.items():
                stats.refused(refusal, len(groups[i]))
            log.info(
                "%d group(s) were refused at the end of the batch (%s); re-sampling them", len(refused), first.reason
            )
            async with asyncio.TaskGroup() as tasks:
                again = {
                    i: tasks.create_task(self._group(items[i], sizes[i], params, salt, split, largest, stats))
                    for i in refused
                }
            for i, task in again.items():
                groups[i] = task.result()
        return groups

    async def _backoff(self, attempt: int) -> None:
        await self._sleep(min(MAX_SLEEP, 2.0 ** (attempt - 1)) * self._rng.uniform(0.5, 1.5))

    async def _group(
        self,
        prompt: Prompt,
        n: int,
        params: SamplingParams,
        salt: str | None,
        split: bool,
        largest: int,
        stats: _Stats,
    ) -> list[Completion]:
        without_logprobs = mixed = 0
        while True:
            if split:
                one = _Ask(prompt, 1, params, salt, largest, seeded=True)
                parts = await asyncio.gather(*(self._fenced(one, stats) for _ in range(n)))
                completions = [replace(c[0], index=i) for i, c in enumerate(parts)]
            else:
                completions = await self._fenced(_Ask(prompt, n, params, salt, largest, seeded=False), stats)
            if self.config.require_logprobs and any(c.logprobs is None for c in completions):
                without_logprobs += 1
                if without_logprobs > MAX_RESAMPLES:
                    raise RolloutError(
                        f"a group came back without usable log-probs {MAX_RESAMPLES + 1} times and log-probs are "
                        "required; the endpoint must return logprobs.token_logprobs with one finite value per "
                        "completion token"
                    )
                stats.resampled += 1
                log.info(
                    "a group came back without log-probs; re-sampling it (%d of %d)", without_logprobs, MAX_RESAMPLES
                )
                continue
            identities = {c.identity for c in completions}
            if len(identities) > 1:  # a split group that straddled a swap, or half unnamed: never returned mixed
                mixed += 1
                stats.mixed += 1
                named = sorted(i for i in identities if i is not None)
                what = f"{len(named)} identities ({', '.join(named)})" if len(named) > 1 else named[0]
                if None in identities:
                    what += " and answers that named no identity"
                if mixed >= self.config.max_attempts:
                    raise RolloutError(
                        f"a group came back from {what} {mixed} times; the replicas serve different weights (or "
                        "some do not say which): check the deployment's hot-loads (`cwtrain hotload list`)"
                    )
                log.info("a group came back from %s; re-sampling it whole", what)
                await self._backoff(mixed)
                continue
            return completions

    async def _fenced(self, ask: _Ask, stats: _Stats) -> list[Completion]:
        """One request's completions, re-requested while the fence refuses the identity that served them."""
        for attempt in range(1, self.config.max_attempts + 1):
            completions = await self._post(ask, stats)
            fence = self._fence()
            identity = completions[0].identity if completions else None
            refusal = fence.refusal(identity)
            if refusal is not None and refusal.kind == "newer":  # published since the sampler last heard?
                fence = await self._confirmed(fence)
                refusal = fence.refusal(identity)
            if refusal is None:
                return [replace(c, version=fence.version(c.identity)) for c in completions]
            if attempt == self.config.max_attempts:
                raise RolloutError(f"completions were {refusal.reason}, {attempt} times; {refusal.advice}")
            stats.refused(refusal, len(completions))
            log.debug(
                "completions were %s; re-requesting them (%d of %d)", refusal.reason, attempt, self.config.max_attempts
            )
            await self._backoff(attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _body(
        self,
        prompt: Prompt,
        as_text: bool,
        text: str | None,
        n: int,
        params: SamplingParams,
        salt: str | None,
        seed: int | None,
    ) -> dict[str, Any]:
        config = self.config
        body: dict[str, Any] = {
            "model": config.model,
            "prompt": text if as_text else list(prompt.ids or ()),
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": False,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.include_stop_str_in_output:
            body["include_stop_str_in_output"] = True
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if as_text:
            body["add_special_tokens"] = False
        if config.logprobs:
            body["logprobs"] = 1
        if config.token_ids:
            for name in OPTIONAL_ID_FIELDS:
                if name not in self._dropped:
                    body[name] = True
        if seed is not None:
            body["seed"] = seed
        nvext: dict[str, Any] = {}
        if salt:
            nvext["cache_salt"] = salt
        if config.routed_experts:
            nvext["extra_fields"] = ["routed_experts"]
        if nvext:
            body["nvext"] = nvext
        return body

    def _prompt_text(self, prompt: Prompt) -> str | None:
        if prompt.text is not None:
            return prompt.text
        if self.tokenizer is not None and prompt.ids is not None:
            return str(self.tokenizer.decode(list(prompt.ids)))
        return None

    async def _post(self, ask: _Ask, stats: _Stats) -> list[Completion]:
        prompt, n, params, salt = ask.prompt, ask.n, ask.params, ask.salt
        limiter = self._limiter
        assert limiter is not None
        seed = self._rng.randrange(2**62) if ask.seeded and self.config.seeds else None
        held = await limiter.acquire(n, ask.largest)
        try:
            original: RolloutError | None = None
            while True:
                as_text = self._text_prompts or original is not None or prompt.ids is None
                text = self._prompt_text(prompt) if as_text else None
                if as_text and text is None:
                    raise RolloutError(
                        "prompts are sent as text but this prompt has only token ids and no tokenizer was given"
                    )
                body = self._body(prompt, as_text, text, n, params, salt, seed)
                try:
                    payload, identity, latency = await self._request(body, stats)
                except _Refused as exc:
                    named = [f for f in OPTIONAL_ID_FIELDS if f in body and f in exc.body]
                    if exc.status == 400 and named:
                        self._dropped.update(named)
                        self._once(
                            f"drop:{named}",
                            "the endpoint refused %s (HTTP 400); dropping it for this run",
                            ", ".join(named),
                        )
                        continue
                    if (
                        original is None
                        and not as_text
                        and exc.status in (400, 422)
                        and self._prompt_text(prompt) is not None
                    ):
                        original = exc
                        continue
                    if original is not None:
                        raise original from exc
                    raise
                except RolloutError as exc:
                    if original is not None:
                        raise original from exc
                    raise
                if original is not None and not self._text_prompts:
                    self._text_prompts = True
                    self._once(
                        "text-prompts",
                        "the endpoint refused a token-id prompt (HTTP %d) and took it as text; sending text prompts "
                        "for the rest of this run (set CWTRAIN_ROLLOUT_TOKEN_ID_PROMPTS=0 to skip the probe)",
                        getattr(original, "status", 400),
                    )
                completions = read_completions(
                    payload,
                    n=n,
                    sent_prompt_ids=None if as_text else prompt.ids,
                    known_prompt_ids=prompt.ids,
                    identity=identity,
                    latency=latency,
                    want_logprobs=self.config.logprobs,
                    want_routes=self.config.routed_experts,
                    retokenize=self._retokenize if (not self.config.token_ids and self.tokenizer is not None) else None,
                )
                stats.cached_tokens += completions[0].cached_tokens or 0
                return completions
        finally:
            limiter.release(held)

    def _retokenize(self, text: str) -> list[int]:
        self._once(
            "retokenize",
            "the endpoint returned no token ids; re-tokenizing completion text with the trainer's tokenizer "
            "(explicit opt-in: CWTRAIN_ROLLOUT_TOKEN_IDS=0)",
        )
        ids = [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        back = self.tokenizer.decode(ids)
        if back != text:
            raise RolloutError(
                "re-tokenized completion does not decode back to the returned text; exact ids are needed: "
                "enable token ids on the endpoint (CWTRAIN_ROLLOUT_TOKEN_IDS=true)"
            )
        return ids

    async def _request(self, body: dict[str, Any], stats: _Stats) -> tuple[Any, str | None, float]:
        client = self._http()
        url = self.config.completions_url
        attempts = self.config.max_attempts
        started = time.monotonic()
        last = ""
        for attempt in range(1, attempts + 1):
            stats.requests += 1
            wait_at_least = 0.0
            try:
                async with asyncio.timeout(self.config.timeout):
                    response = await client.post(url, json=body)
            except (httpx.RequestError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if isinstance(exc, TimeoutError):
                    last = f"no answer within {self.config.timeout:g}s"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    payload, problem = _answer_of(response)
                    if problem is None:
                        latency = time.monotonic() - started
                        stats.latencies.append(latency)
                        identity = response.headers.get(IDENTITY_HEADER) or payload.get("system_fingerprint")
                        return payload, identity if isinstance(identity, str) and identity else None, latency
                    last = problem
                elif status in RETRIED_STATUSES:
                    last = f"HTTP {status}: {response.text[:200]}"
                    wait_at_least = _retry_after(response.headers.get("retry-after")) or 0.0
                else:
                    raise _Refused(status, response.text)
            if attempt == attempts:
                break
            stats.retries += 1
            delay = min(MAX_SLEEP, 2.0 ** (attempt - 1)) * self._rng.uniform(0.5, 1.5)
            delay = min(MAX_SLEEP, max(delay, wait_at_least))
            log.debug("completions attempt %d failed (%s); retrying in %.2fs", attempt, last, delay)
            await self._sleep(delay)
        raise RolloutError(f"completions request failed after {attempts} attempts: {last}")

    def _finish(self, groups: list[list[Completion]], stats: _Stats, elapsed: float) -> RolloutBatch:
        flat = [c for g in groups for c in g]
        total = len(flat)
        aligned = sum(1 for c in flat if c.logprobs is not None)
        kept = self.config.logprobs and total > 0 and aligned == total
        if not kept and aligned:
            self._once(
                "logprobs-dropped", "some samples came back without usable log-probs; dropping log-probs for the batch"
            )
            groups = [[replace(c, logprobs=None) for c in g] for g in groups]
        identities: dict[str, None] = {}
        for c in flat:
            if c.identity is not None:
                identities.setdefault(c.identity)
        fence = self._fence()
        if fence.run_id is not None:  # versions of the run as it is now (a run id learned mid-batch included)
            groups = [[replace(c, version=fence.version(c.identity)) for c in g] for g in groups]
            flat = [c for g in groups for c in g]
        self.ledger.record(flat)
        versions = dict(sorted(Counter(c.version for c in flat if c.version is not None).items()))
        lengths = [len(c.response_ids) for c in flat]
        latencies = sorted(stats.latencies)
        tokens = sum(lengths)
        metrics = {
            "coreweave/generation_seconds": elapsed,
            "coreweave/samples": float(total),
            "coreweave/mean_response_length": tokens / total if total else 0.0,
            "coreweave/truncated_fraction": sum(1 for c in flat if c.truncated) / total if total else 0.0,
            "coreweave/logprobs_aligned_fraction": aligned / total if total else 0.0,
            "coreweave/logprobs_kept": 1.0 if kept else 0.0,
            "coreweave/resampled_groups": float(stats.resampled),
            "coreweave/requests": float(stats.requests),
            "coreweave/retries": float(stats.retries),
            "coreweave/latency_p50_seconds": _percentile(latencies, 0.50),
            "coreweave/latency_p90_seconds": _percentile(latencies, 0.90),
            "coreweave/latency_p99_seconds": _percentile(latencies, 0.99),
            "coreweave/latency_max_seconds": latencies[-1] if latencies else 0.0,
            "coreweave/tokens_per_second": tokens / elapsed if elapsed > 0 else 0.0,
            "coreweave/cached_prompt_tokens": float(stats.cached_tokens),
            "coreweave/identities_seen": float(len(identities)),
            "coreweave/text_prompts": 1.0 if self._text_prompts else 0.0,
        }
        metrics.update(
            served_version_metrics(
                versions,
                published=fence.latest,
                stale=stats.stale,
                mixed=stats.mixed,
                unversioned=total - sum(versions.values()) if fence.run_id is not None else None,
                unpublished=stats.unpublished,
            )
        )
        return RolloutBatch(
            groups=groups,
            metrics=metrics,
            identities=tuple(identities),
            versions=versions,
            published_version=fence.latest,
        )

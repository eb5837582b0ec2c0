"""``CompletionSampler``: one ``/v1/completions`` request per GRPO group (interface.md §4.1–4.3).

The sampler owns one ``httpx.AsyncClient`` (one connection pool, reused across steps) on
its own event-loop thread, so the same sampler serves ``await sampler.sample_groups(...)``
from any event loop and ``sampler.sample_groups_sync(...)`` from plain code — including
code that is itself running inside an event loop.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Concatenate, TypeVar

import httpx

from cwtrain.closing import Closing
from cwtrain.errors import RolloutError
from cwtrain.integrations.nvext import as_cache_salt
from cwtrain.integrations.rollout._runtime import LoopThread, SequenceLimiter
from cwtrain.integrations.rollout.config import RolloutConfig
from cwtrain.integrations.rollout.requests import Prompt, PromptLike, SamplingParams, as_prompt
from cwtrain.integrations.rollout.responses import Completion, read_completions, unfinished
from cwtrain.jsondoc import load_json

__all__ = ["IDENTITY_HEADER", "CompletionSampler", "RolloutBatch"]

log = logging.getLogger("cwtrain.integrations.rollout")

IDENTITY_HEADER = "x-cwtrain-snapshot-identity"
RETRIED_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
OPTIONAL_ID_FIELDS = ("return_tokens_as_token_ids", "return_token_ids")
MAX_SLEEP = 30.0
MAX_RESAMPLES = 2

T = TypeVar("T")


class _Refused(RolloutError):
    """The endpoint answered with a status that is not retried."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"completions request failed: HTTP {status}: {body[:200]}")


@dataclass
class _Stats:
    requests: int = 0
    retries: int = 0
    resampled: int = 0
    cached_tokens: int = 0
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RolloutBatch:
    """The groups of one ``sample_groups`` call, in prompt order, and its metrics.

    Iterating, indexing and ``len`` act on ``groups``.

    Attributes:
        groups: one list of :class:`Completion` per prompt, ``n`` each.
        metrics: ``coreweave/*`` numbers (interface.md §4.3 plus latency percentiles,
            tokens/s, requests, retries, identities seen).
        identities: the served snapshot identities seen, in first-seen order.
    """

    groups: list[list[Completion]]
    metrics: dict[str, float]
    identities: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Any:
        return iter(self.groups)

    def __getitem__(self, index: int) -> list[Completion]:
        return self.groups[index]


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

    # ------------------------------------------------------------------ public

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
        return self._finish(groups, stats, time.monotonic() - started)

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
        for attempt in range(MAX_RESAMPLES + 1):
            if split:
                parts = await asyncio.gather(
                    *(self._post(prompt, 1, params, salt, largest, stats, seeded=True) for _ in range(n))
                )
                completions = [replace(c[0], index=i) for i, c in enumerate(parts)]
            else:
                completions = await self._post(prompt, n, params, salt, largest, stats, seeded=False)
            if not self.config.require_logprobs or all(c.logprobs is not None for c in completions):
                return completions
            if attempt < MAX_RESAMPLES:
                stats.resampled += 1
                log.info("a group came back without log-probs; re-sampling it (%d of %d)", attempt + 1, MAX_RESAMPLES)
        raise RolloutError(
            f"a group came back without usable log-probs {MAX_RESAMPLES + 1} times and log-probs are required; "
            "the endpoint must return logprobs.token_logprobs with one finite value per completion token"
        )

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

    async def _post(
        self,
        prompt: Prompt,
        n: int,
        params: SamplingParams,
        salt: str | None,
        largest: int,
        stats: _Stats,
        *,
        seeded: bool,
    ) -> list[Completion]:
        limiter = self._limiter
        assert limiter is not None
        seed = self._rng.randrange(2**62) if seeded and self.config.seeds else None
        held = await limiter.acquire(n, largest)
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
        return RolloutBatch(groups=groups, metrics=metrics, identities=tuple(identities))

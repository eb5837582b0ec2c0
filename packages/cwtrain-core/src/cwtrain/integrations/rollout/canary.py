"""The canary: after a hot-load, does the deployment serve the trainer's weights?

A fixed probe (a few token-id prompts from the run's own data) is scored by the deployment,
which returns the log-prob its served weights give every prompt token after the ones
before it, and by the trainer, from its own model; the two are compared token by token::

    from cwtrain.integrations.rollout import Canary, CanaryProbe, RolloutConfig

    probe = CanaryProbe.from_prompts(first_batch_prompt_ids, count=4)
    canary = Canary(RolloutConfig.from_env(), probe, trainer_logprobs)   # trainer_logprobs: see below
    result = canary.check(identity="run1-v000007")                       # right after the hot-load
    if not result.passed:
        raise RuntimeError(result.summary())
    metrics.update(result.metrics())                                      # hotload/canary_gap, ...

``trainer_logprobs(prompts)`` is the integration's: for each prompt (token ids), the log-probs
its model gives tokens ``1 .. len - 1`` (the first token has none), from the weights just
published.

**How the deployment is asked.** One ``POST {base_url}/completions`` per prompt and round,
``max_tokens`` 1 (or 0), ``temperature`` 0, ``echo: true`` with ``logprobs: 0`` (the OpenAI
way: the answer's ``logprobs.token_logprobs`` starts with the prompt's tokens, the first one
``null``) and vLLM's ``prompt_logprobs: 0`` (per prompt token ``{"<id>": {"logprob", ...}}``),
which is read first where the endpoint returns it. An optional field the endpoint refuses
with a 400 naming it is dropped for the rest of the canary's life; transient failures are
retried as the sampler retries them (``max_attempts`` tries). The identity that answered is
the ``x-cwtrain-snapshot-identity`` header, else ``system_fingerprint``.

**The gap.** Per token, the absolute difference between the served and the trainer's
log-prob (nats). Per answer (one prompt, one request, one replica), the mean of those over
its tokens: averaging over a prompt damps the rounding noise of single unlikely tokens, whose
log-probs move most under BF16 and kernel differences, while wrong weights move every token.
The check's gap is the **largest answer gap**: one replica serving wrong weights fails the
canary even when its peers are right and all report the same identity. The check passes when
that gap is within ``bound`` (:data:`DEFAULT_CANARY_BOUND` nats) and, when ``identity`` is given,
every answer came from it. ``rounds`` sends each prompt that many times, so that a fleet
behind a round-robin (or random) router answers from every replica: with ``n`` requests
spread at random over 2 replicas, one replica is missed with probability ``2^(1-n)``.
Answers are grouped by the identity that served them (:attr:`CanaryResult.by_identity`): the
endpoint names no replica, so that is as far as replicas can be told apart.

**What it sees, what it does not.** Wrong or corrupted served weights (a bad FULL, a replica
that applied nothing and reports the new identity, a broken delta that passed its checks),
and drift that accumulates over versions, are seen as a gap well above BF16 rounding. A
one-version lag may not be: one optimizer step can move log-probs by less than the bound.
The served identity covers that (the sampler's version fence, and the composer's check that
every replica serves the identity once its hot-load completed). A replica that
answered none of the canary's requests is not checked.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from cwtrain.errors import RolloutError, UsageError
from cwtrain.integrations.rollout.config import RolloutConfig
from cwtrain.integrations.rollout.sampler import IDENTITY_HEADER, MAX_SLEEP, RETRIED_STATUSES

__all__ = [
    "DEFAULT_CANARY_BOUND",
    "Canary",
    "CanaryAnswer",
    "CanaryProbe",
    "CanaryResult",
    "IdentityGap",
    "TrainerLogprobs",
    "judge",
    "judge_samples",
]

#: The default bound on an answer's mean absolute log-prob gap, in nats. BF16 rounding of the
#: served weights alone gives about 5e-4 on the local stack's tiny model; kernels that differ
#: between trainer and engine add more on real models: measure a run's first check on known
#: good weights and set the bound above it.
DEFAULT_CANARY_BOUND = 0.05

#: ``trainer_logprobs(prompts) -> per prompt, the log-probs of tokens 1 .. len - 1``.
TrainerLogprobs = Callable[[Sequence[Sequence[int]]], Sequence[Sequence[float]]]

_OPTIONAL_FIELDS = ("prompt_logprobs", "return_tokens_as_token_ids")


@dataclass(frozen=True)
class CanaryProbe:
    """The fixed prompts a canary scores: token ids, at least two tokens each.

    Raises:
        UsageError: no prompt, or a prompt shorter than two tokens or holding a negative id.
    """

    prompts: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        prompts = tuple(tuple(int(t) for t in p) for p in self.prompts)
        if not prompts:
            raise UsageError("a canary probe needs at least one prompt")
        for i, prompt in enumerate(prompts):
            if len(prompt) < 2:
                raise UsageError(f"canary prompt {i} has {len(prompt)} token(s); the first has no log-prob: give >= 2")
            if min(prompt) < 0:
                raise UsageError(f"canary prompt {i} holds a negative token id")
        object.__setattr__(self, "prompts", prompts)

    @classmethod
    def from_prompts(cls, prompts: Iterable[Sequence[int]], *, count: int = 4, max_tokens: int = 64) -> CanaryProbe:
        """The first ``count`` prompts of at least two tokens, each cut to ``max_tokens`` tokens.

        Take them from the run's own data (its first batch), so that the probe is in
        distribution and stays the same for the whole run.
        """
        if count < 1 or max_tokens < 2:
            raise UsageError(
                f"CanaryProbe.from_prompts needs count >= 1 and max_tokens >= 2 (got {count}, {max_tokens})"
            )
        chosen: list[tuple[int, ...]] = []
        for prompt in prompts:
            ids = tuple(int(t) for t in prompt)[:max_tokens]
            if len(ids) >= 2:
                chosen.append(ids)
            if len(chosen) == count:
                break
        return cls(tuple(chosen))

    @property
    def tokens(self) -> int:
        """Tokens scored per round (every prompt token but the first)."""
        return sum(len(p) - 1 for p in self.prompts)


@dataclass(frozen=True)
class CanaryAnswer:
    """One prompt scored by one request (one replica).

    Attributes:
        prompt: the prompt's index in the probe.
        identity: the identity that answered (``None`` when the endpoint does not say).
        source: ``"prompt_logprobs"`` or ``"echo"``: which part of the answer was read.
        served: the deployment's log-probs of tokens ``1 .. len - 1``.
        trainer: the trainer's log-probs of the same tokens.
        gap: mean absolute difference over its tokens (``inf`` when a served value is not finite).
        max_gap: the largest absolute difference of one token.
    """

    prompt: int
    identity: str | None
    source: str
    served: tuple[float, ...]
    trainer: tuple[float, ...]
    gap: float
    max_gap: float


@dataclass(frozen=True)
class IdentityGap:
    """The answers one identity gave.

    Attributes:
        identity: the identity (``None``: answers that named none).
        answers: how many.
        tokens: tokens scored over them.
        gap: the largest answer gap.
        mean_gap: mean absolute difference over all their tokens.
        max_token_gap: the largest difference of one token.
    """

    identity: str | None
    answers: int
    tokens: int
    gap: float
    mean_gap: float
    max_token_gap: float


@dataclass(frozen=True)
class CanaryResult:
    """What one check found.

    Attributes:
        passed: every answer's gap is within ``bound``, and came from ``expected_identity`` when given.
        bound: the bound, in nats.
        gap: the largest answer gap (the figure the bound applies to).
        mean_gap: mean absolute difference over every scored token.
        max_token_gap: the largest difference of one token.
        tokens: tokens scored in all.
        expected_identity: the identity the check expected (``None``: any).
        answers: every answer, in request order.
        by_identity: the answers grouped by the identity that served them.
        seconds: how long the check took.
    """

    passed: bool
    bound: float
    gap: float
    mean_gap: float
    max_token_gap: float
    tokens: int
    expected_identity: str | None
    answers: tuple[CanaryAnswer, ...] = field(repr=False)
    by_identity: dict[str | None, IdentityGap] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def identities(self) -> tuple[str | None, ...]:
        """The identities that answered, first seen first."""
        return tuple(self.by_identity)

    @property
    def unexpected(self) -> tuple[CanaryAnswer, ...]:
        """Answers from another identity than the expected one."""
        if self.expected_identity is None:
            return ()
        return tuple(a for a in self.answers if a.identity != self.expected_identity)

    def summary(self) -> str:
        """One line: pass or fail, the gap against the bound, and the identities that answered."""
        verdict = "passed" if self.passed else "FAILED"
        parts = [
            f"canary {verdict}: gap {self.gap:.4g} nats (bound {self.bound:g}; mean {self.mean_gap:.4g}, "
            f"max token {self.max_token_gap:.4g}) over {len(self.answers)} answers, {self.tokens} tokens"
        ]
        for identity, group in self.by_identity.items():
            parts.append(f"{identity or '(no identity)'}: gap {group.gap:.4g} over {group.answers} answers")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} answers not from {self.expected_identity!r}")
        return "; ".join(parts)

    def metrics(self) -> dict[str, float]:
        """``hotload/canary_*`` numbers for the run's logger."""
        return {
            "hotload/canary_gap": self.gap,
            "hotload/canary_mean_gap": self.mean_gap,
            "hotload/canary_max_token_gap": self.max_token_gap,
            "hotload/canary_passed": 1.0 if self.passed else 0.0,
            "hotload/canary_answers": float(len(self.answers)),
            "hotload/canary_identities": float(len(self.by_identity)),
        }


class Canary:
    """Scores a fixed probe on a deployment and compares it with the trainer's log-probs.

    Args:
        config: the endpoint (``base_url``, ``model``, ``api_key``, ``timeout``, ``max_attempts``).
        probe: the prompts.
        trainer_logprobs: the trainer's log-probs of each prompt's tokens ``1 .. len - 1``.
        bound: the largest answer gap that passes, in nats.
        rounds: requests per prompt (spread over the replicas by the endpoint's router).
        max_tokens: 1 (the default: every OpenAI-compatible server takes it) or 0 (the prompt only).
        transport: an ``httpx.BaseTransport`` (tests).
        sleep: what waits between retries (default ``time.sleep``).
    """

    def __init__(
        self,
        config: RolloutConfig,
        probe: CanaryProbe,
        trainer_logprobs: TrainerLogprobs,
        *,
        bound: float = DEFAULT_CANARY_BOUND,
        rounds: int = 2,
        max_tokens: int = 1,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        if not math.isfinite(bound) or bound < 0:
            raise UsageError(f"canary bound={bound!r} must be a finite number of nats >= 0")
        if rounds < 1:
            raise UsageError(f"canary rounds={rounds!r} must be >= 1")
        if max_tokens not in (0, 1):
            raise UsageError(f"canary max_tokens={max_tokens!r} must be 0 or 1")
        self.config = config
        self.probe = probe
        self.trainer_logprobs = trainer_logprobs
        self.bound = float(bound)
        self.rounds = rounds
        self.max_tokens = max_tokens
        self._transport = transport
        self._sleep = sleep
        self._dropped: set[str] = set()
        self._deadline: float | None = None

    @property
    def dropped_fields(self) -> frozenset[str]:
        """Optional request fields the endpoint refused (not sent any more)."""
        return frozenset(self._dropped)

    def check(self, *, identity: str | None = None, timeout: float | None = None) -> CanaryResult:
        """Score the probe on the deployment and compare (see the module docs).

        Args:
            identity: the identity just hot-loaded: an answer from another one fails the check.
            timeout: seconds the whole check may take (the publish's share for it): every
                request and retry pause is cut to what is left; ``None``: the rollout
                config's per-request timeout and retries only.

        Raises:
            RolloutError: a request failed after its retries, the endpoint returned no
                prompt log-probs, or ``timeout`` ran out first.
            UsageError: ``trainer_logprobs`` returned the wrong number of values.
        """
        started = time.monotonic()
        self._deadline = None if timeout is None else started + max(0.0, timeout)
        prompts = self.probe.prompts
        expected = [tuple(float(x) for x in row) for row in self.trainer_logprobs([list(p) for p in prompts])]
        if len(expected) != len(prompts) or any(len(e) != len(p) - 1 for e, p in zip(expected, prompts)):
            raise UsageError(
                "trainer_logprobs must return, per prompt, one log-prob for every token but the first "
                f"(expected {[len(p) - 1 for p in prompts]}, got {[len(e) for e in expected]})"
            )
        answers: list[CanaryAnswer] = []
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        with httpx.Client(transport=self._transport, headers=headers, timeout=self.config.timeout) as http:
            for _ in range(self.rounds):
                for index, prompt in enumerate(prompts):
                    served, source, who = self._score(http, prompt)
                    answers.append(_answer(index, who, source, served, expected[index]))
        return self._result(answers, identity, time.monotonic() - started)

    # ---------------------------------------------------------------- internals

    def _body(self, prompt: Sequence[int]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": list(prompt),
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "echo": True,
            "logprobs": 0,
            "stream": False,
        }
        if "prompt_logprobs" not in self._dropped:
            body["prompt_logprobs"] = 0
        if "return_tokens_as_token_ids" not in self._dropped:
            body["return_tokens_as_token_ids"] = True
        return body

    def _score(self, http: httpx.Client, prompt: Sequence[int]) -> tuple[list[float], str, str | None]:
        while True:
            body = self._body(prompt)
            response = self._post(http, body)
            if response.status_code == 400:
                named = [f for f in _OPTIONAL_FIELDS if f in body and f in response.text]
                if named:
                    self._dropped.update(named)
                    continue
            if response.status_code != 200:
                raise RolloutError(f"canary request failed: HTTP {response.status_code}: {response.text[:200]}")
            try:
                payload = json.loads(response.content)
            except ValueError:
                raise RolloutError(f"canary answer is not JSON: {response.text[:200]!r}") from None
            identity = response.headers.get(IDENTITY_HEADER) or (
                payload.get("system_fingerprint") if isinstance(payload, dict) else None
            )
            served, source = _prompt_logprobs(payload, prompt)
            return served, source, identity if isinstance(identity, str) and identity else None

    def _left(self, last: str) -> float:
        """Seconds the check has left (the config's timeout without a deadline); raises once none is."""
        if self._deadline is None:
            return self.config.timeout
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise RolloutError("canary ran out of its time" + (f" (last: {last})" if last else ""))
        return min(self.config.timeout, left)

    def _post(self, http: httpx.Client, body: dict[str, Any]) -> httpx.Response:
        last = ""
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                response = http.post(self.config.completions_url, json=body, timeout=self._left(last))
            except httpx.RequestError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code not in RETRIED_STATUSES:
                    return response
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            if attempt < self.config.max_attempts:
                self._sleep(min(MAX_SLEEP, 0.5 * 2 ** (attempt - 1), self._left(last)))
        raise RolloutError(f"canary request failed after {self.config.max_attempts} attempts: {last}")

    def _result(self, answers: list[CanaryAnswer], identity: str | None, seconds: float) -> CanaryResult:
        return judge(answers, bound=self.bound, identity=identity, seconds=seconds)


def judge(
    answers: Sequence[CanaryAnswer], *, bound: float, identity: str | None = None, seconds: float = 0.0
) -> CanaryResult:
    """The verdict on ``answers``: the largest answer gap against ``bound``, and every answer from ``identity`` when given.

    Raises:
        UsageError: no answer.
    """
    if not answers:
        raise UsageError("a canary verdict needs at least one answer")
    diffs = [abs(s - t) if math.isfinite(s) else math.inf for a in answers for s, t in zip(a.served, a.trainer)]
    groups: dict[str | None, list[CanaryAnswer]] = {}
    for answer in answers:
        groups.setdefault(answer.identity, []).append(answer)
    by_identity = {}
    for who, group in groups.items():
        group_diffs = [abs(s - t) if math.isfinite(s) else math.inf for a in group for s, t in zip(a.served, a.trainer)]
        by_identity[who] = IdentityGap(
            identity=who,
            answers=len(group),
            tokens=len(group_diffs),
            gap=max(a.gap for a in group),
            mean_gap=sum(group_diffs) / len(group_diffs),
            max_token_gap=max(group_diffs),
        )
    gap = max(a.gap for a in answers)
    within = gap <= bound
    foreign = identity is not None and any(a.identity != identity for a in answers)
    return CanaryResult(
        passed=within and not foreign,
        bound=bound,
        gap=gap,
        mean_gap=sum(diffs) / len(diffs),
        max_token_gap=max(diffs),
        tokens=len(diffs),
        expected_identity=identity,
        answers=tuple(answers),
        by_identity=by_identity,
        seconds=seconds,
    )


def judge_samples(
    samples: Iterable[tuple[str | None, Sequence[float], Sequence[float]]],
    *,
    identity: str,
    bound: float = DEFAULT_CANARY_BOUND,
) -> CanaryResult | None:
    """The canary from log-probs a framework computes anyway: its trainer's and the deployment's, of sampled tokens.

    Each sample is ``(served identity, served log-probs, trainer log-probs)`` of the same
    tokens (one GRPO group, or one completion: one request, so one replica), the trainer's
    from the weights published as ``identity``. Only samples served by ``identity`` are
    judged (older ones carry the steps since; they are left out, as are samples of no
    token); the verdict is :func:`judge`'s on them: the largest sample gap against
    ``bound``. No forward pass of cwtrain's own: a framework hands over what it computed for
    its loss (``hotload/canary_gap``).

    Returns:
        the verdict (``answers`` in sample order, ``source`` ``"samples"``), or ``None`` when
        no sample of ``identity`` had a token.

    Raises:
        UsageError: a sample's two sequences differ in length, or ``bound`` is not a finite number >= 0.
    """
    if not math.isfinite(bound) or bound < 0:
        raise UsageError(f"canary bound={bound!r} must be a finite number of nats >= 0")
    answers: list[CanaryAnswer] = []
    for index, (served_by, served, trainer) in enumerate(samples):
        if len(served) != len(trainer):
            raise UsageError(f"sample {index}: {len(served)} served log-probs but {len(trainer)} trainer log-probs")
        if served_by == identity and len(served):
            answers.append(
                _answer(index, served_by, "samples", [float(x) for x in served], [float(x) for x in trainer])
            )
    return judge(answers, bound=bound, identity=identity) if answers else None


def _answer(
    index: int, identity: str | None, source: str, served: Sequence[float], trainer: Sequence[float]
) -> CanaryAnswer:
    diffs = [abs(s - t) if math.isfinite(s) else math.inf for s, t in zip(served, trainer, strict=True)]
    return CanaryAnswer(
        prompt=index,
        identity=identity,
        source=source,
        served=tuple(served),
        trainer=tuple(trainer),
        gap=sum(diffs) / len(diffs),
        max_gap=max(diffs),
    )


def _finite_or_nan(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _prompt_logprobs(payload: Any, prompt: Sequence[int]) -> tuple[list[float], str]:
    """The served log-probs of tokens ``1 .. len - 1``: from ``prompt_logprobs``, else from ``echo``."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    plp = choice.get("prompt_logprobs")
    if isinstance(plp, list) and len(plp) == len(prompt):
        values: list[float] = []
        for token, entry in zip(prompt[1:], plp[1:]):
            found = entry.get(str(token)) if isinstance(entry, dict) else None
            if not isinstance(found, dict):
                break
            values.append(_finite_or_nan(found.get("logprob")))
        else:
            return values, "prompt_logprobs"
    block = choice.get("logprobs")
    lps = block.get("token_logprobs") if isinstance(block, dict) else None
    if not isinstance(lps, list) or len(lps) < len(prompt):
        raise RolloutError(
            "the endpoint returned no prompt log-probs (looked for choices[0].prompt_logprobs and an echoed "
            "choices[0].logprobs.token_logprobs covering the prompt); the canary needs echo + logprobs, as vLLM "
            "serves them"
        )
    tokens = block.get("tokens") if isinstance(block, dict) else None
    if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        echoed = [int(t.removeprefix("token_id:")) for t in tokens[: len(prompt)]]
        if echoed != list(prompt):
            raise RolloutError(
                f"the endpoint echoed other tokens than the probe's: {echoed[:8]}… vs {list(prompt)[:8]}…"
            )
    return [_finite_or_nan(v) for v in lps[1 : len(prompt)]], "echo"

"""Reading ``/v1/completions`` answers: exact token ids, log-probs, routes (interface.md §4.3).

Exact completion token ids come from the first of three shapes that is present; every
other shape present must agree with it:

1. ``choices[i].token_ids`` (prompt: ``choices[i].prompt_token_ids``) — vLLM ``return_token_ids``;
2. ``choices[i].logprobs.tokens`` with every entry ``"token_id:<N>"`` — vLLM
   ``return_tokens_as_token_ids`` with ``logprobs``;
3. ``choices[i].nvext.completion_token_ids`` or ``choices[i].nvext.engine_data.completion_token_ids``
   (and, when ``n = 1``, the same under the top-level ``nvext``; prompt:
   ``…engine_data.prompt_token_ids``) — NVIDIA Dynamo.

Text is never re-tokenized unless the caller opts in (``CWTRAIN_ROLLOUT_TOKEN_IDS=0`` plus the
trainer's tokenizer), and then only when the tokens decode back to exactly the returned text.

Whatever the answer holds, reading it raises nothing but :class:`~cwtrain.errors.RolloutError`:
a choice ``index`` that is not one of ``0 .. n-1`` (each once), a token id outside
``[0, 2**31)``, routes whose bytes do not fill their dtype are refused by name; a value of the
wrong kind where an optional field belongs (log-probs, ``cached_tokens``) counts as absent.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cwtrain.errors import RolloutError

__all__ = ["ID_FIELDS", "UNFINISHED_REASONS", "Completion", "decode_routed_experts", "read_completions", "unfinished"]

ID_FIELDS = (
    "choices[].token_ids",
    "choices[].logprobs.tokens ('token_id:N')",
    "choices[].nvext.completion_token_ids",
    "choices[].nvext.engine_data.completion_token_ids",
    "nvext.completion_token_ids (n = 1)",
    "nvext.engine_data.completion_token_ids (n = 1)",
)

_NO_IDS_HELP = (
    "the completions response has no exact token ids (looked for {fields}); enable token ids on the "
    "endpoint: keep CWTRAIN_ROLLOUT_TOKEN_IDS=true so requests carry return_token_ids and "
    "return_tokens_as_token_ids (vLLM) and make the engine return them (Dynamo: nvext completion_token_ids); "
    "only if the endpoint cannot, opt in to re-tokenizing with CWTRAIN_ROLLOUT_TOKEN_IDS=0 and the "
    "trainer's tokenizer"
)


@dataclass(frozen=True)
class Completion:
    """One sampled sequence.

    Attributes:
        prompt_ids: the prompt's token ids (as sent, or as the endpoint returned them for a text prompt).
        response_ids: the exact completion token ids, final EOS/stop token included.
        text: the completion text.
        logprobs: one log-prob per ``response_ids`` entry, or ``None``.
        finish_reason: ``"stop"``, ``"length"``, or what the endpoint said.
        identity: the snapshot identity that served it (``x-cwtrain-snapshot-identity``
            header, else ``system_fingerprint``), or ``None`` when the endpoint does not say.
        latency: seconds of the request that produced it (all retries included).
        stop_reason: the endpoint's ``stop_reason`` (stop string or token id), if any.
        routed_experts: int32 ``[len(tokens) - 1, layers, top_k]`` MoE routes, or ``None``.
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens`` of its request.
        token_source: where the ids came from (``token_ids``, ``logprobs.tokens``, ``nvext``, ``retokenized``).
        index: the choice index within its request.
        version: the version of the sampler's run that ``identity`` names
            (:func:`cwtrain.hotload.format.identity.identity_version`); ``None`` when the run is not
            known, or the identity is another run's (or ``initial``, or none).
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    finish_reason: str
    identity: str | None
    latency: float
    stop_reason: int | str | None = None
    routed_experts: np.ndarray[Any, Any] | None = field(default=None, compare=False, repr=False)
    cached_tokens: int | None = None
    token_source: str = "token_ids"
    index: int = 0
    version: int | None = None

    @property
    def truncated(self) -> bool:
        """Whether generation stopped at ``max_tokens`` (``finish_reason == "length"``)."""
        return self.finish_reason == "length"

    @property
    def tokens(self) -> list[int]:
        """Prompt ids followed by completion ids."""
        return [*self.prompt_ids, *self.response_ids]


#: ``finish_reason`` values of a generation the engine gave up (vLLM's ``abort``, ``error``).
UNFINISHED_REASONS = frozenset({"abort", "error"})

#: Token ids are vocabulary indexes: at least 0, below 2**31 (an int32, as engines hold them).
MAX_TOKEN_ID = 2**31 - 1


def _int_list(value: Any) -> list[int] | None:
    if type(value) is list and all(type(x) is int for x in value):
        return value
    return None


def _id_list(value: Any, field: str) -> list[int] | None:
    """``value`` as token ids: ``None`` when it is not a list of integers; a list of integers
    with one outside ``[0, MAX_TOKEN_ID]`` is a malformed answer."""
    ids = _int_list(value)
    if ids is not None and ids and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
        bad = next(i for i in ids if i < 0 or i > MAX_TOKEN_ID)
        shown = str(bad) if abs(bad) < 10**12 else f"an integer of {len(str(abs(bad)))} digits"
        raise RolloutError(f"{field} holds the token id {shown}, outside 0..{MAX_TOKEN_ID}; the answer is malformed")
    return ids


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _ids_from_token_strings(tokens: Any) -> list[int] | None:
    if type(tokens) is not list:
        return None
    ids = []
    for token in tokens:
        if type(token) is not str or not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token[9:]))
        except ValueError:
            return None
    return _id_list(ids, "choices[].logprobs.tokens")


def _completion_sources(choice: dict[str, Any], top: dict[str, Any], n: int) -> list[tuple[str, list[int]]]:
    found: list[tuple[str, list[int]]] = []
    ids = _id_list(choice.get("token_ids"), "choices[].token_ids")
    if ids is not None:
        found.append(("token_ids", ids))
    tokens = _dig(choice, "logprobs", "tokens")
    if found and type(tokens) is list and tokens == [f"token_id:{t}" for t in found[0][1]]:
        found.append(("logprobs.tokens", found[0][1]))  # agrees (the cheap check of the common case)
    else:
        ids = _ids_from_token_strings(tokens)
        if ids is not None:
            found.append(("logprobs.tokens", ids))
    candidates = [
        _dig(choice, "nvext", "completion_token_ids"),
        _dig(choice, "nvext", "engine_data", "completion_token_ids"),
    ]
    if n == 1:
        candidates += [
            _dig(top, "nvext", "completion_token_ids"),
            _dig(top, "nvext", "engine_data", "completion_token_ids"),
        ]
    for candidate in candidates:
        ids = _id_list(candidate, "nvext completion_token_ids")
        if ids is not None:
            found.append(("nvext", ids))
            break
    return found


def _prompt_sources(choice: dict[str, Any], top: dict[str, Any], n: int) -> list[tuple[str, list[int]]]:
    found: list[tuple[str, list[int]]] = []
    candidates = [
        ("choices[].prompt_token_ids", choice.get("prompt_token_ids")),
        ("choices[].nvext.engine_data.prompt_token_ids", _dig(choice, "nvext", "engine_data", "prompt_token_ids")),
    ]
    if n == 1:
        candidates.append(("nvext.engine_data.prompt_token_ids", _dig(top, "nvext", "engine_data", "prompt_token_ids")))
    for name, value in candidates:
        ids = _id_list(value, name)
        if ids is not None:
            found.append((name, ids))
    return found


def _logprobs(choice: dict[str, Any], count: int) -> tuple[float, ...] | None:
    values = _dig(choice, "logprobs", "token_logprobs")
    if type(values) is not list or len(values) != count:
        return None
    if not all(type(value) is float or type(value) is int for value in values):
        return None
    try:
        floats = tuple(float(v) for v in values)
    except OverflowError:  # an integer past the float range: not a log-prob
        return None
    if not all(math.isfinite(v) for v in floats):
        return None
    return floats


_ROUTE_DTYPES: dict[str, np.dtype[Any]] = {"uint8": np.dtype(np.uint8), "uint16": np.dtype("<u2")}


def decode_routed_experts(value: Any, rows: int) -> np.ndarray[Any, Any]:
    """Decode ``nvext.routed_experts`` into an int32 ``[rows, layers, top_k]`` array.

    Args:
        value: ``{"data": base64 C-order, "shape": [rows, layers, top_k], "start": 0, "dtype": "uint8"|"uint16"}``.
        rows: the expected row count (prompt + completion length − 1).

    Raises:
        RolloutError: the value is malformed or has another row count.
    """
    if not isinstance(value, dict):
        raise RolloutError(f"nvext.routed_experts is {type(value).__name__}, expected an object with data/shape/dtype")
    dtype = _ROUTE_DTYPES.get(str(value.get("dtype")))
    if dtype is None:
        raise RolloutError(f"nvext.routed_experts.dtype={value.get('dtype')!r}; expected 'uint8' or 'uint16'")
    shape = _int_list(value.get("shape"))
    if shape is None or len(shape) != 3 or min(shape) < 0:
        raise RolloutError(f"nvext.routed_experts.shape={value.get('shape')!r}; expected [rows, layers, top_k]")
    if value.get("start", 0) != 0:
        raise RolloutError(
            f"nvext.routed_experts.start={value.get('start')!r}; only 0 (routes from the first token) is supported"
        )
    try:
        raw = base64.b64decode(value.get("data") or "", validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise RolloutError(f"nvext.routed_experts.data is not base64: {exc}") from None
    if len(raw) % dtype.itemsize:
        raise RolloutError(
            f"nvext.routed_experts.data holds {len(raw)} bytes, not a whole number of {value.get('dtype')} values"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if array.size != math.prod(shape):
        raise RolloutError(f"nvext.routed_experts holds {array.size} values, shape {shape} needs {math.prod(shape)}")
    if shape[0] != rows:
        raise RolloutError(
            f"nvext.routed_experts has {shape[0]} rows; expected prompt + completion length - 1 = {rows}"
        )
    routes: np.ndarray[Any, Any] = array.reshape(shape).astype(np.int32)
    return routes


def read_completions(
    payload: Any,
    *,
    n: int,
    sent_prompt_ids: Sequence[int] | None,
    known_prompt_ids: Sequence[int] | None,
    identity: str | None,
    latency: float,
    want_logprobs: bool,
    want_routes: bool,
    retokenize: Callable[[str], list[int]] | None = None,
) -> list[Completion]:
    """Turn one completions response into ``n`` :class:`Completion` objects.

    Args:
        payload: the decoded JSON body.
        n: the request's ``n``.
        sent_prompt_ids: the token-id prompt sent (``None`` for a text prompt); returned prompt
            ids must equal it.
        known_prompt_ids: the trainer's ids for a text prompt, used when the endpoint returns none.
        identity: the served snapshot identity of the response.
        latency: seconds the request took.
        want_logprobs: read ``logprobs.token_logprobs``.
        want_routes: read and decode ``nvext.routed_experts``.
        retokenize: the explicit opt-in for endpoints without ids: text → ids (the caller checks
            nothing; this function checks the round trip). ``None``: no ids is an error.

    Raises:
        RolloutError: wrong choice count, disagreeing id sources, prompt ids that differ from
            the sent ones, no ids at all, or malformed routes.
    """
    if not isinstance(payload, dict):
        raise RolloutError(f"completions response is a JSON {type(payload).__name__}, expected an object")
    choices = payload.get("choices")
    if type(choices) is not list or len(choices) != n or not all(isinstance(c, dict) for c in choices):
        count = len(choices) if type(choices) is list else "no"
        raise RolloutError(f"completions response has {count} choices for n={n}")
    if n > 1:
        choices = _in_index_order(choices, n)
    cached = _dig(payload, "usage", "prompt_tokens_details", "cached_tokens")
    cached_tokens = cached if type(cached) is int else None
    out = []
    for position, choice in enumerate(choices):
        text = choice.get("text")
        if not isinstance(text, str):
            text = ""
        sources = _completion_sources(choice, payload, n)
        logprobs = None
        if sources:
            source, ids = sources[0]
            for other, other_ids in sources[1:]:
                if other_ids != ids:
                    raise RolloutError(
                        f"choice {position}: token ids from {source} ({len(ids)} ids) and {other} "
                        f"({len(other_ids)} ids) disagree; the endpoint's answer is inconsistent"
                    )
            if want_logprobs:
                logprobs = _logprobs(choice, len(ids))
        elif retokenize is not None:
            source, ids = "retokenized", retokenize(text)
            if want_logprobs:
                logprobs = _logprobs(choice, len(ids))
        else:
            raise RolloutError(_NO_IDS_HELP.format(fields=", ".join(ID_FIELDS)))
        prompt_ids = _prompt_ids(choice, payload, n, position, sent_prompt_ids, known_prompt_ids)
        routes = None
        if want_routes:
            value = _dig(choice, "nvext", "routed_experts")
            if value is None and n == 1:
                value = _dig(payload, "nvext", "routed_experts")
            if value is None:
                raise RolloutError(
                    "routed experts were requested (nvext.extra_fields) but the response has no nvext.routed_experts; "
                    "enable routing capture on the engine or turn routed experts off"
                )
            routes = decode_routed_experts(value, len(prompt_ids) + len(ids) - 1)
        reason = choice.get("finish_reason")
        stop_reason = choice.get("stop_reason")
        out.append(
            Completion(
                prompt_ids=prompt_ids,
                response_ids=tuple(ids),
                text=text,
                logprobs=logprobs,
                finish_reason=reason if isinstance(reason, str) and reason else "stop",
                identity=identity,
                latency=latency,
                stop_reason=stop_reason if isinstance(stop_reason, int | str) else None,
                routed_experts=routes,
                cached_tokens=cached_tokens,
                token_source=source,
                index=position,
            )
        )
    return out


def unfinished(payload: Any) -> str | None:
    """Why an answer holds a completion that did not finish, or ``None``.

    A choice without a ``finish_reason`` (``null``, absent, not text) was cut short on the way
    (a stream that broke off, a proxy that gave up); one that ended ``abort`` or ``error`` was
    given up by the engine. Neither is a finished completion; the sampler retries the request.
    Answers malformed otherwise are left to :func:`read_completions`.
    """
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if type(choices) is not list:
        return None
    for position, choice in enumerate(choices):
        if not isinstance(choice, dict):
            return None
        reason = choice.get("finish_reason")
        if not isinstance(reason, str) or not reason:
            return f"choice {position} has no finish_reason ({reason!r}): the completion did not finish"
        if reason in UNFINISHED_REASONS:
            return f"choice {position} ended with finish_reason {reason!r}: the engine gave the completion up"
    return None


def _in_index_order(choices: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The choices sorted by ``index``: each of ``0 .. n-1`` once (or no choice has one: as sent)."""
    indexes = [choice.get("index") for choice in choices]
    if all(index is None for index in indexes):
        return choices
    numbers = [index for index in indexes if type(index) is int]
    if len(numbers) != len(indexes) or sorted(numbers) != list(range(n)):
        shown = ", ".join(repr(index)[:40] for index in indexes)
        raise RolloutError(f"completions response has choice indexes [{shown}]; expected 0 .. {n - 1}, each once")
    return sorted(choices, key=lambda choice: int(choice["index"]))


def _prompt_ids(
    choice: dict[str, Any],
    payload: dict[str, Any],
    n: int,
    position: int,
    sent: Sequence[int] | None,
    known: Sequence[int] | None,
) -> tuple[int, ...]:
    returned = _prompt_sources(choice, payload, n)
    if sent is not None:
        sent_list = sent if type(sent) is list else list(sent)
        for name, ids in returned:
            if ids != sent_list:
                raise RolloutError(
                    f"choice {position}: {name} ({len(ids)} ids) differs from the token-id prompt sent "
                    f"({len(sent_list)} ids); the endpoint changed the prompt (added special tokens?)"
                )
        return tuple(sent_list)
    if returned:
        first_name, first = returned[0]
        for name, ids in returned[1:]:
            if ids != first:
                raise RolloutError(f"choice {position}: prompt ids from {first_name} and {name} disagree")
        return tuple(first)
    if known is not None:
        return tuple(known)
    raise RolloutError(
        "a text prompt was sent and the response has no prompt token ids (choices[].prompt_token_ids); "
        "pass the prompt's token ids or enable return_token_ids on the endpoint"
    )

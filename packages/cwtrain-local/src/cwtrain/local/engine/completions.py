"""OpenAI-compatible ``/v1/completions`` on the tiny model, as vLLM 0.31 answers it.

:func:`complete` turns one request body into one response body (a JSON object), or, with
``stream: true``, into the server-sent events of the stream (an iterator of byte strings).
The pieces every engine endpoint shares live here too: request parsing (:func:`parse_sampling`),
the context check (:func:`token_budget`), error bodies, SSE framing, the ``/v1/models`` card,
and the :class:`Engine` seam through which a replica batches generation.
:mod:`cwtrain.local.engine.chat` (``/v1/chat/completions``) and :mod:`cwtrain.local.engine.tokenization`
(``/tokenize``, ``/detokenize``) build on them.

Which vLLM: 0.31.0, the version NVIDIA Dynamo 1.6.1 pins (CoreWeave's ``dynamo-vllm`` runtime
is Dynamo with vLLM); NeMo Gym 0.7.0 pins vLLM 0.29.0, which behaves the same in everything
mirrored here. Fields accepted (others are ignored, as vLLM ignores unknown fields):

| Field | Meaning |
|---|---|
| ``model`` | must name the served model when given (404 otherwise) |
| ``prompt`` | text, token ids, or a list of either (one set of choices per prompt) |
| ``n``, ``max_tokens`` (16), ``temperature`` (1.0), ``top_p`` (1.0), ``top_k`` (0/-1 = off), ``seed`` | sampling |
| ``stop`` (≤ 4 strings), ``stop_token_ids``, ``include_stop_str_in_output``, ``ignore_eos`` | stopping |
| ``logprobs`` (k ≥ 0, or -1 for all) | ``choices[i].logprobs``: ``text_offset``, ``token_logprobs``, ``tokens``, ``top_logprobs`` (the sampled token first, then the k most likely) |
| ``echo``, ``prompt_logprobs`` (k ≥ 0, or -1) | the prompt in front of the completion, its tokens' log-probs (``max_tokens: 0``: the prompt only); per choice ``prompt_logprobs`` (:mod:`cwtrain.local.engine.prompt_logprobs`) |
| ``return_token_ids`` | per choice ``token_ids`` and ``prompt_token_ids`` |
| ``return_tokens_as_token_ids`` | ``logprobs.tokens`` entries are ``token_id:<N>`` |
| ``add_special_tokens`` (true) | text prompts start with ``<bos>`` |
| ``stream``, ``stream_options`` (``include_usage``, ``continuous_usage_stats``) | server-sent events, one per token |
| ``nvext.extra_fields`` | ``completion_token_ids``, ``engine_data``, ``routed_experts``: per-choice ``nvext`` (and top-level ``nvext`` when one choice); not streamed |
| ``nvext.cache_salt`` | accepted (the tiny engine keeps no prompt cache) |

As in vLLM: a stop token ends a sequence and stays in ``token_ids``; its text is in ``text``
only with ``include_stop_str_in_output``. A prompt that does not leave room for ``max_tokens``
gets vLLM's 400 ``This model's maximum context length is N tokens. However, you requested M
output tokens and your prompt contains P input tokens, …`` (``param: "input_tokens"``).
Responses carry every field vLLM's do, nulls included; ``usage.prompt_tokens_details`` is
``{"cached_tokens": 0}`` (vLLM with ``--enable-prompt-tokens-details``). ``system_fingerprint``
is the served snapshot identity (on the final chunk of a stream, or on the usage chunk when
one follows). Streams are ``data: <json>\\n\\n`` events ending with ``data: [DONE]\\n\\n``: one
chunk per token and choice, ``prompt_token_ids`` on a choice's first chunk, ``finish_reason``
and ``stop_reason`` on its last; while stop strings are excluded from the text, the last
``len(longest stop) - 1`` characters are held back until the sequence ends.

Log-probs are the model's raw distribution (before temperature, top-k, top-p). Bad requests
raise :class:`CompletionError` (HTTP 400 or 404) with an OpenAI error body.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from cwtrain.local.engine.model import GeneratedSequence, PromptTokenScore, TinyLM, TokenEvent
from cwtrain.local.engine.prompt_logprobs import Echo, echo_logprobs, prompt_logprobs_body, prompt_text

__all__ = [
    "MAX_N",
    "SSE_CONTENT_TYPE",
    "SSE_DONE",
    "Answer",
    "CompletionError",
    "DirectEngine",
    "Engine",
    "Sampling",
    "TextDelta",
    "check_model",
    "complete",
    "completion_logprobs",
    "error_body",
    "invalid",
    "models_body",
    "parse_echo",
    "parse_sampling",
    "sse_event",
    "token_budget",
    "token_name",
    "usage_body",
]

_MAX_STOP = 4
#: The most sequences one request may ask for.
MAX_N = 256
#: The fake MoE routes reported for ``nvext.extra_fields: ["routed_experts"]``: per row, per layer.
ROUTED_TOP_K = 2
ROUTED_EXPERTS = 8
#: The ``Content-Type`` of a stream (what Starlette sends for vLLM's ``text/event-stream``).
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
#: The event that ends every stream.
SSE_DONE = b"data: [DONE]\n\n"
_LOGPROB_FLOOR = -9999.0

#: What an endpoint answers: a JSON object, or the events of a stream.
Answer = dict[str, Any] | Iterator[bytes]


@dataclass
class CompletionError(Exception):
    """A request the endpoint refuses (OpenAI error shape)."""

    message: str
    status: int = 400
    param: str | None = None

    def __str__(self) -> str:
        return self.message


def invalid(text: str, param: str | None = None, value: Any = None) -> CompletionError:
    """A 400 worded as vLLM words its validation errors (``text (parameter=…, value=…)``)."""
    extras = [f"parameter={param}"] if param is not None else []
    if value is not None:
        extras.append(f"value={value}")
    return CompletionError(f"{text} ({', '.join(extras)})" if extras else text, 400, param)


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    kind = {
        400: "BadRequestError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }.get(status, "APIError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def models_body(
    model: str, created: int, *, root: str | None = None, max_model_len: int | None = None
) -> dict[str, Any]:
    """The ``/v1/models`` answer for one served model (vLLM's card: ``root`` is the model's path)."""
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root if root is not None else model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event: ``data: <compact json>`` and a blank line."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def check_model(body: Any, model: str) -> dict[str, Any]:
    """``body`` as a JSON object naming the served model (or none); raises otherwise."""
    if not isinstance(body, dict):
        raise CompletionError("the request body must be a JSON object")
    if body.get("model") not in (None, model):
        raise CompletionError(f"The model `{body.get('model')}` does not exist.", status=404, param="model")
    return body


class Engine(Protocol):
    """How requests reach the model: a replica batches them (:class:`cwtrain.local.engine.replica.Batcher`)."""

    def generate(
        self, lm: TinyLM, prompt: list[int], n: int, seed: int | None, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        """``n`` sequences for ``prompt`` (``sampling``: :meth:`TinyLM.generate` keywords)."""
        ...

    def stream(
        self, lm: TinyLM, prompt: list[int], n: int, seed: int | None, sampling: dict[str, Any]
    ) -> Iterator[tuple[int, TokenEvent]]:
        """The same, as ``(sequence index, event)`` for every token as it is sampled."""
        ...


class DirectEngine:
    """Generation on the calling thread (a stream's events come once generation is done)."""

    def generate(
        self, lm: TinyLM, prompt: list[int], n: int, seed: int | None, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        """See :meth:`Engine.generate`."""
        return lm.generate(prompt, n=n, seed=seed, **sampling)

    def stream(
        self, lm: TinyLM, prompt: list[int], n: int, seed: int | None, sampling: dict[str, Any]
    ) -> Iterator[tuple[int, TokenEvent]]:
        """See :meth:`Engine.stream`."""
        events: list[tuple[int, TokenEvent]] = []
        lm.generate(prompt, n=n, seed=seed, on_token=lambda index, event: events.append((index, event)), **sampling)
        yield from events


def _int(body: Mapping[str, Any], name: str, default: int | None, *, low: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise CompletionError(f"{name} must be an integer, got {value!r}", param=name)
    if low is not None and value < low:
        raise CompletionError(f"{name} must be >= {low}, got {value}", param=name)
    return value


def _float(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CompletionError(f"{name} must be a number, got {value!r}", param=name)
    return float(value)


def _stops(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise CompletionError("stop must be a string or a list of strings", param="stop")
    if len(stops) > _MAX_STOP:
        raise CompletionError(f"stop takes at most {_MAX_STOP} strings", param="stop")
    if any(not s for s in stops):
        raise invalid("stop cannot contain an empty string.")
    return stops


@dataclass(frozen=True)
class Sampling:
    """The sampling part of a completions or chat request, checked.

    Attributes:
        n: Sequences per prompt.
        seed: Sampling seed (``None``: random).
        max_tokens: Requested output tokens (``None``: up to the context, chat only).
        max_tokens_param: The field it came from (``max_tokens`` or ``max_completion_tokens``).
        params: :meth:`TinyLM.generate` keywords other than ``max_tokens``.
        logprobs: How many alternatives per token to report (``None``: no log-probs at all).
        stream: Answer with server-sent events.
        include_usage: End the stream with a usage chunk.
        continuous_usage: Put the running usage on every chunk.
        return_token_ids: Send token ids (vLLM's ``return_token_ids``).
        as_ids: Name tokens ``token_id:<N>`` in log-probs.
    """

    n: int
    seed: int | None
    max_tokens: int | None
    max_tokens_param: str
    params: dict[str, Any] = field(default_factory=dict)
    logprobs: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    as_ids: bool = False


def parse_sampling(body: Mapping[str, Any], lm: TinyLM, *, chat: bool) -> Sampling:
    """Check the fields completions and chat share (chat: ``logprobs`` is a flag, ``top_logprobs`` the count).

    Raises:
        CompletionError: A field is invalid (400).
    """
    n = _int(body, "n", 1, low=1) or 1
    if n > MAX_N:
        raise CompletionError(f"n must be <= {MAX_N}, got {n}", param="n")
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens, param = _int(body, "max_completion_tokens", None), "max_completion_tokens"
    else:
        max_tokens, param = _int(body, "max_tokens", None if chat else 16), "max_tokens"
    temperature = _float(body, "temperature", 1.0)
    top_p = _float(body, "top_p", 1.0)
    if temperature < 0:
        raise invalid(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)
    if temperature > 2:
        raise invalid(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
    if not 0 < top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    top_k = _int(body, "top_k", 0) or 0
    if top_k < -1:
        raise invalid(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    seed = _int(body, "seed", None)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise CompletionError("stop_token_ids must be a list of token ids", param="stop_token_ids")
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    if options and not stream:
        raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise CompletionError("stream_options must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage"))
    continuous = include_usage and bool(options and options.get("continuous_usage_stats"))
    logprobs = _chat_logprobs(body) if chat else _completion_logprobs(body)
    engine_k = 0 if logprobs is None else lm.config.vocab_size if logprobs == -1 else logprobs
    params = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k if top_k > 0 else 0,
        "stop_token_ids": tuple(stop_ids),
        "stop": tuple(_stops(body)),
        "include_stop_str_in_output": bool(body.get("include_stop_str_in_output")),
        "ignore_eos": bool(body.get("ignore_eos")),
        "top_logprobs": min(engine_k, lm.config.vocab_size),
    }
    return Sampling(
        n=n,
        seed=seed,
        max_tokens=max_tokens,
        max_tokens_param=param,
        params=params,
        logprobs=None if logprobs is None else lm.config.vocab_size if logprobs == -1 else logprobs,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        return_token_ids=bool(body.get("return_token_ids")),
        as_ids=bool(body.get("return_tokens_as_token_ids")),
    )


def _completion_logprobs(body: Mapping[str, Any]) -> int | None:
    value = body.get("logprobs")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("`logprobs` must be an integer.", "logprobs", value)
    if value < 0 and value != -1:
        raise invalid("`logprobs` must be a positive value or -1.", "logprobs", value)
    return value


def _chat_logprobs(body: Mapping[str, Any]) -> int | None:
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int)):
        raise invalid("`top_logprobs` must be an integer.", "top_logprobs", top)
    if top is not None and top < 0 and top != -1:
        raise invalid("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
    if top is not None and top != 0 and not body.get("logprobs"):
        raise invalid("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    return (top or 0) if body.get("logprobs") else None


def parse_echo(body: Mapping[str, Any], lm: TinyLM, sampling: Sampling) -> Echo:
    """Read ``echo`` and ``prompt_logprobs`` (:mod:`cwtrain.local.engine.prompt_logprobs`).

    Raises:
        CompletionError: ``prompt_logprobs`` is invalid (400), worded as vLLM words it.
    """
    echo = bool(body.get("echo"))
    value = body.get("prompt_logprobs")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid("`prompt_logprobs` must be an integer.", "prompt_logprobs", value)
        if sampling.stream and (value > 0 or value == -1):
            raise invalid("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if value < 0 and value != -1:
            raise invalid("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", value)
    count = value if value is not None else (sampling.logprobs if echo else None)
    if count == -1:
        count = lm.config.vocab_size
    return Echo(echo=echo, prompt_logprobs=count, only_prompt=echo and sampling.max_tokens == 0)


def token_budget(lm: TinyLM, prompt: Sequence[int], sampling: Sampling, *, text: str | None = None) -> int:
    """The output tokens ``prompt`` may have, or vLLM 0.31's 400 when the context cannot hold them.

    ``text`` is the prompt's text when it was given as text (vLLM checks its length in
    characters first, then tokenizes at most one token past the limit).

    Raises:
        CompletionError: ``max_tokens`` exceeds the context, the prompt leaves no room for it,
            or nothing is left to generate.
    """
    limit = lm.config.max_position_embeddings
    wanted = sampling.max_tokens or 0
    name = sampling.max_tokens_param
    if wanted > limit:
        raise invalid(
            f"{name}={wanted} cannot be greater than max_model_len={limit}. Please request fewer output tokens.",
            name,
            wanted,
        )
    max_input = limit - wanted
    longest_token = max(len(t) for t in lm.tokenizer.tokens)
    if text is not None and len(text) > max_input * longest_token:
        raise invalid(
            f"This model's maximum context length is {limit} tokens. However, you requested {wanted} output "
            f"tokens and your prompt contains {len(text)} characters (more than {max_input * longest_token} "
            f"characters, which is the upper bound for {max_input} input tokens). Please reduce the length of "
            "the input prompt or the number of requested output tokens.",
            "input_text",
            len(text),
        )
    count = min(len(prompt), max_input + 1) if text is not None else len(prompt)
    if count > max_input:
        at_least = "at least " if count == max_input + 1 else ""
        raise invalid(
            f"This model's maximum context length is {limit} tokens. However, you requested {wanted} output "
            f"tokens and your prompt contains {at_least}{count} input tokens, for a total of {at_least}"
            f"{count + wanted} tokens. Please reduce the length of the input prompt or the number of requested "
            "output tokens.",
            "input_tokens",
            count,
        )
    budget = limit - len(prompt) if sampling.max_tokens is None else min(sampling.max_tokens, limit - len(prompt))
    if budget < 1:
        raise invalid(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
    return budget


def token_name(lm: TinyLM, token_id: int, as_ids: bool) -> str:
    """A token as log-probs name it: ``token_id:<N>`` or its vocabulary text."""
    return f"token_id:{token_id}" if as_ids else lm.tokenizer.token_text(token_id)


def _floor(logprob: float) -> float:
    return max(logprob, _LOGPROB_FLOOR)


def completion_logprobs(
    lm: TinyLM,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[Sequence[tuple[int, float]]],
    as_ids: bool,
    text_start: int = 0,
) -> dict[str, Any]:
    """The completions ``logprobs`` block for some tokens (one chunk's, or a whole choice's)."""
    offsets: list[int] = []
    names: list[str] = []
    top_logprobs: list[dict[str, float]] = []
    for i, tok in enumerate(token_ids):
        offsets.append(text_start if not offsets else offsets[-1] + len(names[-1]))
        names.append(token_name(lm, tok, as_ids))
        entry = {names[-1]: _floor(logprobs[i])}  # the sampled token first, as vLLM's engine puts it
        for alt, lp in tops[i] if i < len(tops) else ():
            entry.setdefault(token_name(lm, alt, as_ids), _floor(lp))
        top_logprobs.append(entry)
    return {
        "text_offset": offsets,
        "token_logprobs": [_floor(lp) for lp in logprobs],
        "tokens": names,
        "top_logprobs": top_logprobs,
    }


def _routes(prompt: Sequence[int], completion: Sequence[int], layers: int) -> dict[str, Any]:
    """Deterministic stand-in MoE routes, shape ``[rows, layers, top_k]`` uint8."""
    tokens = np.asarray(list(prompt) + list(completion), dtype=np.int64)[:-1]
    rows = len(tokens)
    layer = np.arange(layers)[None, :, None]
    slot = np.arange(ROUTED_TOP_K)[None, None, :]
    routes = ((tokens[:, None, None] * (layer + 1) + slot) % ROUTED_EXPERTS).astype(np.uint8)
    return {
        "data": base64.b64encode(routes.tobytes(order="C")).decode("ascii"),
        "shape": [rows, layers, ROUTED_TOP_K],
        "start": 0,
        "dtype": "uint8",
    }


def usage_body(prompt_tokens: int, completion_tokens: int, *, details: bool = True) -> dict[str, Any]:
    """``usage`` (with ``prompt_tokens_details.cached_tokens``: the tiny engine caches nothing)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    return usage


def _prompts(body: Mapping[str, Any], lm: TinyLM, add_special: bool) -> list[tuple[list[int], str | None]]:
    prompt = body.get("prompt")
    vocab = lm.config.vocab_size

    def one(item: Any) -> tuple[list[int], str | None]:
        if isinstance(item, str):
            return lm.tokenizer.encode(item, add_special_tokens=add_special), item
        if isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            if any(not 0 <= t < vocab for t in item):
                raise CompletionError(f"prompt token ids must lie in [0, {vocab})", param="prompt")
            return list(item), None
        raise CompletionError("prompt must be a string, a list of token ids, or a list of those", param="prompt")

    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        prompts = [one(prompt)]
    elif isinstance(prompt, list) and prompt:
        prompts = [one(p) for p in prompt]
    else:
        raise CompletionError("prompt is required: a string or a non-empty list of token ids", param="prompt")
    if any(not ids for ids, _ in prompts):
        raise CompletionError("a prompt is empty; send at least one token", param="prompt")
    return prompts


def complete(body: Any, lm: TinyLM, *, identity: str, model: str, engine: Engine | None = None) -> Answer:
    """Answer one completions request with ``lm`` (serving ``identity``).

    Returns the response object, or with ``stream: true`` the stream's events (each
    ``bytes`` is one event; generation runs as the iterator is consumed). ``engine``
    replaces :class:`DirectEngine` (a replica passes its batcher, which merges concurrent
    requests for the same prompt and settings).

    Raises:
        CompletionError: The request is invalid (400) or names another model (404); raised
            before anything is generated.
    """
    body = check_model(body, model)
    engine = engine or DirectEngine()
    add_special = body.get("add_special_tokens", True) is not False
    prompts = _prompts(body, lm, add_special)
    sampling = parse_sampling(body, lm, chat=False)
    echo = parse_echo(body, lm, sampling)
    if echo.only_prompt:  # vLLM samples one token it does not return
        sampling = replace(sampling, max_tokens=1)
    nvext = body.get("nvext") or {}
    if not isinstance(nvext, dict):
        raise CompletionError("nvext must be an object", param="nvext")
    extra = nvext.get("extra_fields") or []
    if not isinstance(extra, list):
        raise CompletionError("nvext.extra_fields must be a list of strings", param="nvext.extra_fields")
    budgets = [token_budget(lm, ids, sampling, text=text) for ids, text in prompts]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": model}
    echoes = [_Echoed.of(lm, ids, text, sampling, echo) for ids, text in prompts]
    if sampling.stream:
        return _stream(lm, engine, [ids for ids, _ in prompts], budgets, sampling, head, identity, echoes)

    choices: list[dict[str, Any]] = []
    prompt_tokens = completion_tokens = 0
    for p_index, ((prompt, _), budget, echoed) in enumerate(zip(prompts, budgets, echoes)):
        seqs = _generate(engine, lm, prompt, sampling, budget)
        prompt_tokens += len(prompt)
        for j, seq in enumerate(seqs):
            completion_tokens += len(seq.token_ids)
            logprobs = None
            if sampling.logprobs is not None:
                logprobs = completion_logprobs(lm, seq.token_ids, seq.logprobs, seq.top_logprobs, sampling.as_ids)
            text, logprobs = echoed.front(lm, seq.text, logprobs, sampling)
            choice: dict[str, Any] = {
                "index": p_index * sampling.n + j,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": seq.finish_reason,
                "stop_reason": seq.stop_reason,
                "token_ids": list(seq.token_ids) if sampling.return_token_ids else None,
                "prompt_logprobs": echoed.prompt_logprobs,
                "prompt_token_ids": list(prompt) if sampling.return_token_ids else None,
                "routed_experts": None,
            }
            ext: dict[str, Any] = {}
            if "completion_token_ids" in extra:
                ext["completion_token_ids"] = list(seq.token_ids)
            if "engine_data" in extra:
                ext["engine_data"] = {"completion_token_ids": list(seq.token_ids), "prompt_token_ids": list(prompt)}
            if "routed_experts" in extra:
                ext["routed_experts"] = _routes(prompt, seq.token_ids, lm.config.num_hidden_layers)
            if ext:
                choice["nvext"] = ext
            choices.append(choice)
    response: dict[str, Any] = head | {
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": identity,
        "usage": usage_body(prompt_tokens, completion_tokens) | {"completion_tokens_details": None},
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    if len(choices) == 1 and "nvext" in choices[0]:
        response["nvext"] = dict(choices[0]["nvext"])
    return response


@dataclass(frozen=True)
class _Echoed:
    """One prompt's part of an answer that echoes or scores it."""

    echo: Echo
    prompt: list[int]
    text: str
    scores: list[PromptTokenScore | None] | None
    prompt_logprobs: list[Any] | None

    @classmethod
    def of(cls, lm: TinyLM, prompt: list[int], text: str | None, sampling: Sampling, echo: Echo) -> _Echoed:
        scores = None
        if echo.prompt_logprobs is not None:
            scores = lm.score_prompt(prompt, top_logprobs=echo.prompt_logprobs)
        body = prompt_logprobs_body(lm, scores, echo.prompt_logprobs or 0) if scores is not None else None
        shown = prompt_text(lm, prompt, text, sampling.return_token_ids) if echo.echo else ""
        return cls(echo, prompt, shown, scores, body)

    def front(
        self, lm: TinyLM, text: str, logprobs: dict[str, Any] | None, sampling: Sampling
    ) -> tuple[str, dict[str, Any] | None]:
        """A choice's (or its first chunk's) text and log-probs with the prompt in front, when echoed."""
        if not self.echo.echo:
            return text, logprobs
        if self.echo.only_prompt:
            text, logprobs = "", None
        if sampling.logprobs is not None:
            assert self.scores is not None
            logprobs = echo_logprobs(lm, self.prompt, self.scores, sampling.logprobs, sampling.as_ids, logprobs)
        return self.text + text, logprobs


def _generate(
    engine: Engine, lm: TinyLM, prompt: list[int], sampling: Sampling, budget: int
) -> list[GeneratedSequence]:
    try:
        return engine.generate(lm, prompt, sampling.n, sampling.seed, sampling.params | {"max_tokens": budget})
    except ValueError as exc:
        raise CompletionError(str(exc)) from exc


class TextDelta:
    """One sequence's streamed text: what a chunk adds, holding back a possible stop string's start.

    vLLM holds back the last ``len(longest stop string) - 1`` characters while stop strings
    are excluded from the output, and sends them (or drops them) when the sequence ends.
    """

    def __init__(self, sampling: Sampling) -> None:
        stops = sampling.params["stop"]
        keep = sampling.params["include_stop_str_in_output"]
        self.hold = max(len(s) for s in stops) - 1 if stops and not keep else 0
        self.sent = 0

    def next(self, event: TokenEvent) -> str:
        """The text to send with ``event``'s chunk."""
        end = len(event.text) if event.finish_reason is not None else len(event.text) - self.hold
        if end <= self.sent:
            return ""
        delta, self.sent = event.text[self.sent : end], end
        return delta


def _stream(
    lm: TinyLM,
    engine: Engine,
    prompts: list[list[int]],
    budgets: list[int],
    sampling: Sampling,
    head: dict[str, Any],
    identity: str,
    echoes: list[_Echoed],
) -> Iterator[bytes]:
    """The completions stream: a chunk per token and choice, then usage and ``[DONE]``."""
    prompt_total = completion_total = 0
    try:
        for p_index, (prompt, budget, echoed) in enumerate(zip(prompts, budgets, echoes)):
            prompt_total += len(prompt)
            deltas = [TextDelta(sampling) for _ in range(sampling.n)]
            counts = [0] * sampling.n
            sent_text = [0] * sampling.n
            params = sampling.params | {"max_tokens": budget}
            for j, event in engine.stream(lm, prompt, sampling.n, sampling.seed, params):
                text = deltas[j].next(event)
                logprobs = None
                if sampling.logprobs is not None:
                    logprobs = completion_logprobs(
                        lm, [event.token_id], [event.logprob], [event.top], sampling.as_ids, sent_text[j]
                    )
                first = counts[j] == 0
                if first:
                    text, logprobs = echoed.front(lm, text, logprobs, sampling)
                counts[j] += 1
                sent_text[j] += len(text)
                completion_total += 1
                choice = {
                    "index": p_index * sampling.n + j,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": event.finish_reason,
                    "stop_reason": event.stop_reason,
                    "prompt_token_ids": list(prompt) if first and sampling.return_token_ids else None,
                    "token_ids": [event.token_id] if sampling.return_token_ids else None,
                }
                chunk: dict[str, Any] = head | {"choices": [choice]}
                if event.finish_reason is not None and not sampling.include_usage:
                    chunk["system_fingerprint"] = identity
                if sampling.continuous_usage:
                    chunk["usage"] = usage_body(len(prompt), counts[j], details=False)
                yield sse_event(chunk)
        if sampling.include_usage:
            usage = usage_body(prompt_total, completion_total)
            yield sse_event(head | {"choices": [], "usage": usage, "system_fingerprint": identity})
    except ValueError as exc:  # after the 200 went out: vLLM's in-stream error event
        yield sse_event(error_body(str(exc), 400))
    yield SSE_DONE

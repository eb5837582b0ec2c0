"""OpenAI-compatible ``/v1/completions`` on the tiny model, as vLLM and Dynamo answer it.

:func:`complete` turns one request body into one response body for the weights a replica
serves. What it accepts (other fields are ignored, as vLLM ignores unknown sampling knobs):

| Field | Meaning |
|---|---|
| ``model`` | must name the served model when given |
| ``prompt`` | text, token ids, or a list of either (one set of choices per prompt) |
| ``n``, ``max_tokens`` (16), ``temperature`` (1.0), ``top_p`` (1.0), ``top_k`` (0/-1 = off), ``seed`` | sampling |
| ``stop`` (≤ 4 strings), ``stop_token_ids``, ``include_stop_str_in_output``, ``ignore_eos`` | stopping |
| ``logprobs`` (k ≥ 0) | ``choices[i].logprobs`` with ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset`` |
| ``return_token_ids`` | per choice ``token_ids`` and ``prompt_token_ids`` |
| ``return_tokens_as_token_ids`` | ``logprobs.tokens`` entries are ``token_id:<N>`` |
| ``add_special_tokens`` (true) | text prompts start with ``<bos>`` |
| ``nvext.extra_fields`` | ``completion_token_ids``, ``engine_data``, ``routed_experts``: per-choice ``nvext`` (and top-level ``nvext`` when one choice) |
| ``nvext.cache_salt`` | accepted (the tiny engine keeps no prompt cache) |
| ``stream`` | only ``false`` |

Log-probs are the model's raw distribution (before temperature, top-k, top-p). ``system_fingerprint``
is the served snapshot identity. Bad requests raise :class:`CompletionError` (HTTP 400 or 404)
with an OpenAI error body.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cwtrain.local.model import GeneratedSequence, TinyLM

__all__ = ["CompletionError", "Generate", "complete", "error_body", "models_body"]

_MAX_STOP = 4
#: The most sequences one request may ask for.
MAX_N = 256
#: The fake MoE routes reported for ``nvext.extra_fields: ["routed_experts"]``: per row, per layer.
ROUTED_TOP_K = 2
ROUTED_EXPERTS = 8


@dataclass
class CompletionError(Exception):
    """A request the endpoint refuses (OpenAI error shape)."""

    message: str
    status: int = 400
    param: str | None = None

    def __str__(self) -> str:
        return self.message


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "APIError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def models_body(model: str, created: int) -> dict[str, Any]:
    """The ``/v1/models`` answer for one served model."""
    card = {"id": model, "object": "model", "created": created, "owned_by": "cwtrain-local", "root": model}
    return {"object": "list", "data": [card]}


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


def _prompts(body: Mapping[str, Any], lm: TinyLM, add_special: bool) -> list[list[int]]:
    prompt = body.get("prompt")
    vocab = lm.config.vocab_size

    def one(item: Any) -> list[int]:
        if isinstance(item, str):
            return lm.tokenizer.encode(item, add_special_tokens=add_special)
        if isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            if any(not 0 <= t < vocab for t in item):
                raise CompletionError(f"prompt token ids must lie in [0, {vocab})", param="prompt")
            return list(item)
        raise CompletionError("prompt must be a string, a list of token ids, or a list of those", param="prompt")

    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        prompts = [one(prompt)]
    elif isinstance(prompt, list) and prompt:
        prompts = [one(p) for p in prompt]
    else:
        raise CompletionError("prompt is required: a string or a non-empty list of token ids", param="prompt")
    if any(not p for p in prompts):
        raise CompletionError("a prompt is empty; send at least one token", param="prompt")
    return prompts


def _stops(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise CompletionError("stop must be a string or a list of strings", param="stop")
    if len(stops) > _MAX_STOP:
        raise CompletionError(f"stop takes at most {_MAX_STOP} strings", param="stop")
    return stops


def _logprobs_block(seq: GeneratedSequence, lm: TinyLM, k: int, as_ids: bool, text_start: int = 0) -> dict[str, Any]:
    def name(tok: int) -> str:
        return f"token_id:{tok}" if as_ids else lm.tokenizer.token_text(tok)

    offsets, pos = [], text_start
    for tok in seq.token_ids:
        offsets.append(pos)
        if tok not in lm.tokenizer.special_ids:
            pos += len(lm.tokenizer.token_text(tok))
    tops: list[dict[str, float] | None] = []
    for i, tok in enumerate(seq.token_ids):
        entry = {name(t): lp for t, lp in (seq.top_logprobs[i] if k else [])}
        entry[name(tok)] = seq.logprobs[i]
        tops.append(entry)
    return {
        "tokens": [name(t) for t in seq.token_ids],
        "token_logprobs": list(seq.logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
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


#: ``generate(lm, prompt_ids, n, seed, sampling) -> sequences``: how :func:`complete` samples.
Generate = Callable[[TinyLM, list[int], int, "int | None", dict[str, Any]], list[GeneratedSequence]]


def complete(body: Any, lm: TinyLM, *, identity: str, model: str, generate: Generate | None = None) -> dict[str, Any]:
    """Answer one completions request with ``lm`` (serving ``identity``).

    ``generate`` replaces ``lm.generate`` (a replica passes its batcher, which merges
    concurrent requests for the same prompt and settings).

    Raises:
        CompletionError: The request is invalid (400) or names another model (404).
    """
    if not isinstance(body, dict):
        raise CompletionError("the request body must be a JSON object")
    if body.get("model") not in (None, model):
        raise CompletionError(f"The model `{body.get('model')}` does not exist.", status=404, param="model")
    if body.get("stream"):
        raise CompletionError("stream=true is not supported by cwtrain-local", param="stream")
    if body.get("echo"):
        raise CompletionError("echo=true is not supported by cwtrain-local", param="echo")
    add_special = body.get("add_special_tokens", True) is not False
    prompts = _prompts(body, lm, add_special)
    n = _int(body, "n", 1, low=1) or 1
    if n > MAX_N:
        raise CompletionError(f"n must be <= {MAX_N}, got {n}", param="n")
    max_tokens = _int(body, "max_tokens", 16, low=0)
    assert max_tokens is not None
    top_k = _int(body, "top_k", 0) or 0
    seed = _int(body, "seed", None)
    k_logprobs = _int(body, "logprobs", None, low=0)
    temperature = _float(body, "temperature", 1.0)
    top_p = _float(body, "top_p", 1.0)
    if temperature < 0:
        raise CompletionError("temperature must be >= 0", param="temperature")
    if not 0 < top_p <= 1:
        raise CompletionError("top_p must be in (0, 1]", param="top_p")
    stops = _stops(body)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) for t in stop_ids):
        raise CompletionError("stop_token_ids must be a list of token ids", param="stop_token_ids")
    nvext = body.get("nvext") or {}
    if not isinstance(nvext, dict):
        raise CompletionError("nvext must be an object", param="nvext")
    extra = nvext.get("extra_fields") or []
    if not isinstance(extra, list):
        raise CompletionError("nvext.extra_fields must be a list of strings", param="nvext.extra_fields")
    return_ids = bool(body.get("return_token_ids"))
    as_ids = bool(body.get("return_tokens_as_token_ids"))

    sampling: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k if top_k > 0 else 0,
        "stop_token_ids": tuple(stop_ids),
        "stop": tuple(stops),
        "include_stop_str_in_output": bool(body.get("include_stop_str_in_output")),
        "ignore_eos": bool(body.get("ignore_eos")),
        "top_logprobs": k_logprobs or 0,
    }
    choices: list[dict[str, Any]] = []
    prompt_tokens = completion_tokens = 0
    for p_index, prompt in enumerate(prompts):
        try:
            if generate is None:
                seqs = lm.generate(prompt, n=n, seed=seed, **sampling)
            else:
                seqs = generate(lm, prompt, n, seed, sampling)
        except ValueError as exc:
            raise CompletionError(str(exc)) from exc
        prompt_tokens += len(prompt)
        for j, seq in enumerate(seqs):
            completion_tokens += len(seq.token_ids)
            choice: dict[str, Any] = {
                "index": p_index * n + j,
                "text": seq.text,
                "logprobs": _logprobs_block(seq, lm, k_logprobs, as_ids) if k_logprobs is not None else None,
                "finish_reason": seq.finish_reason,
                "stop_reason": seq.stop_reason,
                "prompt_logprobs": None,
            }
            if return_ids:
                choice["token_ids"] = list(seq.token_ids)
                choice["prompt_token_ids"] = list(prompt)
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
    response: dict[str, Any] = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": identity,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }
    if len(choices) == 1 and "nvext" in choices[0]:
        response["nvext"] = dict(choices[0]["nvext"])
    return response

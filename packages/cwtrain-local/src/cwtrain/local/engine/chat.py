"""OpenAI-compatible ``/v1/chat/completions`` on the tiny model, as vLLM 0.31 answers it.

:func:`chat_complete` answers one request: a ``chat.completion`` object, or with
``stream: true`` the ``chat.completion.chunk`` events of the stream. The conversation is
rendered with the tokenizer's chat template (:data:`cwtrain.local.engine.tokenizer.CHAT_TEMPLATE`, the
one in the checkpoint's ``tokenizer_config.json``) and tokenized as vLLM does it: text parts
of a message joined with a newline, a ``developer`` message rendered as ``system``, the
rendered text encoded without adding ``<bos>`` again (``add_special_tokens`` false) — so
``/tokenize`` with the same ``messages`` (:mod:`cwtrain.local.engine.tokenization`) gives exactly the
prompt ids a generation used. Sampling, stopping, context checks, token ids and the served
identity are those of :mod:`cwtrain.local.engine.completions`.

| Field | Meaning |
|---|---|
| ``messages`` | ``role`` and ``content`` (a string, null, or text parts); other keys are ignored |
| ``max_completion_tokens`` / ``max_tokens`` | output tokens (default: the rest of the context) |
| ``logprobs`` (bool), ``top_logprobs`` (k ≥ 0, or -1) | ``choices[i].logprobs.content[t] = {token, logprob, bytes, top_logprobs}`` |
| ``return_tokens_as_token_ids`` | ``token`` is ``token_id:<N>`` (``bytes`` stay those of the token's text) |
| ``return_token_ids`` | ``choices[i].token_ids`` and top-level ``prompt_token_ids`` (first chunk when streaming) |
| ``add_generation_prompt`` (true), ``continue_final_message``, ``chat_template``, ``chat_template_kwargs``, ``tools``, ``documents``, ``add_special_tokens`` (false) | rendering |
| ``echo`` | the reply starts with the last message's content when it has the reply's role |
| ``n``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``, ``include_stop_str_in_output``, ``ignore_eos``, ``stream``, ``stream_options`` | as for completions |

The reply's ``message`` is ``{"role", "content", "refusal", "annotations", "audio",
"function_call", "reasoning"}`` (no tool or reasoning parser runs: ``content`` is the whole
text). A stream sends, per choice, a first chunk ``delta: {"role": "assistant", "content": ""}``,
then one chunk per token (``delta: {"content": …}``, its ``logprobs`` and ``token_ids``), the
last with ``finish_reason`` and ``stop_reason``; then the usage chunk when asked, then
``data: [DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cwtrain.local.engine.completions import (
    SSE_DONE,
    Answer,
    CompletionError,
    DirectEngine,
    Engine,
    Sampling,
    TextDelta,
    check_model,
    error_body,
    invalid,
    parse_sampling,
    sse_event,
    token_budget,
    token_name,
    usage_body,
)
from cwtrain.local.engine.model import GeneratedSequence, TinyLM, TokenEvent
from cwtrain.local.engine.tokenizer import ChatTemplateError

__all__ = ["ChatPrompt", "chat_complete", "render_chat"]

_FLOOR = -9999.0


class ChatPrompt:
    """A rendered conversation: its text, its token ids, and the messages as rendered."""

    def __init__(self, text: str, ids: list[int], messages: list[dict[str, Any]]) -> None:
        self.text = text
        self.ids = ids
        self.messages = messages


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise CompletionError("messages must be a list of messages", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise CompletionError(f"messages[{i}] must be an object with a string role", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if isinstance(part, str):
                    texts.append(part)
                elif isinstance(part, dict) and part.get("type", "text") in ("text", "input_text") and "text" in part:
                    texts.append(str(part["text"]))
                else:
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise CompletionError(
                        f"messages[{i}].content: part type {kind!r} is not supported by this text-only model",
                        param="messages",
                    )
            content = "\n".join(texts)
        elif content is not None and not isinstance(content, str):
            raise CompletionError(f"messages[{i}].content must be a string, a list of parts or null", param="messages")
        role = "system" if message["role"] == "developer" else message["role"]
        out.append({**message, "role": role, "content": content})
    return out


def render_chat(body: Mapping[str, Any], lm: TinyLM) -> ChatPrompt:
    """Render and tokenize ``body["messages"]`` as vLLM's chat endpoint and ``/tokenize`` do.

    Raises:
        CompletionError: The messages or rendering options are invalid, or the template fails (400).
    """
    messages = _messages(body.get("messages"))
    add_generation_prompt = body.get("add_generation_prompt", True) is not False
    continue_final = bool(body.get("continue_final_message"))
    if continue_final and add_generation_prompt:
        raise invalid("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise CompletionError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    for reserved in ("chat_template", "tokenize"):
        if reserved in kwargs:
            raise invalid(f"`{reserved}` is not allowed in `chat_template_kwargs`.", "chat_template_kwargs")
    template = body.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise CompletionError("chat_template must be a string", param="chat_template")
    variables = {k: v for k, v in kwargs.items() if k not in ("add_generation_prompt", "continue_final_message")}
    try:
        text = lm.tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            tools=body.get("tools"),
            documents=body.get("documents"),
            **variables,
        )
    except ChatTemplateError as exc:
        raise CompletionError(str(exc)) from exc
    ids = lm.tokenizer.encode(text, add_special_tokens=body.get("add_special_tokens") is True)
    return ChatPrompt(text, ids, messages)


def chat_logprobs(
    lm: TinyLM,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[Sequence[tuple[int, float]]],
    k: int,
    as_ids: bool,
) -> dict[str, Any]:
    """The chat ``logprobs`` block: per token, the first ``k`` entries of the engine's ranking.

    vLLM's engine ranks the sampled token first, then the most likely ones, so
    ``top_logprobs`` starts with the sampled token.
    """
    content = []
    for i, tok in enumerate(token_ids):
        ranked = [(tok, logprobs[i])] + [(t, lp) for t, lp in (tops[i] if i < len(tops) else ()) if t != tok]
        content.append(
            {
                "token": token_name(lm, tok, as_ids),
                "logprob": max(logprobs[i], _FLOOR),
                "bytes": list(lm.tokenizer.token_text(tok).encode()),
                "top_logprobs": [
                    {
                        "token": (name := token_name(lm, t, as_ids)),
                        "logprob": max(lp, _FLOOR),
                        "bytes": list(name.encode()),
                    }
                    for t, lp in ranked[:k]
                ],
            }
        )
    return {"content": content}


def chat_complete(body: Any, lm: TinyLM, *, identity: str, model: str, engine: Engine | None = None) -> Answer:
    """Answer one chat completions request with ``lm`` (serving ``identity``).

    Returns the ``chat.completion`` object, or with ``stream: true`` the stream's events.

    Raises:
        CompletionError: The request is invalid (400) or names another model (404); raised
            before anything is generated.
    """
    body = check_model(body, model)
    prompt = render_chat(body, lm)
    sampling = parse_sampling(body, lm, chat=True)
    budget = token_budget(lm, prompt.ids, sampling, text=prompt.text)
    engine = engine or DirectEngine()
    role = "assistant" if body.get("add_generation_prompt", True) is not False else _last_role(prompt.messages)
    echo = _echo(prompt.messages, role) if body.get("echo") else ""
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk" if sampling.stream else "chat.completion",
        "created": int(time.time()),
        "model": model,
    }
    if sampling.stream:
        return _stream(lm, engine, prompt.ids, budget, sampling, head, identity, role, echo)
    try:
        seqs = engine.generate(lm, prompt.ids, sampling.n, sampling.seed, sampling.params | {"max_tokens": budget})
    except ValueError as exc:
        raise CompletionError(str(exc)) from exc
    return head | {
        "choices": [_choice(lm, j, seq, sampling, role, echo) for j, seq in enumerate(seqs)],
        "service_tier": None,
        "system_fingerprint": identity,
        "usage": usage_body(len(prompt.ids), sum(len(s.token_ids) for s in seqs)) | {"completion_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt.ids) if sampling.return_token_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _last_role(messages: Sequence[Mapping[str, Any]]) -> str:
    return str(messages[-1]["role"]) if messages else "assistant"


def _echo(messages: Sequence[Mapping[str, Any]], role: str) -> str:
    if messages and messages[-1].get("role") == role:
        return str(messages[-1].get("content") or "")
    return ""


def _choice(lm: TinyLM, index: int, seq: GeneratedSequence, sampling: Sampling, role: str, echo: str) -> dict[str, Any]:
    logprobs = None
    if sampling.logprobs is not None:
        logprobs = chat_logprobs(lm, seq.token_ids, seq.logprobs, seq.top_logprobs, sampling.logprobs, sampling.as_ids)
    message = {
        "role": role,
        "content": echo + seq.text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": seq.finish_reason,
        "stop_reason": seq.stop_reason,
        "token_ids": list(seq.token_ids) if sampling.return_token_ids else None,
        "routed_experts": None,
    }


def _stream(
    lm: TinyLM,
    engine: Engine,
    prompt: list[int],
    budget: int,
    sampling: Sampling,
    head: dict[str, Any],
    identity: str,
    role: str,
    echo: str,
) -> Iterator[bytes]:
    """The chat stream: a role chunk per choice, a chunk per token and choice, usage, ``[DONE]``."""

    def running(completion: int) -> dict[str, Any]:
        return usage_body(len(prompt), completion, details=False)

    try:
        for j in range(sampling.n):
            first: dict[str, Any] = head | {
                "choices": [
                    {"index": j, "delta": {"role": role, "content": ""}, "logprobs": None, "finish_reason": None}
                ],
                "prompt_token_ids": list(prompt) if sampling.return_token_ids else None,
                "prompt_text": None,
            }
            if sampling.continuous_usage:
                first["usage"] = running(0)
            yield sse_event(first)
        if echo:
            for j in range(sampling.n):
                chunk = head | {
                    "choices": [{"index": j, "delta": {"content": echo}, "logprobs": None, "finish_reason": None}]
                }
                if sampling.continuous_usage:
                    chunk["usage"] = running(0)
                yield sse_event(chunk)
        deltas = [TextDelta(sampling) for _ in range(sampling.n)]
        counts = [0] * sampling.n
        params = sampling.params | {"max_tokens": budget}
        for j, event in engine.stream(lm, prompt, sampling.n, sampling.seed, params):
            counts[j] += 1
            yield sse_event(
                _token_chunk(lm, head, j, event, deltas[j].next(event), sampling, identity, counts[j], running)
            )
        if sampling.include_usage:
            usage = usage_body(len(prompt), sum(counts))
            yield sse_event(head | {"choices": [], "usage": usage, "system_fingerprint": identity})
    except ValueError as exc:  # after the 200 went out: vLLM's in-stream error event
        yield sse_event(error_body(str(exc), 400))
    yield SSE_DONE


def _token_chunk(
    lm: TinyLM,
    head: dict[str, Any],
    index: int,
    event: TokenEvent,
    text: str,
    sampling: Sampling,
    identity: str,
    count: int,
    running: Callable[[int], dict[str, Any]],
) -> dict[str, Any]:
    logprobs = None
    if sampling.logprobs is not None:
        logprobs = chat_logprobs(lm, [event.token_id], [event.logprob], [event.top], sampling.logprobs, sampling.as_ids)
    choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
    if event.finish_reason is not None:
        choice["finish_reason"] = event.finish_reason
        choice["stop_reason"] = event.stop_reason
    choice["token_ids"] = [event.token_id] if sampling.return_token_ids else None
    chunk: dict[str, Any] = head | {"choices": [choice]}
    if event.finish_reason is not None and not sampling.include_usage:
        chunk["system_fingerprint"] = identity
    if sampling.continuous_usage:
        chunk["usage"] = running(count)
    return chunk

"""vLLM's ``/tokenize`` and ``/detokenize`` (at the server root, not under ``/v1``) on the tiny model.

:func:`tokenize` takes either form vLLM 0.31 takes and answers
``{"count", "max_model_len", "tokens", "token_strs"}``:

- completion form ``{"model"?, "prompt": str, "add_special_tokens": true, "return_token_strs": false}``;
- chat form ``{"model"?, "messages": [...], "add_generation_prompt": true, "continue_final_message":
  false, "add_special_tokens": false, "chat_template"?, "chat_template_kwargs"?, "tools"?,
  "return_token_strs": false}``, rendered exactly as ``/v1/chat/completions`` renders it
  (:func:`cwtrain.local.engine.chat.render_chat`), so ``tokens`` are the prompt ids a chat
  generation with the same messages uses (NeMo Gym's token-id mode relies on this).

``token_strs`` (with ``return_token_strs``) are vocabulary entries. There is no context check.
:func:`detokenize` takes ``{"model"?, "tokens": [int]}`` and answers ``{"prompt": text}``,
special tokens included (a tokenizer's default decode). Errors are :class:`CompletionError`.
"""

from __future__ import annotations

from typing import Any

from cwtrain.local.engine.chat import render_chat
from cwtrain.local.engine.completions import CompletionError, check_model
from cwtrain.local.engine.model import TinyLM

__all__ = ["detokenize", "tokenize"]


def tokenize(body: Any, lm: TinyLM, *, model: str) -> dict[str, Any]:
    """Answer one ``/tokenize`` request.

    Raises:
        CompletionError: Neither ``prompt`` (a string) nor ``messages`` is given, the chat
            fails to render (400), or another model is named (404).
    """
    body = check_model(body, model)
    if "messages" in body:
        ids = render_chat(body, lm).ids
    elif isinstance(body.get("prompt"), str):
        ids = lm.tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True) is not False)
    else:
        raise CompletionError("the body needs `prompt` (a string) or `messages` (a list)", param="prompt")
    strs = lm.tokenizer.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": lm.config.max_position_embeddings, "tokens": ids, "token_strs": strs}


def detokenize(body: Any, lm: TinyLM, *, model: str) -> dict[str, Any]:
    """Answer one ``/detokenize`` request.

    Raises:
        CompletionError: ``tokens`` is not a list of ids in the vocabulary (400), or another
            model is named (404).
    """
    body = check_model(body, model)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise CompletionError("tokens must be a list of token ids", param="tokens")
    try:
        return {"prompt": lm.tokenizer.decode(tokens, skip_special_tokens=False)}
    except ValueError as exc:
        raise CompletionError(str(exc), param="tokens") from exc

"""Prompt log-probs on ``/v1/completions``, as vLLM 0.31 answers ``echo`` and ``prompt_logprobs``.

A completions request asks how the served model scores its prompt in two ways, both vLLM's:

- ``echo: true`` with ``logprobs: k``: the choice's ``text`` starts with the prompt (its text,
  or ``""`` with ``return_token_ids``), and ``logprobs`` covers the prompt's tokens first, then
  the generated ones. The first prompt token has no log-prob: its ``token_logprobs`` and
  ``top_logprobs`` entries are ``null`` (its ``tokens`` entry is its text). Every other prompt
  token's ``top_logprobs`` holds the token itself and the k most likely tokens at its
  position. With ``max_tokens: 0`` only the prompt is returned; the engine still samples one
  token, so ``finish_reason``, ``stop_reason``, ``token_ids`` and ``usage.completion_tokens``
  are that token's, as in vLLM.
- ``prompt_logprobs: k`` (vLLM's extension; k >= 0, or -1 for the whole vocabulary): every
  choice carries ``prompt_logprobs``, ``null`` for the first prompt token, then per token an
  object keyed by token id (a string in JSON): ``{"logprob", "rank", "decoded_token"}``, the
  prompt token first with its rank, then the k most likely tokens with ranks 1..k (the
  prompt token once when it is among them). ``echo`` with ``logprobs`` and without
  ``prompt_logprobs`` asks for them too, with k = ``logprobs``.

:func:`cwtrain.local.engine.completions.parse_echo` reads the two fields and refuses what vLLM
refuses (400): a ``prompt_logprobs`` that is not an integer, below -1, or above 0 (or -1) with
``stream: true``. ``-inf`` log-probs are sent as ``-9999.0``. A stream
with ``echo`` sends the prompt (text and log-probs) on each choice's first chunk; a stream
never carries ``prompt_logprobs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cwtrain.local.engine.model import PromptTokenScore, TinyLM

__all__ = ["Echo", "echo_logprobs", "prompt_logprobs_body", "prompt_text"]

_LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class Echo:
    """What a completions request asks of its prompt.

    Attributes:
        echo: Return the prompt in front of the completion (``echo``).
        prompt_logprobs: Alternatives per prompt token to score (``None``: the prompt is not scored).
        only_prompt: ``echo`` with ``max_tokens: 0``: return the prompt and nothing generated.
    """

    echo: bool = False
    prompt_logprobs: int | None = None
    only_prompt: bool = False


def _floor(logprob: float) -> float:
    return max(logprob, _LOGPROB_FLOOR)


def prompt_text(lm: TinyLM, ids: Sequence[int], text: str | None, return_token_ids: bool) -> str:
    """The echoed prompt: its text as sent, or its ids decoded (``""`` with ``return_token_ids``)."""
    if return_token_ids:
        return ""
    return text if text is not None else lm.tokenizer.decode(list(ids), skip_special_tokens=False)


def _position(score: PromptTokenScore, count: int) -> list[tuple[int, float, int]]:
    """``(token id, log-prob, rank)``: the prompt token first, then the ``count`` most likely, each once."""
    entries: dict[int, tuple[float, int]] = {score.token_id: (score.logprob, score.rank)}
    for rank, (alternative, logprob) in enumerate(score.top[:count], start=1):
        entries[alternative] = (logprob, rank)
    return [(token, logprob, rank) for token, (logprob, rank) in entries.items()]


def prompt_logprobs_body(lm: TinyLM, scores: Sequence[PromptTokenScore | None], count: int) -> list[Any]:
    """A choice's ``prompt_logprobs``: ``null`` for the first token, then ``{"<id>": {...}}`` per token."""
    out: list[Any] = []
    for score in scores:
        if score is None:
            out.append(None)
            continue
        out.append(
            {
                str(token): {
                    "logprob": _floor(logprob),
                    "rank": rank,
                    "decoded_token": lm.tokenizer.token_text(token),
                }
                for token, logprob, rank in _position(score, count)
            }
        )
    return out


def echo_logprobs(
    lm: TinyLM,
    prompt: Sequence[int],
    scores: Sequence[PromptTokenScore | None],
    count: int,
    as_ids: bool,
    generated: Mapping[str, list[Any]] | None,
) -> dict[str, Any]:
    """The ``logprobs`` block of an echoed choice: the prompt's tokens, then ``generated``'s.

    Args:
        lm: The served model (token names).
        prompt: The prompt ids.
        scores: :meth:`TinyLM.score_prompt` of ``prompt``.
        count: Alternatives per token (the request's ``logprobs``).
        as_ids: Name tokens ``token_id:<N>``.
        generated: The generated tokens' block (its ``text_offset`` starting at 0), or ``None``.
    """

    def token_name(token: int) -> str:
        return f"token_id:{token}" if as_ids else lm.tokenizer.token_text(token)

    offsets: list[int] = []
    names: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    for token, score in zip(prompt, scores, strict=True):
        offsets.append(offsets[-1] + len(names[-1]) if offsets else 0)
        names.append(token_name(token))
        if score is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_floor(score.logprob))
        top_logprobs.append({token_name(alt): _floor(logprob) for alt, logprob, _ in _position(score, count)})
    start = offsets[-1] + len(names[-1]) if offsets else 0
    if generated is not None:
        offsets += [start + offset for offset in generated["text_offset"]]
        names += generated["tokens"]
        token_logprobs += generated["token_logprobs"]
        top_logprobs += generated["top_logprobs"]
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": names, "top_logprobs": top_logprobs}

"""What one group asks for: ``SamplingParams`` and ``Prompt`` (interface.md §4.1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cwtrain.errors import RolloutError

__all__ = ["Prompt", "PromptLike", "SamplingParams", "as_prompt"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by the groups of a batch.

    Attributes:
        max_tokens: completion tokens per sequence, >= 1.
        temperature: sampling temperature, >= 0.
        top_p: nucleus mass in (0, 1]; keep 1.0 when the trainer uses rollout log-probs.
        top_k: sent only when > 0.
        stop: up to 4 stop strings.
        stop_token_ids: up to 4 stop token ids.
        include_stop_str_in_output: keep a matched stop string in ``text``.

    Raises:
        RolloutError: more than 4 stops of either kind, or values out of range (before anything is sent).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if len(self.stop) > 4:
            raise RolloutError(f"{len(self.stop)} stop strings given; the endpoint takes at most 4")
        if len(self.stop_token_ids) > 4:
            raise RolloutError(f"{len(self.stop_token_ids)} stop token ids given; the endpoint takes at most 4")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RolloutError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise RolloutError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if not (0 < self.top_p <= 1):
            raise RolloutError(f"top_p={self.top_p!r} must be in (0, 1]")


@dataclass(frozen=True)
class Prompt:
    """One prompt: the trainer's token ids (without added special tokens) and/or its text.

    The ids are sent when the endpoint takes token-id prompts; the text (else the
    tokenizer's decoding of the ids) is the fallback when it refuses them.
    """

    ids: tuple[int, ...] | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if self.ids is None and self.text is None:
            raise RolloutError("a prompt needs token ids or text")
        if self.ids is not None:
            object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))


PromptLike = Prompt | str | Sequence[int]


def as_prompt(value: Any) -> Prompt:
    """Accept a :class:`Prompt`, a string (text) or a sequence of token ids."""
    if isinstance(value, Prompt):
        return value
    if isinstance(value, str):
        return Prompt(text=value)
    try:
        return Prompt(ids=tuple(value))
    except (TypeError, ValueError):
        raise RolloutError(f"a prompt must be token ids, text or a Prompt, not {type(value).__name__}") from None

"""The tiny model's tokenizer and its chat template, as a HuggingFace tokenizer carries them.

Usage::

    from cwtrain.local.engine.tokenizer import Tokenizer

    tok = Tokenizer()
    ids = tok.encode("hello", add_special_tokens=True)          # [1, ...]: <bos> first
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    # '<bos><user>hi\\n<assistant>'
    tok.encode(text)                                             # the chat prompt's ids (<bos> is id 1)

- 64 tokens: ``<eos>`` (0), ``<bos>`` (1), then one token per character (space, newline,
  digits, lowercase letters, punctuation). Characters outside the alphabet encode as ``?``.
  As a HuggingFace tokenizer does, :meth:`Tokenizer.encode` turns the text of a special token
  (``<bos>``, ``<eos>``) into that token; :meth:`Tokenizer.decode` skips special tokens unless
  asked otherwise.
- :data:`CHAT_TEMPLATE` is the Jinja chat template; ``tokenizer_config.json`` (written beside
  every base checkpoint by :func:`cwtrain.local.engine.model.write_base_checkpoint`) carries it under
  ``chat_template``, as HuggingFace checkpoints do. :meth:`Tokenizer.apply_chat_template`
  renders it the way ``transformers`` does: a sandboxed Jinja environment with ``trim_blocks``
  and ``lstrip_blocks``, the variables ``messages``, ``tools``, ``documents``,
  ``add_generation_prompt``, ``bos_token``, ``eos_token`` and any extra keyword, and
  ``continue_final_message`` cutting the text right after the final message's content.

The template writes each message as ``<role>content`` and a newline, closes assistant turns
with ``<eos>``, starts with ``<bos>`` and, with ``add_generation_prompt``, ends with
``<assistant>``; every character it adds is in the tiny alphabet, so a rendered conversation
encodes without loss.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CHAT_TEMPLATE", "TOKENIZER_CONFIG_FILE", "ChatTemplateError", "Tokenizer"]

#: The file HuggingFace tokenizers keep their settings (and chat template) in.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

_SPECIALS = ("<eos>", "<bos>")
_CHARS = " \n" + string.digits + string.ascii_lowercase + ".,:;!?'\"-+=*/()[]<>_#@%&"
_UNKNOWN = "?"

#: The tiny model's chat template (Jinja, as in ``tokenizer_config.json``).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<' + message['role'] + '>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """A chat template that does not render (bad syntax, ``raise_exception``, wrong input)."""


class Tokenizer:
    """Character tokenizer of the tiny model: 2 special tokens, then one id per character."""

    def __init__(self) -> None:
        self.tokens: tuple[str, ...] = _SPECIALS + tuple(_CHARS)
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}

    @property
    def vocab_size(self) -> int:
        """Number of token ids (64)."""
        return len(self.tokens)

    @property
    def eos_token_id(self) -> int:
        """Id of ``<eos>``: generation ends when it is sampled."""
        return 0

    @property
    def pad_token_id(self) -> int | None:
        """No padding token (``None``, as a HuggingFace tokenizer without one): pad with ``<eos>``."""
        return None

    @property
    def bos_token_id(self) -> int:
        """Id of ``<bos>``, prepended by ``encode(..., add_special_tokens=True)``."""
        return 1

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special tokens (not shown by :meth:`decode`)."""
        return frozenset(range(len(_SPECIALS)))

    @property
    def chat_template(self) -> str:
        """The Jinja chat template (:data:`CHAT_TEMPLATE`)."""
        return CHAT_TEMPLATE

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (unknown characters become ``?``; ``<bos>`` first if asked).

        The text of a special token (``<bos>``, ``<eos>``) becomes that token, as HuggingFace
        tokenizers parse special tokens in their input.
        """
        unknown = self._ids[_UNKNOWN]
        ids: list[int] = [self.bos_token_id] if add_special_tokens else []
        i = 0
        while i < len(text):
            for special_id, special in enumerate(_SPECIALS):
                if text.startswith(special, i):
                    ids.append(special_id)
                    i += len(special)
                    break
            else:
                ids.append(self._ids.get(text[i], unknown))
                i += 1
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens are dropped unless ``skip_special_tokens`` is false."""
        parts = []
        for i in ids:
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.tokens)})")
            if skip_special_tokens and i < len(_SPECIALS):
                continue
            parts.append(self.tokens[i])
        return "".join(parts)

    def token_text(self, token_id: int) -> str:
        """The text of one token (special tokens by name, e.g. ``<eos>``)."""
        return self.tokens[token_id]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id (HuggingFace's name for it)."""
        return [self.token_text(i) for i in ids]

    def tokenizer_config(self) -> dict[str, Any]:
        """The ``tokenizer_config.json`` object: special tokens and the chat template."""
        return {
            "tokenizer_class": "CwtrainCharTokenizer",
            "bos_token": _SPECIALS[1],
            "eos_token": _SPECIALS[0],
            "pad_token": None,
            "unk_token": _UNKNOWN,
            "add_bos_token": True,
            "chat_template": CHAT_TEMPLATE,
        }

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tools: Sequence[Any] | None = None,
        documents: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render ``conversation`` with the chat template (the text; :meth:`encode` gives its ids).

        Args:
            conversation: Messages (``role``, ``content`` and any other keys).
            chat_template: Another Jinja template (default :data:`CHAT_TEMPLATE`).
            add_generation_prompt: End with the start of an assistant turn.
            continue_final_message: End right after the final message's content, so the model
                continues it (not together with ``add_generation_prompt``).
            tools: Passed to the template as ``tools``.
            documents: Passed to the template as ``documents``.
            **kwargs: More template variables.

        Raises:
            ChatTemplateError: The template does not render, or the final message cannot be
                continued.
        """
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError("continue_final_message and add_generation_prompt are not compatible")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        variables = {
            "bos_token": _SPECIALS[1],
            "eos_token": _SPECIALS[0],
            "unk_token": _UNKNOWN,
            **kwargs,
            "messages": [dict(m) for m in conversation],
            "tools": list(tools) if tools is not None else None,
            "documents": list(documents) if documents is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            text = env.from_string(chat_template or CHAT_TEMPLATE).render(**variables)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ChatTemplateError(f"{type(exc).__name__}: {exc}") from exc
        if continue_final_message:
            text = _cut_after_final_message(text, conversation)
        return text


def _cut_after_final_message(text: str, conversation: Sequence[Mapping[str, Any]]) -> str:
    """``text`` up to the end of the final message's content (its last occurrence)."""
    if not conversation:
        raise ChatTemplateError("continue_final_message needs at least one message")
    final = conversation[-1].get("content")
    if isinstance(final, list) and final and isinstance(final[-1], Mapping):
        final = final[-1].get("text")
    if not isinstance(final, str):
        raise ChatTemplateError("continue_final_message needs a final message with text content")
    for needle in (final, final.strip()):
        at = text.rfind(needle)
        if at >= 0:
            return text[: at + len(needle)]
    raise ChatTemplateError(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template"
    )

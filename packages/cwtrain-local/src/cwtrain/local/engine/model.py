"""The tiny causal language model that local replicas serve and ``cwtrain demo`` trains.

A character-level GPT small enough to generate a GRPO group on one CPU core in a few
milliseconds, yet shaped like a real checkpoint: HuggingFace-style tensor names, BF16
weights in ``model.safetensors`` beside a ``config.json``, so every snapshot path (FULL
checkpoints, XOR+zstd deltas, chain replay) runs on realistic bytes.

Pieces:

- :class:`Tokenizer` (:mod:`cwtrain.local.engine.tokenizer`) — 64 tokens: ``<eos>`` (0), ``<bos>``
  (1), then one token per character; its chat template goes to ``tokenizer_config.json``.
- :class:`ModelConfig` — sizes (``config.json`` uses HuggingFace key names).
- :func:`init_weights` / :func:`write_base_checkpoint` — deterministic weights from a seed.
- :func:`forward` — logits from any dict of named tensors (BF16 served weights or the
  trainer's float32 parameters, differentiable).
- :class:`TinyLM` — a loaded model that samples: :meth:`TinyLM.generate` returns, per
  sequence, the token ids, the log-prob of each sampled token and a finish reason. Same
  weights and same ``seed`` give the same tokens. ``on_token`` sees every token as it is
  sampled (:class:`TokenEvent`), which is how replicas stream.
- :func:`token_logprobs` — the log-probs the model assigns to given completion tokens,
  computed exactly as :meth:`TinyLM.generate` reports them.
- :meth:`TinyLM.score_prompt` — each prompt token's log-prob, rank and the most likely
  alternatives at its position (what vLLM's ``prompt_logprobs`` and ``echo`` report).

Log-probs are those of the model's own distribution (``log_softmax`` of the raw logits),
before temperature, top-k and top-p, as vLLM reports them by default.

Example::

    from cwtrain.local.engine.model import TinyLM, Tokenizer, init_weights

    tok = Tokenizer()
    lm = TinyLM(init_weights(seed=0))
    out = lm.generate(tok.encode("hello"), n=2, max_tokens=8, seed=1)
    print([tok.decode(seq.token_ids) for seq in out])
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from cwtrain.hotload import SINGLE_FILE_NAME, TORCH_DTYPES, TensorData
from cwtrain.local.engine.tokenizer import TOKENIZER_CONFIG_FILE, Tokenizer

__all__ = [
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "GeneratedSequence",
    "OnToken",
    "ModelConfig",
    "PromptTokenScore",
    "TinyLM",
    "TokenEvent",
    "Tokenizer",
    "forward",
    "from_tensor_data",
    "init_weights",
    "load_checkpoint",
    "to_tensor_data",
    "token_logprobs",
    "weights_from_safetensors",
    "weights_to_safetensors",
    "write_base_checkpoint",
]

CONFIG_FILE = "config.json"
#: The checkpoint's one weights file (:data:`cwtrain.hotload.SINGLE_FILE_NAME`).
CHECKPOINT_FILE = SINGLE_FILE_NAME


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the tiny model; ``config.json`` stores them under HuggingFace key names."""

    vocab_size: int = 64
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    eos_token_id: int = 0
    bos_token_id: int = 1
    rms_norm_eps: float = 1e-5
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The ``config.json`` object."""
        data = {k: v for k, v in asdict(self).items() if k != "extra"}
        return (
            {"architectures": ["CwtrainTinyLM"], "model_type": "cwtrain-tiny", "torch_dtype": "bfloat16"}
            | data
            | self.extra
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Read a ``config.json`` object (unknown keys are kept in ``extra``)."""
        names = {f for f in cls.__dataclass_fields__ if f != "extra"}
        known = {k: data[k] for k in names if k in data}
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's name and shape, in checkpoint order."""
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (v, d),
            "model.embed_positions.weight": (self.max_position_embeddings, d),
        }
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (d,)
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                shapes[p + f"self_attn.{proj}.weight"] = (d, d)
            shapes[p + "post_attention_layernorm.weight"] = (d,)
            shapes[p + "mlp.gate_proj.weight"] = (f, d)
            shapes[p + "mlp.up_proj.weight"] = (f, d)
            shapes[p + "mlp.down_proj.weight"] = (d, f)
        shapes["model.norm.weight"] = (d,)
        shapes["lm_head.weight"] = (v, d)
        return shapes


def init_weights(config: ModelConfig | None = None, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic BF16 weights: normal(0, 0.02) matrices, unit norms, the same for one seed."""
    config = config or ModelConfig()
    gen = torch.Generator().manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in config.tensor_shapes().items():
        if name.endswith("norm.weight"):
            value = torch.ones(shape)
        else:
            std = (
                0.02 / math.sqrt(2 * config.num_hidden_layers)
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else 0.02
            )
            value = torch.randn(shape, generator=gen) * std
        weights[name] = value.to(torch.bfloat16)
    return weights


def weights_to_safetensors(weights: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """One safetensors file (bytes) holding ``weights``; ``metadata`` goes to ``__metadata__``."""
    tensors = {name: t.detach().contiguous().cpu() for name, t in weights.items()}
    return bytes(st_save(tensors, metadata=dict(metadata) if metadata else None))


def weights_from_safetensors(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Weights and ``__metadata__`` of one safetensors file given as bytes."""
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than its 8-byte header length")
    (header_len,) = np.frombuffer(data[:8], dtype="<u8")
    header = json.loads(bytes(data[8 : 8 + int(header_len)]))
    metadata = header.get("__metadata__") or {}
    return dict(st_load(bytes(data))), dict(metadata)


def write_base_checkpoint(
    directory: str | os.PathLike[str], *, seed: int = 0, config: ModelConfig | None = None
) -> None:
    """Write the tiny model's base checkpoint: ``config.json``, ``tokenizer_config.json``, ``model.safetensors``.

    ``tokenizer_config.json`` holds the tokenizer's special tokens and chat template, as a
    HuggingFace checkpoint does.

    Args:
        directory: Target directory (created if missing).
        seed: Initialisation seed; the same seed always gives the same bytes.
        config: Model sizes (default :class:`ModelConfig`).
    """
    config = config or ModelConfig()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(config.to_json() | {"seed": seed}, indent=2, sort_keys=True) + "\n")
    tokenizer_config = Tokenizer().tokenizer_config() | {"model_max_length": config.max_position_embeddings}
    (path / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (path / CHECKPOINT_FILE).write_bytes(weights_to_safetensors(init_weights(config, seed=seed), {"format": "pt"}))


def load_checkpoint(directory: str | os.PathLike[str]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a checkpoint written by :func:`write_base_checkpoint`."""
    path = Path(directory)
    config = ModelConfig.from_json(json.loads((path / CONFIG_FILE).read_text()))
    weights, _ = weights_from_safetensors((path / CHECKPOINT_FILE).read_bytes())
    return config, weights


_TORCH_TO_ST = {dtype: TORCH_DTYPES[dtype] for dtype in (torch.bfloat16, torch.float16, torch.float32)}
_ST_TO_TORCH = {v: k for k, v in _TORCH_TO_ST.items()}


def to_tensor_data(weights: Mapping[str, torch.Tensor]) -> dict[str, TensorData]:
    """Weights as the codec's :class:`~cwtrain.hotload.TensorData` (dtype, shape, uint8 bytes)."""
    out: dict[str, TensorData] = {}
    for name, t in weights.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _TORCH_TO_ST:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}; the tiny model stores BF16, F16 or F32")
        raw = t.reshape(-1).view(torch.uint8).numpy()
        out[name] = TensorData(_TORCH_TO_ST[t.dtype], tuple(t.shape), raw)
    return out


def from_tensor_data(tensors: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Torch tensors from the codec's ``TensorData`` tuples (the bytes are copied)."""
    out: dict[str, torch.Tensor] = {}
    for name, item in tensors.items():
        dtype, shape, data = item[0], item[1], item[2]
        if dtype not in _ST_TO_TORCH:
            raise ValueError(f"tensor {name!r} has dtype {dtype}; the tiny model reads BF16, F16 or F32")
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8).copy()
        out[name] = torch.from_numpy(raw).view(_ST_TO_TORCH[dtype]).reshape(tuple(shape))
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def forward(params: Mapping[str, torch.Tensor], ids: torch.Tensor, config: ModelConfig | None = None) -> torch.Tensor:
    """Logits ``[batch, time, vocab]`` for token ids ``[batch, time]`` (float32 compute).

    ``params`` may be the BF16 served weights or float32 trainer parameters; gradients flow
    through float32 parameters.
    """
    config = config or ModelConfig()
    p = {k: (v if v.dtype == torch.float32 else v.float()) for k, v in params.items()}
    batch, time = ids.shape
    if time > config.max_position_embeddings:
        raise ValueError(f"sequence of {time} tokens exceeds the model's {config.max_position_embeddings} positions")
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    x = p["model.embed_tokens.weight"][ids] + p["model.embed_positions.weight"][:time]
    for i in range(config.num_hidden_layers):
        pre = f"model.layers.{i}."
        h = _rms_norm(x, p[pre + "input_layernorm.weight"], config.rms_norm_eps)
        q, k, v = (
            (h @ p[pre + f"self_attn.{n}_proj.weight"].T).view(batch, time, heads, head_dim).transpose(1, 2)
            for n in ("q", "k", "v")
        )
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + att.transpose(1, 2).reshape(batch, time, -1) @ p[pre + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, p[pre + "post_attention_layernorm.weight"], config.rms_norm_eps)
        gated = F.silu(h @ p[pre + "mlp.gate_proj.weight"].T) * (h @ p[pre + "mlp.up_proj.weight"].T)
        x = x + gated @ p[pre + "mlp.down_proj.weight"].T
    x = _rms_norm(x, p["model.norm.weight"], config.rms_norm_eps)
    return x @ p["lm_head.weight"].T


@dataclass(frozen=True)
class GeneratedSequence:
    """One sampled sequence.

    Attributes:
        token_ids: Completion token ids, the final EOS or stop token included.
        logprobs: Log-prob of each token in ``token_ids`` under the model (raw logits).
        finish_reason: ``"stop"`` (EOS, stop token or stop string) or ``"length"``.
        stop_reason: The stop token id or stop string that ended it (``None`` for EOS or length).
        text: Completion text (special tokens skipped; stop string removed unless kept).
        top_logprobs: Per token, the ``top_logprobs`` most likely ``(token id, log-prob)`` pairs
            (empty lists unless asked).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | str | None
    text: str
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of one sequence, as generation produces it (what a stream sends).

    Attributes:
        token_id: The token.
        logprob: Its log-prob under the model (raw logits).
        top: The ``top_logprobs`` most likely ``(token id, log-prob)`` pairs at this step.
        text: The sequence's whole completion text after this token, as
            :attr:`GeneratedSequence.text` would be if it ended here.
        finish_reason: ``"stop"`` or ``"length"`` on the sequence's last token, else ``None``.
        stop_reason: As :attr:`GeneratedSequence.stop_reason`, on the last token.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    text: str
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class PromptTokenScore:
    """How the model scores one prompt token given the tokens before it.

    Attributes:
        token_id: The prompt token.
        logprob: Its log-prob under the model (raw logits).
        rank: 1 + how many other tokens are at least as likely (1 = the most likely), as
            vLLM counts a prompt token's rank.
        top: The ``top_logprobs`` most likely ``(token id, log-prob)`` pairs at its position.
    """

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


#: ``on_token(request index, sequence index within the request, event)``.
OnToken = Callable[[int, int, TokenEvent], None]


class TinyLM:
    """A loaded tiny model that samples completions (weights are never changed in place)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], config: ModelConfig | None = None) -> None:
        self.config = config or ModelConfig()
        expected = self.config.tensor_shapes()
        if set(weights) != set(expected):
            missing = sorted(set(expected) - set(weights))[:3]
            extra = sorted(set(weights) - set(expected))[:3]
            raise ValueError(f"weights do not match the tiny model: missing {missing}, unexpected {extra}")
        for name, shape in expected.items():
            if tuple(weights[name].shape) != shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")
        self.weights = dict(weights)
        self._params = {k: v.detach().float() for k, v in weights.items()}
        self.tokenizer = Tokenizer()

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        n: int = 1,
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        ignore_eos: bool = False,
        top_logprobs: int = 0,
        on_token: Callable[[int, TokenEvent], None] | None = None,
    ) -> list[GeneratedSequence]:
        """Sample ``n`` completions of one prompt.

        Args:
            prompt_ids: Prompt token ids (at least one).
            n: Number of sequences.
            max_tokens: Tokens at most per sequence.
            temperature: 0 = greedy; otherwise logits are divided by it before sampling.
            top_p: Nucleus sampling mass (1.0 = off).
            top_k: Keep only the k most likely tokens (0 = off).
            seed: Sampling seed; the same seed and weights give the same tokens. ``None`` = random.
            stop_token_ids: Tokens that end a sequence (kept in ``token_ids``).
            stop: Strings that end a sequence once the completion text ends with one.
            include_stop_str_in_output: Keep the stop string in ``text``, and the text of a stop
                token (special tokens have none), as vLLM does.
            ignore_eos: Do not stop at EOS.
            top_logprobs: Also report the k most likely tokens at each step (0 = none).
            on_token: Called with ``(sequence index, event)`` for every token as it is sampled.

        Returns:
            One :class:`GeneratedSequence` per sequence, in order.
        """
        return self.generate_many(
            prompt_ids,
            [(n, seed)],
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_token_ids=stop_token_ids,
            stop=stop,
            include_stop_str_in_output=include_stop_str_in_output,
            ignore_eos=ignore_eos,
            top_logprobs=top_logprobs,
            on_token=None if on_token is None else (lambda _request, index, event: on_token(index, event)),
        )[0]

    @torch.inference_mode()
    def score_prompt(self, prompt_ids: Sequence[int], *, top_logprobs: int = 0) -> list[PromptTokenScore | None]:
        """Each prompt token's log-prob given the tokens before it (``None`` for the first, which has none).

        Computed with the same forward pass and the same raw ``log_softmax`` as :meth:`generate`.

        Args:
            prompt_ids: Prompt token ids (at least one).
            top_logprobs: Also report the k most likely tokens at each position (0 = none).
        """
        cfg = self.config
        if not prompt_ids:
            raise ValueError("the prompt is empty; send at least one token")
        if any(not 0 <= t < cfg.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must lie in [0, {cfg.vocab_size})")
        if len(prompt_ids) < 2:
            return [None]
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        logp = torch.log_softmax(forward(self._params, ids[:, :-1], cfg)[0], dim=-1)
        target = ids[0, 1:]
        chosen = logp.gather(1, target[:, None])[:, 0]
        ranks = (logp >= chosen[:, None]).sum(dim=-1)
        k = min(max(top_logprobs, 0), cfg.vocab_size)
        top = torch.topk(logp, k, dim=-1) if k else None
        scores: list[PromptTokenScore | None] = [None]
        for i in range(len(prompt_ids) - 1):
            alternatives = [(int(a), float(v)) for a, v in zip(top.indices[i], top.values[i])] if top else []
            scores.append(PromptTokenScore(int(target[i]), float(chosen[i]), int(ranks[i]), alternatives))
        return scores

    @torch.inference_mode()
    def generate_many(
        self,
        prompt_ids: Sequence[int],
        requests: Sequence[tuple[int, int | None]],
        *,
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        ignore_eos: bool = False,
        top_logprobs: int = 0,
        on_token: OnToken | None = None,
    ) -> list[list[GeneratedSequence]]:
        """Several requests for one prompt and the same settings, run as one batch.

        Each request ``(n, seed)`` samples its own rows with its own generator, so its
        tokens are the same as from :meth:`generate` alone (batching changes nothing but
        the speed). ``on_token`` gets ``(request index, sequence index, event)`` for every
        token as it is sampled. Other arguments as in :meth:`generate`.
        """
        cfg = self.config
        if not prompt_ids:
            raise ValueError("the prompt is empty; send at least one token")
        if any(not 0 <= t < cfg.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must lie in [0, {cfg.vocab_size})")
        if not requests or any(n < 1 for n, _ in requests) or max_tokens < 0:
            raise ValueError("n must be >= 1 and max_tokens >= 0")
        if len(prompt_ids) + max_tokens > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"context of {cfg.max_position_embeddings} tokens"
            )
        slices: list[tuple[slice, torch.Generator]] = []
        owners: list[tuple[int, int]] = []  # per row: (request index, sequence index)
        start = 0
        for r, (n, seed) in enumerate(requests):
            seed = seed if seed is not None else int.from_bytes(os.urandom(7), "little")
            slices.append((slice(start, start + n), torch.Generator().manual_seed(seed)))
            owners.extend((r, j) for j in range(n))
            start += n
        rows = start
        ids = torch.tensor([list(prompt_ids)] * rows, dtype=torch.long)
        out_ids: list[list[int]] = [[] for _ in range(rows)]
        out_lp: list[list[float]] = [[] for _ in range(rows)]
        out_top: list[list[list[tuple[int, float]]]] = [[] for _ in range(rows)]
        k_top = min(max(top_logprobs, 0), cfg.vocab_size)
        texts = [""] * rows
        finish: list[tuple[str, int | str | None] | None] = [None] * rows
        stop_set = set(stop_token_ids)
        specials = self.tokenizer.special_ids
        for _ in range(max_tokens):
            if all(f is not None for f in finish):
                break
            logits = forward(self._params, ids, cfg)[:, -1, :]
            logp = torch.log_softmax(logits, dim=-1)
            nxt = torch.cat([_sample(logits[part], temperature, top_p, top_k, gen) for part, gen in slices])
            chosen = logp.gather(1, nxt[:, None])[:, 0]
            top = torch.topk(logp, k_top, dim=-1) if k_top else None
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            for j in range(rows):
                if finish[j] is not None:
                    continue
                tok = int(nxt[j])
                out_ids[j].append(tok)
                out_lp[j].append(float(chosen[j]))
                step_top = [(int(i), float(v)) for i, v in zip(top.indices[j], top.values[j])] if top else []
                if top is not None:
                    out_top[j].append(step_top)
                # vLLM: EOS or a stop token ends the sequence; its text is kept only with
                # include_stop_str_in_output (special tokens have none); stop strings are then
                # looked for in the text, so a stop string can still end it.
                if tok == cfg.eos_token_id and not ignore_eos:
                    finish[j] = ("stop", None)
                elif tok in stop_set:
                    finish[j] = ("stop", tok)
                if (finish[j] is None or include_stop_str_in_output) and tok not in specials:
                    texts[j] += self.tokenizer.token_text(tok)
                    for s in stop:
                        if s and texts[j].endswith(s):
                            if not include_stop_str_in_output:
                                texts[j] = texts[j][: -len(s)]
                            finish[j] = ("stop", s)
                            break
                if finish[j] is None and len(out_ids[j]) == max_tokens:
                    finish[j] = ("length", None)
                if on_token is not None:
                    reason, why = finish[j] or (None, None)
                    on_token(*owners[j], TokenEvent(tok, out_lp[j][-1], step_top, texts[j], reason, why))
        results = []
        for j in range(rows):
            reason, stop_reason = finish[j] or ("length", None)
            results.append(GeneratedSequence(out_ids[j], out_lp[j], reason, stop_reason, texts[j], out_top[j]))
        return [results[part] for part, _ in slices]


def _sample(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


def token_logprobs(
    weights: Mapping[str, torch.Tensor],
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    config: ModelConfig | None = None,
) -> list[float]:
    """Log-prob the model gives each completion token after the prompt (as ``generate`` reports)."""
    if not completion_ids:
        return []
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long)
    with torch.inference_mode():
        logp = torch.log_softmax(forward(weights, ids[:, :-1], config), dim=-1)[0]
    start = len(prompt_ids) - 1
    target = ids[0, len(prompt_ids) :]
    picked = logp[start:].gather(1, target[:, None])[:, 0]
    return [float(x) for x in picked]

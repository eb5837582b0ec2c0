"""The learning half of ``cwtrain demo``: a toy task and a GRPO trainer for the tiny model.

No network here: the demo feeds it rollouts sampled from the deployment and publishes what
it returns. The same pieces run offline in tests.

**Task** (:class:`ParityTask`): each prompt is ``"even: "`` or ``"odd: "``; the reward of a
completion is the fraction of its ``max_tokens`` slots filled with a digit of the asked
parity (``0 2 4 6 8`` or ``1 3 5 7 9``), so it lies in [0, 1]. A fresh model emits about
one such digit in thirteen tokens (reward ≈ 0.07); it has to read the prompt to do well.

**Trainer** (:class:`GRPOTrainer`): float32 master weights initialised exactly like the base
checkpoint (so the first BF16 copy equals what replicas serve), Adam, and the GRPO
objective: per group, advantages ``(r − mean) / (std + ε)``; loss ``−Σ A·log π(token)``
over every completion token (final EOS included) divided by ``groups × group size ×
max_tokens``. One gradient step per batch of rollouts, so the policy is on-policy and no
ratio clipping is needed. :meth:`GRPOTrainer.served_weights` is the BF16 copy to publish.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cwtrain.local.engine.model import ModelConfig, Tokenizer, forward, init_weights

__all__ = ["GRPOTrainer", "ParityTask", "StepStats"]


class ParityTask:
    """Prompts ``"even: "`` / ``"odd: "``; reward = fraction of slots holding a digit of that parity."""

    KINDS = ("even", "odd")

    def __init__(self, tokenizer: Tokenizer, max_tokens: int, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._rng = random.Random(seed)
        self._wanted = {
            "even": frozenset(tokenizer.encode("02468")),
            "odd": frozenset(tokenizer.encode("13579")),
        }

    def prompts(self, count: int) -> list[tuple[str, list[int]]]:
        """``count`` prompts as ``(kind, token ids)``, drawn from the task's seeded generator."""
        kinds = [self._rng.choice(self.KINDS) for _ in range(count)]
        return [(kind, self.tokenizer.encode(f"{kind}: ")) for kind in kinds]

    def reward(self, kind: str, completion_ids: Sequence[int]) -> float:
        """Fraction of the ``max_tokens`` slots holding a wanted digit, in [0, 1]."""
        wanted = self._wanted[kind]
        return sum(1 for t in completion_ids[: self.max_tokens] if t in wanted) / self.max_tokens


@dataclass(frozen=True)
class StepStats:
    """What one policy update did.

    Attributes:
        mean_reward: mean reward of the batch.
        loss: the GRPO loss value.
        logprob_gap: mean |rollout log-prob − trainer log-prob| over tokens (BF16 serving vs
            float32 training; ``nan`` when the rollouts carried no log-probs).
        tokens: completion tokens trained on.
    """

    mean_reward: float
    loss: float
    logprob_gap: float
    tokens: int


class GRPOTrainer:
    """GRPO on the tiny model with float32 master weights and Adam."""

    def __init__(self, *, seed: int = 0, lr: float = 3e-3, config: ModelConfig | None = None) -> None:
        self.config = config or ModelConfig()
        self.params = {k: v.float().requires_grad_() for k, v in init_weights(self.config, seed=seed).items()}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr)

    def served_weights(self) -> dict[str, torch.Tensor]:
        """The BF16 weights to publish (what replicas will serve)."""
        return {k: v.detach().to(torch.bfloat16) for k, v in self.params.items()}

    def step(
        self,
        groups: Sequence[Sequence[tuple[Sequence[int], Sequence[int], float, Sequence[float] | None]]],
        max_tokens: int,
    ) -> StepStats:
        """One policy-gradient update from groups of ``(prompt ids, completion ids, reward, rollout log-probs)``."""
        total_seqs = sum(len(g) for g in groups)
        if total_seqs == 0:
            raise ValueError("no rollouts to train on")
        scale = 1.0 / (total_seqs * max_tokens)
        loss = torch.zeros(())
        gaps: list[float] = []
        rewards: list[float] = []
        tokens = 0
        for group in groups:
            r = torch.tensor([item[2] for item in group], dtype=torch.float32)
            rewards.extend(r.tolist())
            adv = (r - r.mean()) / (r.std(unbiased=False) + 1e-4) if len(group) > 1 else torch.zeros_like(r)
            # one batched forward per prompt length (a GRPO group shares its prompt)
            by_prompt: dict[tuple[int, ...], list[int]] = {}
            for i, item in enumerate(group):
                if item[1]:
                    by_prompt.setdefault(tuple(item[0]), []).append(i)
            for prompt, rows in by_prompt.items():
                width = max(len(group[i][1]) for i in rows)
                ids = torch.zeros((len(rows), len(prompt) + width), dtype=torch.long)
                mask = torch.zeros((len(rows), width))
                for row, i in enumerate(rows):
                    completion = list(group[i][1])
                    ids[row, : len(prompt)] = torch.tensor(prompt)
                    ids[row, len(prompt) : len(prompt) + len(completion)] = torch.tensor(completion)
                    mask[row, : len(completion)] = 1.0
                logp = torch.log_softmax(forward(self.params, ids[:, :-1], self.config), dim=-1)[:, len(prompt) - 1 :]
                token_lp = logp.gather(2, ids[:, len(prompt) :, None])[..., 0] * mask
                tokens += int(mask.sum())
                for row, i in enumerate(rows):
                    rollout_lp = group[i][3]
                    n_tok = len(group[i][1])
                    if rollout_lp is not None and len(rollout_lp) == n_tok:
                        diff = token_lp[row, :n_tok].detach() - torch.tensor(list(rollout_lp))
                        gaps.extend(diff.abs().tolist())
                weights = adv[rows] * scale
                if bool((weights != 0).any()):
                    loss = loss - (weights[:, None] * token_lp).sum()
        self.optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:
            loss.backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
        gap = sum(gaps) / len(gaps) if gaps else math.nan
        return StepStats(sum(rewards) / len(rewards), float(loss.detach()), gap, tokens)

"""The canary against the local engine in-process: a float32 trainer and its BF16 served copy.

The trainer trains float32 weights and publishes them as BF16 (as ``cwtrain demo`` does), so
even correct served weights differ from the trainer's by BF16 rounding; the default bound
must sit well above that, and well below what a corrupted copy gives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import torch

from cwtrain.integrations.rollout import DEFAULT_CANARY_BOUND, Canary, CanaryProbe, RolloutConfig
from cwtrain.local.engine.completions import complete
from cwtrain.local.engine.model import TinyLM, Tokenizer, init_weights, token_logprobs

TOK = Tokenizer()
DATA = ["the cat sat on the mat", "what is 12 + 30?", "hello there, friend", "a b c d e f g"]


def _engine(weights: dict[str, torch.Tensor], identity: str) -> httpx.MockTransport:
    lm = TinyLM(weights)

    def handler(request: httpx.Request) -> httpx.Response:
        answer = complete(json.loads(request.content), lm, identity=identity, model="tiny")
        assert isinstance(answer, dict)
        return httpx.Response(200, json=answer, headers={"x-cwtrain-snapshot-identity": identity})

    return httpx.MockTransport(handler)


def test_bf16_rounding_is_far_below_the_bound_and_a_trained_step_far_above() -> None:
    gen = torch.Generator().manual_seed(7)
    trainer = {k: v.float() + 0.02 * torch.randn(v.shape, generator=gen) for k, v in init_weights(seed=0).items()}

    def trainer_logprobs(prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        return [token_logprobs(trainer, p[:1], p[1:]) for p in prompts]

    probe = CanaryProbe.from_prompts([TOK.encode(t, add_special_tokens=True) for t in DATA])
    config = RolloutConfig("http://engine.test/v1", "tiny")
    served = {k: v.to(torch.bfloat16) for k, v in trainer.items()}
    right = Canary(config, probe, trainer_logprobs, transport=_engine(served, "run-v000001")).check(
        identity="run-v000001"
    )
    assert right.passed and 0 < right.gap < DEFAULT_CANARY_BOUND / 20  # BF16 rounding only
    base = Canary(config, probe, trainer_logprobs, transport=_engine(init_weights(seed=0), "run-v000001")).check()
    assert not base.passed and base.gap > 2 * DEFAULT_CANARY_BOUND  # the weights before the trainer's changes
    print(f"\nBF16 rounding: {right.summary()}\nbase weights: {base.summary()}")

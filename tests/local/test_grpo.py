"""The demo's task and GRPO trainer, offline (local sampling, no stack)."""

from __future__ import annotations

import math

import pytest
import torch

from cwtrain.local.demo.grpo import GRPOTrainer, ParityTask
from cwtrain.local.engine.model import TinyLM, Tokenizer, init_weights, token_logprobs

TOK = Tokenizer()


def test_parity_task_rewards() -> None:
    task = ParityTask(TOK, max_tokens=8, seed=1)
    assert task.reward("even", TOK.encode("2468")) == 0.5
    assert task.reward("odd", TOK.encode("2468")) == 0.0
    assert task.reward("odd", TOK.encode("1357913579")) == 1.0  # only max_tokens slots count
    prompts = task.prompts(6)
    assert prompts == ParityTask(TOK, max_tokens=8, seed=1).prompts(6)
    for kind, ids in prompts:
        assert TOK.decode(ids) == f"{kind}: "


def test_trainer_starts_from_the_base_weights() -> None:
    served = GRPOTrainer(seed=3).served_weights()
    base = init_weights(seed=3)
    assert all(torch.equal(served[k], base[k]) for k in base)


def test_one_step_moves_probability_towards_the_better_sample() -> None:
    trainer = GRPOTrainer(seed=0, lr=1e-2)
    prompt = TOK.encode("even: ")
    good, bad = TOK.encode("2222"), TOK.encode("abcd")
    before = sum(token_logprobs(trainer.served_weights(), prompt, good))
    stats = trainer.step([[(prompt, good, 1.0, None), (prompt, bad, 0.0, None)]], max_tokens=4)
    after = sum(token_logprobs(trainer.served_weights(), prompt, good))
    assert stats.mean_reward == 0.5 and stats.tokens == 8 and math.isnan(stats.logprob_gap)
    assert after > before + 0.1


def test_equal_rewards_leave_weights_unchanged() -> None:
    trainer = GRPOTrainer(seed=0)
    before = trainer.served_weights()
    prompt = TOK.encode("odd: ")
    trainer.step([[(prompt, TOK.encode("1"), 0.5, None), (prompt, TOK.encode("2"), 0.5, None)]], max_tokens=2)
    after = trainer.served_weights()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_reward_climbs_with_local_sampling() -> None:
    torch.set_num_threads(1)
    task = ParityTask(TOK, max_tokens=16, seed=0)
    trainer = GRPOTrainer(seed=0)
    means = []
    for step in range(25):
        lm = TinyLM(trainer.served_weights())
        groups = []
        for i, (kind, ids) in enumerate(task.prompts(4)):
            seqs = lm.generate(ids, n=8, max_tokens=16, seed=step * 100 + i)
            groups.append([(ids, s.token_ids, task.reward(kind, s.token_ids), s.logprobs) for s in seqs])
        stats = trainer.step(groups, 16)
        assert stats.logprob_gap < 0.05  # BF16 serving vs float32 training
        means.append(stats.mean_reward)
    assert sum(means[-3:]) / 3 > 2 * sum(means[:3]) / 3

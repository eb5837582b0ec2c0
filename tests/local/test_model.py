"""The tiny model: tokenizer, deterministic weights, checkpoint bytes, sampling, log-probs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from cwtrain.local.model import (
    ModelConfig,
    TinyLM,
    Tokenizer,
    forward,
    from_tensor_data,
    init_weights,
    load_checkpoint,
    to_tensor_data,
    token_logprobs,
    weights_from_safetensors,
    write_base_checkpoint,
)

TOK = Tokenizer()


def test_tokenizer_round_trip_and_specials() -> None:
    text = "abc 123: x+y=z?\n"
    ids = TOK.encode(text)
    assert TOK.vocab_size == 64 == ModelConfig().vocab_size
    assert all(2 <= i < 64 for i in ids)
    assert TOK.decode(ids) == text
    assert TOK.encode("hi", add_special_tokens=True)[0] == TOK.bos_token_id
    assert TOK.decode([TOK.eos_token_id, *TOK.encode("a")]) == "a"
    assert TOK.decode([TOK.eos_token_id], skip_special_tokens=False) == "<eos>"
    assert TOK.decode(TOK.encode("ÄB")) == "??"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOK.decode([64])


def test_weights_are_bf16_deterministic_per_seed() -> None:
    a, b, c = init_weights(seed=1), init_weights(seed=1), init_weights(seed=2)
    assert set(a) == set(ModelConfig().tensor_shapes())
    assert all(t.dtype == torch.bfloat16 for t in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])
    assert "model.layers.1.mlp.down_proj.weight" in a


def test_base_checkpoint_files_and_bytes(tmp_path: Path) -> None:
    write_base_checkpoint(tmp_path / "a", seed=4)
    write_base_checkpoint(tmp_path / "b", seed=4)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["hidden_size"] == 64 and config["torch_dtype"] == "bfloat16" and config["seed"] == 4
    loaded_config, weights = load_checkpoint(tmp_path / "a")
    assert loaded_config == ModelConfig()
    expected = init_weights(seed=4)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    _, metadata = weights_from_safetensors((tmp_path / "a" / "model.safetensors").read_bytes())
    assert metadata == {"format": "pt"}


def test_tensor_data_round_trip_is_byte_exact() -> None:
    weights = init_weights(seed=5)
    data = to_tensor_data(weights)
    dtype, shape, raw = data["lm_head.weight"]
    assert dtype == "BF16" and shape == (64, 64) and raw.nbytes == 64 * 64 * 2
    back = from_tensor_data({k: (d, s, bytes(r)) for k, (d, s, r) in data.items()})
    assert all(torch.equal(back[k], weights[k]) for k in weights)


def test_generation_is_reproducible_and_logprobs_match() -> None:
    weights = init_weights(seed=0)
    lm = TinyLM(weights)
    prompt = TOK.encode("seed: ")
    first = lm.generate(prompt, n=4, max_tokens=10, seed=11)
    again = lm.generate(prompt, n=4, max_tokens=10, seed=11)
    other = lm.generate(prompt, n=4, max_tokens=10, seed=12)
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert [s.token_ids for s in first] != [s.token_ids for s in other]
    for seq in first:
        assert seq.finish_reason in ("stop", "length")
        assert len(seq.logprobs) == len(seq.token_ids) <= 10
        assert seq.logprobs == pytest.approx(token_logprobs(weights, prompt, seq.token_ids), abs=1e-5)


def test_greedy_stops_and_lengths() -> None:
    lm = TinyLM(init_weights(seed=0))
    prompt = TOK.encode("go")
    greedy = lm.generate(prompt, n=2, max_tokens=6, temperature=0, ignore_eos=True)
    assert greedy[0].token_ids == greedy[1].token_ids and len(greedy[0].token_ids) == 6
    assert greedy[0].finish_reason == "length"
    first = greedy[0].token_ids[0]
    stopped = lm.generate(prompt, max_tokens=6, temperature=0, stop_token_ids=[first])[0]
    assert (stopped.token_ids, stopped.finish_reason, stopped.stop_reason) == ([first], "stop", first)
    # top_k=1 is greedy whatever the seed
    assert lm.generate(prompt, max_tokens=6, top_k=1, seed=3, ignore_eos=True)[0].token_ids == greedy[0].token_ids
    with pytest.raises(ValueError, match="context"):
        lm.generate(prompt, max_tokens=1000)


def test_forward_is_differentiable_in_float32() -> None:
    params = {k: v.float().requires_grad_() for k, v in init_weights(seed=0).items()}
    ids = torch.tensor([TOK.encode("abcd")])
    logits = forward(params, ids)
    assert logits.shape == (1, 4, 64)
    torch.log_softmax(logits, -1)[0, -1, 5].backward()
    assert params["lm_head.weight"].grad is not None and params["lm_head.weight"].grad.abs().sum() > 0


def test_a_grpo_group_is_fast() -> None:
    torch.set_num_threads(1)
    lm = TinyLM(init_weights(seed=0))
    prompt = TOK.encode("count to ten: ")
    lm.generate(prompt, n=8, max_tokens=16, seed=0)  # warm-up
    start = time.perf_counter()
    for i in range(3):
        lm.generate(prompt, n=8, max_tokens=16, seed=i, ignore_eos=True)
    # generous bound for a loaded 2-core CI machine; typical is ~40 ms per group
    assert (time.perf_counter() - start) / 3 < 0.5

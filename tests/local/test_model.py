"""The tiny model: tokenizer, deterministic weights, checkpoint bytes, sampling, log-probs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from cwtrain.local.engine.model import (
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


def test_encode_parses_special_token_text_as_huggingface_does() -> None:
    assert TOK.encode("<bos>a<eos>") == [TOK.bos_token_id, *TOK.encode("a"), TOK.eos_token_id]
    assert TOK.encode("<bo") == [TOK.encode("<")[0], *TOK.encode("bo")]
    assert TOK.decode(TOK.encode("<bos>hi"), skip_special_tokens=False) == "<bos>hi"
    assert TOK.convert_ids_to_tokens([1, *TOK.encode("a")]) == ["<bos>", "a"]


def test_chat_template_lives_in_tokenizer_config_and_renders_like_transformers(tmp_path: Path) -> None:
    from cwtrain.local.engine.tokenizer import CHAT_TEMPLATE, ChatTemplateError

    write_base_checkpoint(tmp_path, seed=0)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE == TOK.chat_template
    assert (config["bos_token"], config["eos_token"], config["model_max_length"]) == ("<bos>", "<eos>", 256)
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "ignored"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    text = TOK.apply_chat_template(chat, add_generation_prompt=True)
    assert text == "<bos><system>be brief\n<user>hi\n<assistant>hello<eos>\n<user>again\n<assistant>"
    assert TOK.apply_chat_template(chat) == text.removesuffix("<assistant>")
    ids = TOK.encode(text)
    assert ids[0] == TOK.bos_token_id and ids.count(TOK.eos_token_id) == 1
    assert TOK.decode(ids, skip_special_tokens=False) == text
    # continue_final_message: the text ends right after the last message's content
    prefill = [*chat[:2], {"role": "assistant", "content": "hel"}]
    assert (
        TOK.apply_chat_template(prefill, continue_final_message=True)
        == "<bos><system>be brief\n<user>hi\n<assistant>hel"
    )
    with pytest.raises(ChatTemplateError, match="not compatible"):
        TOK.apply_chat_template(prefill, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="boom"):
        TOK.apply_chat_template(chat, chat_template="{{ raise_exception('boom') }}")
    custom = "{% for m in messages %}{{ m['content'] | upper }}{{ extra }}{% endfor %}"
    assert TOK.apply_chat_template(chat[:1], chat_template=custom, extra="!") == "BE BRIEF!"


def test_include_stop_str_in_output_keeps_a_stop_tokens_text_as_vllm_does() -> None:
    lm = TinyLM(init_weights(seed=0))
    prompt = TOK.encode("go")
    greedy = lm.generate(prompt, max_tokens=6, temperature=0, ignore_eos=True)[0]
    second = greedy.token_ids[1]
    assert second not in TOK.special_ids
    cut = lm.generate(prompt, max_tokens=6, temperature=0, stop_token_ids=[second], ignore_eos=True)[0]
    kept = lm.generate(
        prompt, max_tokens=6, temperature=0, stop_token_ids=[second], ignore_eos=True, include_stop_str_in_output=True
    )[0]
    assert cut.token_ids == kept.token_ids == greedy.token_ids[:2]
    assert (cut.stop_reason, kept.stop_reason) == (second, second)
    assert cut.text == TOK.decode(greedy.token_ids[:1])
    assert kept.text == TOK.decode(greedy.token_ids[:2])
    # EOS is special: its text is never shown
    eos = lm.generate(prompt, max_tokens=6, temperature=0, stop_token_ids=[0], include_stop_str_in_output=True)[0]
    assert "<eos>" not in eos.text


def test_on_token_sees_every_token_as_the_sequences_end_up() -> None:
    from cwtrain.local.engine.model import TokenEvent

    lm = TinyLM(init_weights(seed=0))
    prompt = TOK.encode("stream: ")
    events: list[tuple[int, TokenEvent]] = []
    seqs = lm.generate(
        prompt, n=3, max_tokens=8, seed=4, stop=["e", "a"], top_logprobs=2, on_token=lambda j, e: events.append((j, e))
    )
    assert seqs == lm.generate(prompt, n=3, max_tokens=8, seed=4, stop=["e", "a"], top_logprobs=2)
    for j, seq in enumerate(seqs):
        mine = [e for i, e in events if i == j]
        assert [e.token_id for e in mine] == seq.token_ids
        assert [e.logprob for e in mine] == seq.logprobs
        assert [e.top for e in mine] == seq.top_logprobs
        assert [e.finish_reason for e in mine] == [None] * (len(mine) - 1) + [seq.finish_reason]
        assert (mine[-1].text, mine[-1].stop_reason) == (seq.text, seq.stop_reason)

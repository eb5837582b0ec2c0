"""``--rollout-function-path cwtrain.integrations.slime.rollout.generate_rollout`` as slime calls it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeCompletions
from slime_driver import slime_args

from cwtrain.errors import ConfigError

PROMPTS = [("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6")]


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 50 + 2 for c in text]

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(chr(i) for i in ids)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCompletions]:
    with FakeCompletions(identity="grpo-a-v000004") as server:
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", server.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "tiny")
        yield server


def _call(args: Any, *, evaluation: bool = False, prompts: list[tuple[Any, str]] = PROMPTS) -> Any:
    from slime.rollout.base_types import call_rollout_fn
    from slime.rollout.data_source import DataSource
    from slime.utils.misc import load_function

    fn = load_function(args.rollout_function_path)
    return call_rollout_fn(fn, args, 7, DataSource(args, prompts), evaluation=evaluation)


def test_one_request_per_group_fills_every_sample(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.utils.types import Sample

    from cwtrain.integrations.slime.rollout import set_tokenizer

    set_tokenizer(CharTokenizer())
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "grpo-a")  # the run the hook publishes (see the last test)
    args = slime_args(tmp_path, tmp_path / "hf", rollout_batch_size=3, n_samples_per_prompt=4)
    output = _call(args)
    assert isinstance(output, RolloutFnTrainOutput)
    assert [len(g) for g in output.samples] == [4, 4, 4]
    assert len(fake.bodies) == 3 and all(b["n"] == 4 and b["max_tokens"] == 6 for b in fake.bodies)
    sent = sorted(b["prompt"] for b in fake.bodies)
    assert sent == sorted(CharTokenizer().encode(p) for p, _ in PROMPTS)  # token ids of the trainer's tokenizer
    assert all(b["temperature"] == 1.0 and b["top_p"] == 1.0 for b in fake.bodies)
    for group, (prompt, _) in zip(output.samples, PROMPTS, strict=True):
        prompt_ids = CharTokenizer().encode(prompt)
        for i, sample in enumerate(group):
            assert isinstance(sample, Sample)
            assert sample.tokens[: len(prompt_ids)] == prompt_ids
            assert sample.response_length == len(sample.tokens) - len(prompt_ids) == (3 if i % 2 == 0 else 4)
            assert sample.status is (Sample.Status.COMPLETED if i % 2 == 0 else Sample.Status.TRUNCATED)
            assert sample.rollout_log_probs == pytest.approx([-0.1 * (j + 1) for j in range(sample.response_length)])
            assert sample.weight_versions == ["4"]  # the identity that served it, as slime's version string
            assert sample.reward in (0.0, 1.0)  # slime's own rule reward (the stand-in's exact match)
            assert len(sample.response) == sample.response_length
    assert output.metrics["coreweave/samples"] == 12
    from cwtrain.integrations.slime import reset

    reset()  # a fresh process that knows no run: "-v000004" is not taken for one of its versions
    monkeypatch.delenv("CWTRAIN_HOTLOAD_RUN_ID")
    unknown = _call(args)
    assert {s.weight_versions[-1] for g in unknown.samples for s in g} == {"grpo-a-v000004"}


def test_rewards_go_through_slimes_reward_hooks(slime_stubs: Path, tmp_path: Path, fake: FakeCompletions) -> None:
    args = slime_args(tmp_path, tmp_path / "hf", custom_rm_path="rewards_for_tests.per_sample")
    output = _call(args)
    assert all(s.reward == float(s.response_length) for g in output.samples for s in g)
    args = slime_args(tmp_path, tmp_path / "hf", custom_rm_path="rewards_for_tests.per_group", group_rm=True)
    output = _call(args)
    for group in output.samples:  # lengths 3, 4, 3: the longest wins
        assert [s.reward for s in group] == [0.0, 1.0, 0.0]


def test_text_prompts_without_a_tokenizer_use_the_endpoints_prompt_ids(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions
) -> None:
    from cwtrain.integrations.slime.rollout import set_tokenizer

    set_tokenizer(None)
    output = _call(slime_args(tmp_path, tmp_path / "hf"))
    assert sorted(b["prompt"] for b in fake.bodies) == ["1+1=", "2+2="]  # text, in whatever order they arrived
    sample = output.samples[0][0]
    assert sample.tokens[:4] == [ord(c) % 50 + 2 for c in "1+1="]


def test_served_version_falls_back_to_the_hooks_state_dir(slime_stubs: Path, tmp_path: Path) -> None:
    from cwtrain.integrations.slime.rollout import served_version

    args = slime_args(tmp_path, tmp_path / "hf")
    state = Path(args.update_weight_disk_dir + "-hotload")
    state.mkdir(parents=True)
    assert served_version(args, {}) is None
    (state / "served_identity").write_text("grpo-a-v000012")
    assert served_version(args, {}) == 12
    assert served_version(args, {"CWTRAIN_HOTLOAD_RUN_ID": "other"}) is None
    (state / "served_identity").write_text("initial")
    assert served_version(args, {}) is None


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("custom_generate_function_path", "my.generate"),
        ("dynamic_sampling_filter_path", "my.filter"),
        ("rollout_sample_filter_path", "my.sample_filter"),
        ("rollout_all_samples_process_path", "my.process"),
    ],
)
def test_refuses_flags_it_would_silently_bypass(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions, flag: str, value: Any
) -> None:
    args = slime_args(tmp_path, tmp_path / "hf", **{flag: value})
    with pytest.raises(ConfigError, match="--" + flag.replace("_", "-")):
        _call(args)
    assert fake.bodies == []


def test_refuses_over_sampling_and_untempered_logprob_users(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions
) -> None:
    with pytest.raises(ConfigError, match="--over-sampling-batch-size"):
        _call(slime_args(tmp_path, tmp_path / "hf", over_sampling_batch_size=9))
    with pytest.raises(ConfigError, match="--rollout-temperature"):
        _call(slime_args(tmp_path, tmp_path / "hf", use_tis=True, rollout_temperature=0.7))
    assert fake.bodies == []


def test_evaluation_and_message_prompts_are_refused_with_the_fix(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions
) -> None:
    with pytest.raises(ConfigError, match="--eval-interval"):
        _call(slime_args(tmp_path, tmp_path / "hf"), evaluation=True)
    messages = [([{"role": "user", "content": "hi"}], "x")]
    with pytest.raises(ConfigError, match="--apply-chat-template"):
        _call(slime_args(tmp_path, tmp_path / "hf"), prompts=messages)


def test_missing_slime_names_the_install(tmp_path: Path) -> None:
    from cwtrain.integrations.slime.rollout import generate_rollout

    with pytest.raises(ImportError, match=r"pip install \./packages/cwtrain-slime"):
        generate_rollout(slime_args(tmp_path, tmp_path / "hf"), 0, None)


def test_an_unpatched_slime_without_engines_is_stopped_at_the_first_rollout(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions
) -> None:
    """slime drops --update-weight-standalone-publish when unpatched; nothing would ever be published."""
    hook = "cwtrain.integrations.slime.hook"
    args = slime_args(tmp_path, tmp_path / "hf", rollout_num_gpus=0, custom_update_weight_post_write_path=hook)
    with pytest.raises(ConfigError, match="--update-weight-standalone-publish"):
        _call(args)
    assert fake.bodies == []  # before any sampling, before any training step
    args.update_weight_standalone_publish = True  # the patched slime
    assert len(_call(args).samples) == args.rollout_batch_size


@pytest.mark.parametrize(
    ("served_by", "tag"),
    [("weights-k3x9q2-v000004", "4"), ("grpo-a-v000004", "grpo-a-v000004"), ("initial", "initial")],
    ids=["this run", "another run", "the base"],
)
def test_samples_count_only_this_runs_versions(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served_by: str, tag: str
) -> None:
    """The run id comes from what every process shares (here the wandb run id), not a per-process stamp."""
    from cwtrain.integrations.slime.rollout import set_tokenizer

    set_tokenizer(CharTokenizer())
    with FakeCompletions(identity=served_by) as server:
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", server.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "tiny")
        output = _call(slime_args(tmp_path, tmp_path / "hf", wandb_run_id="k3x9q2"))
    assert {s.weight_versions[-1] for g in output.samples for s in g} == {tag}
    samples = sum(len(g) for g in output.samples)
    if tag == "4":  # the batch's counters go to slime's rollout metrics
        assert output.metrics["coreweave/served_version_samples/4"] == samples
        assert output.metrics["coreweave/served_version_min"] == output.metrics["coreweave/served_version_max"] == 4
    else:
        assert output.metrics["coreweave/samples_without_version"] == samples
    assert output.metrics["coreweave/stale_rerequested"] == output.metrics["coreweave/mixed_groups_resampled"] == 0


def test_the_served_version_of_another_run_is_not_this_runs(slime_stubs: Path, tmp_path: Path) -> None:
    from cwtrain.integrations.slime.rollout import served_version

    args = slime_args(tmp_path, tmp_path / "hf", wandb_run_id="k3x9q2")
    state = Path(args.update_weight_disk_dir + "-hotload")
    state.mkdir(parents=True)
    (state / "served_identity").write_text("grpo-a-v000012")
    assert served_version(args, {}) is None  # the run is weights-k3x9q2
    (state / "served_identity").write_text("weights-k3x9q2-v000012")
    assert served_version(args, {}) == 12


@pytest.mark.parametrize("flag", __import__("cwtrain.integrations.slime.rollout", fromlist=["x"]).REFUSED_FLAGS)
def test_every_flag_listed_as_refused_is_refused(
    slime_stubs: Path, tmp_path: Path, fake: FakeCompletions, flag: str
) -> None:
    args = slime_args(tmp_path, tmp_path / "hf", **{flag[2:].replace("-", "_"): "my.module.attr"})
    with pytest.raises(ConfigError, match=flag):
        _call(args)


def test_slime_is_not_said_to_refuse_a_flag_it_does_not_have() -> None:
    """slime has no --use-session-server (miles does): the stand-in namespace and the docs follow slime."""
    from cwtrain.integrations.slime.rollout import REFUSED_FLAGS

    assert "--use-session-server" not in REFUSED_FLAGS
    assert not hasattr(slime_args(Path("/tmp"), Path("/tmp/hf")), "use_session_server")
    docs = (Path(__file__).resolve().parents[2] / "docs" / "slime.md").read_text(encoding="utf-8")
    refused = docs[docs.index("Refused, naming the flag") :].split("\n\n", 1)[0]
    assert "--use-session-server" not in refused and all(flag in refused for flag in REFUSED_FLAGS)


def test_max_staleness_fences_a_slime_rollout_to_the_version_the_deployment_serves(
    slime_stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout's sampler learns the run and the served version; stale completions come back re-requested."""
    from cwtrain.integrations.slime.rollout import set_tokenizer

    set_tokenizer(CharTokenizer())
    args = slime_args(tmp_path, tmp_path / "hf", wandb_run_id="k3x9q2")
    state = Path(args.update_weight_disk_dir + "-hotload")
    state.mkdir(parents=True)
    (state / "served_identity").write_text("weights-k3x9q2-v000005")  # what the hook recorded as served
    with FakeCompletions(identity="weights-k3x9q2-v000004") as server:  # one replica still on v4 at first
        answer = server.answer

        def swap_after_two(body: dict[str, Any]) -> dict[str, Any]:
            if len(server.bodies) > 2:
                server.identity = "weights-k3x9q2-v000005"
            return answer(body)

        monkeypatch.setattr(server, "answer", swap_after_two)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", server.base_url)
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", "tiny")
        monkeypatch.setenv("CWTRAIN_ROLLOUT_MAX_STALENESS", "0")
        output = _call(args)
    assert {s.weight_versions[-1] for g in output.samples for s in g} == {"5"}
    assert output.metrics["coreweave/stale_rerequested"] >= 1
    assert output.metrics["coreweave/served_version_min"] == 5 and output.metrics["coreweave/staleness_max"] == 0

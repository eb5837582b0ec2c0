"""RolloutConfig: variables, precedence, validation, slime/miles trainer checks; fill_group; nvext salts."""

from __future__ import annotations

import argparse
import enum
import hashlib
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cwtrain.errors import ConfigError
from cwtrain.integrations import nvext
from cwtrain.integrations.rollout import Completion, RolloutConfig, RolloutError, fill_group, version_tag

BASE = {"CWTRAIN_ROLLOUT_BASE_URL": "https://x.example/v1/", "CWTRAIN_ROLLOUT_MODEL": "qwen"}


def test_field_order_and_defaults_follow_the_spec() -> None:
    assert [f.name for f in fields(RolloutConfig)] == [
        "base_url", "model", "api_key", "concurrency", "timeout", "max_attempts", "logprobs",
        "token_ids", "token_id_prompts", "routed_experts", "require_logprobs", "seeds", "max_staleness",
    ]  # fmt: skip
    config = RolloutConfig.from_env(BASE)
    assert config == RolloutConfig(
        "https://x.example/v1", "qwen", None, 16, 600.0, 6, True, True, True, False, False, True, None
    )
    assert config.completions_url == "https://x.example/v1/completions"


def test_every_variable_is_read_and_explicit_arguments_win() -> None:
    env = dict(
        BASE,
        CWTRAIN_ROLLOUT_API_KEY="k1",
        CWTRAIN_ROLLOUT_CONCURRENCY="3",
        CWTRAIN_ROLLOUT_TIMEOUT="12.5",
        CWTRAIN_ROLLOUT_MAX_ATTEMPTS="2",
        CWTRAIN_ROLLOUT_LOGPROBS="no",
        CWTRAIN_ROLLOUT_TOKEN_IDS="off",
        CWTRAIN_ROLLOUT_TOKEN_ID_PROMPTS="0",
        CWTRAIN_ROLLOUT_SEEDS="FALSE",
    )
    config = RolloutConfig.from_env(env)
    assert (config.api_key, config.concurrency, config.timeout, config.max_attempts) == ("k1", 3, 12.5, 2)
    assert not (config.logprobs or config.token_ids or config.token_id_prompts or config.seeds)
    assert RolloutConfig.from_env(env, concurrency=9, model="other").concurrency == 9
    env["CWTRAIN_ROLLOUT_ROUTED_EXPERTS"] = "1"
    with pytest.raises(ConfigError, match="routed experts need"):
        RolloutConfig.from_env(env)


def test_key_file_is_used_when_the_key_is_empty(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("from-file\n")
    env = dict(BASE, CWTRAIN_ROLLOUT_API_KEY=" ", CWTRAIN_ROLLOUT_API_KEY_FILE=str(key))
    assert RolloutConfig.from_env(env).api_key == "from-file"
    env["CWTRAIN_ROLLOUT_API_KEY_FILE"] = str(tmp_path / "missing")
    assert RolloutConfig.from_env(env).api_key is None
    env["CWTRAIN_ROLLOUT_API_KEY"] = "direct"
    assert RolloutConfig.from_env(env).api_key == "direct"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CWTRAIN_ROLLOUT_CONCURRENCY", "0", "CWTRAIN_ROLLOUT_CONCURRENCY='0' is out of range"),
        ("CWTRAIN_ROLLOUT_MAX_ATTEMPTS", "1.5", "CWTRAIN_ROLLOUT_MAX_ATTEMPTS='1.5' is not an integer"),
        ("CWTRAIN_ROLLOUT_TIMEOUT", "inf", "CWTRAIN_ROLLOUT_TIMEOUT='inf' must be a finite"),
        ("CWTRAIN_ROLLOUT_TIMEOUT", "-1", "must be a finite number > 0"),
        ("CWTRAIN_ROLLOUT_LOGPROBS", "maybe", "CWTRAIN_ROLLOUT_LOGPROBS='maybe' is not a boolean"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        RolloutConfig.from_env(dict(BASE, **{name: value}))


def test_required_values_and_labels() -> None:
    with pytest.raises(ConfigError, match="CWTRAIN_ROLLOUT_BASE_URL is not set"):
        RolloutConfig.from_env({"CWTRAIN_ROLLOUT_MODEL": "m"})
    with pytest.raises(ConfigError, match=r"coreweave_cfg.model is not set"):
        RolloutConfig.from_env({"CWTRAIN_ROLLOUT_BASE_URL": "http://h/v1"}, labels={"model": "coreweave_cfg.model"})
    label = {"CWTRAIN_ROLLOUT_CONCURRENCY": "coreweave_cfg.concurrency"}
    with pytest.raises(ConfigError, match=r"coreweave_cfg.concurrency='x' is not an integer"):
        RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_CONCURRENCY="x"), labels=label)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"routed_experts": True, "token_id_prompts": False}, "routed experts need"),
        ({"require_logprobs": True, "logprobs": False}, "require_logprobs needs"),
    ],
)
def test_invalid_combinations(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RolloutConfig("http://h/v1", "m", **kwargs)


def _args(**kw: Any) -> argparse.Namespace:
    base = dict(
        rollout_batch_size=8,
        over_sampling_batch_size=None,
        n_samples_per_prompt=4,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        use_tis=False,
        use_rollout_logprobs=False,
        get_mismatch_metrics=False,
        use_rollout_routing_replay=False,
    )
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize(
    "flag",
    [
        "custom_generate_function_path",
        "dynamic_sampling_filter_path",
        "rollout_sample_filter_path",
        "rollout_all_samples_process_path",
        "use_session_server",
    ],
)
def test_for_trainer_refuses_flags_by_name(flag: str) -> None:
    with pytest.raises(ConfigError, match="--" + flag.replace("_", "-")):
        RolloutConfig.for_trainer(_args(**{flag: "x.y" if flag.endswith("path") else True}), BASE)
    assert RolloutConfig.for_trainer(_args(**{flag: None}), BASE).model == "qwen"


def test_for_trainer_over_sampling_routes_and_logprobs(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="--over-sampling-batch-size 16 is above --rollout-batch-size 8"):
        RolloutConfig.for_trainer(_args(over_sampling_batch_size=16), BASE)
    assert RolloutConfig.for_trainer(_args(over_sampling_batch_size=8), BASE).routed_experts is False
    assert RolloutConfig.for_trainer(_args(use_rollout_routing_replay=True), BASE).routed_experts is True
    for flag in ("use_tis", "use_rollout_logprobs", "get_mismatch_metrics"):
        assert RolloutConfig.for_trainer(_args(**{flag: True}), BASE).require_logprobs is True
    assert RolloutConfig.for_trainer(_args(), BASE).require_logprobs is False
    with pytest.raises(ConfigError, match=r"--use-tis need --rollout-temperature 1.0"):
        RolloutConfig.for_trainer(_args(use_tis=True, rollout_temperature=0.8), BASE)
    caplog.set_level(logging.WARNING)
    config = RolloutConfig.for_trainer(_args(get_mismatch_metrics=True, rollout_temperature=0.8), BASE)
    assert config.require_logprobs and any("--get-mismatch-metrics" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match="need rollout log-probs"):
        RolloutConfig.for_trainer(_args(use_tis=True), dict(BASE, CWTRAIN_ROLLOUT_LOGPROBS="0"))


# ------------------------------------------------------------------ fill_group


@dataclass
class Sample:
    """Stand-in for slime.utils.types.Sample (the fields cwtrain reads and sets)."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    prompt: str = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    status: Status = Status.PENDING
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    weight_versions: list[str] = field(default_factory=list)


def test_fill_group_sets_the_sample_fields() -> None:
    routes = np.zeros((5, 2, 1), dtype=np.int32)
    completions = [
        Completion((1, 2), (3, 4, 5, 6), "abcd", (-0.1, -0.2, -0.3, -0.4), "stop", "run-v000012", 0.5,
                   routed_experts=routes, version=12),  # a sampler that knows its run tagged it
        Completion((1, 2), (7,), "e", None, "length", "initial", 0.4),
    ]  # fmt: skip
    samples = [Sample(weight_versions=["11"]), Sample()]
    out = fill_group(samples, completions)
    assert out == samples
    first, second = samples
    assert first.tokens == [1, 2, 3, 4, 5, 6] and first.response == "abcd" and first.response_length == 4
    assert first.status is Sample.Status.COMPLETED and first.rollout_log_probs == [-0.1, -0.2, -0.3, -0.4]
    assert first.rollout_routed_experts is routes and first.weight_versions == ["11", "12"]
    assert second.status is Sample.Status.TRUNCATED and second.rollout_log_probs is None
    assert second.weight_versions == ["initial"] and second.rollout_routed_experts is None
    with pytest.raises(RolloutError, match="2 samples got 1"):
        fill_group(samples, completions[:1])
    # without the run, "-v000012" is not taken for a version: the identity is kept as it is
    unknown = Completion((1,), (2,), "x", None, "stop", "run-v000012", 0.1)
    assert fill_group([Sample()], [unknown])[0].weight_versions == ["run-v000012"]
    assert fill_group([Sample()], [Completion((1,), (2,), "x", None, "stop", None, 0.1)])[0].weight_versions == []


def test_version_tag_is_this_runs_version_or_the_identity_as_it_is() -> None:
    assert version_tag("grpo-a-v000012", "grpo-a") == "12"
    assert version_tag("grpo-a-v1234567", "grpo-a") == "1234567"
    assert version_tag("grpo-b-v000012", "grpo-a") == "grpo-b-v000012"  # another run's: never a number
    assert version_tag("grpo-a-v000012", None) == "grpo-a-v000012"  # the run is not known
    assert version_tag("grpo-v12", "grpo") == "grpo-v12"
    assert version_tag(None, "grpo-a") is None


# ----------------------------------------------------------------------- nvext


def test_cache_salts() -> None:
    assert nvext.as_cache_salt("run-v000001") == "run-v000001"
    for bad in ("", "a/b", "a@b", "a\\b", "a\x00b", "x" * 129):
        assert nvext.as_cache_salt(bad) == hashlib.sha256(bad.encode()).hexdigest()
    assert nvext.as_cache_salt("x" * 128) == "x" * 128
    assert nvext.rollout_cache_salt(None) is None
    assert nvext.rollout_cache_salt("r/1") == hashlib.sha256(b"r/1").hexdigest()


def test_served_identity_file(tmp_path: Path) -> None:
    assert nvext.served_salt(tmp_path) is None
    with pytest.raises(RolloutError, match="served_identity"):
        nvext.require_served_salt(tmp_path)
    path = nvext.write_served_identity(tmp_path / "state", "run-v000004")
    assert path.name == nvext.SERVED_IDENTITY_FILE == "served_identity"
    assert path.read_text() == "run-v000004\n"
    assert nvext.require_served_salt(tmp_path / "state") == "run-v000004"
    nvext.write_served_identity(tmp_path / "state", "run-v000005")
    assert nvext.served_salt(tmp_path / "state") == "run-v000005"
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["served_identity"]


def test_the_recorded_run_and_version(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert nvext.recorded_run_id(state) is None and nvext.recorded_run_id(None) is None
    assert nvext.recorded_version(state, "run") is None
    nvext.write_served_identity(state, "my.run-v000012")
    assert nvext.recorded_run_id(state) == "my.run"
    assert nvext.recorded_version(state, "my.run") == 12
    assert nvext.recorded_version(state, "other") is None  # another run's identity is no version of this one
    nvext.write_served_identity(state, "initial")  # names no version: no run to learn
    assert nvext.recorded_run_id(state) is None and nvext.recorded_version(state, "initial") is None
    (state / "served_identity").unlink()
    (state / "served_identity").mkdir()  # unreadable: nothing, not an error
    assert nvext.recorded_run_id(state) is None and nvext.recorded_version(state, "my.run") is None


def test_with_nvext_merges() -> None:
    body = {"model": "m", "nvext": {"extra_fields": ["a"]}}
    out = nvext.with_nvext(body, cache_salt="s/1", extra_fields=["routed_experts", "a"])
    assert out["nvext"] == {"extra_fields": ["a", "routed_experts"], "cache_salt": hashlib.sha256(b"s/1").hexdigest()}
    assert body == {"model": "m", "nvext": {"extra_fields": ["a"]}}
    assert "nvext" not in nvext.with_nvext({"model": "m"})


def test_routed_experts_from_the_environment() -> None:
    assert RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_ROUTED_EXPERTS="yes")).routed_experts is True
    with pytest.raises(TypeError, match="no field"):
        RolloutConfig.from_env(BASE, bogus=1)


def test_max_staleness_is_unset_by_default_and_checked() -> None:
    assert RolloutConfig.from_env(BASE).max_staleness is None
    assert RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_MAX_STALENESS="0")).max_staleness == 0
    assert RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_MAX_STALENESS=" ")).max_staleness is None
    assert RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_MAX_STALENESS="3"), max_staleness=1).max_staleness == 1
    for bad in ("-1", "one", "1.5"):
        with pytest.raises(ConfigError, match="CWTRAIN_ROLLOUT_MAX_STALENESS"):
            RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_MAX_STALENESS=bad))
    with pytest.raises(ConfigError, match="max_staleness"):
        RolloutConfig("https://x.example/v1", "qwen", max_staleness=-2)
    labelled = {"max_staleness": "coreweave_cfg.max_staleness"}
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.max_staleness"):
        RolloutConfig.from_env(dict(BASE, CWTRAIN_ROLLOUT_MAX_STALENESS="x"), labels=labelled)

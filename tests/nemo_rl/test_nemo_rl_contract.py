"""Contract tests of cwtrain-nemo-rl against stand-ins of NeMo-RL v0.7.0's classes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from cwtrain.errors import ConfigError, CWTrainError
from cwtrain.integrations.nemo_rl.config import CoreWeaveConfig
from cwtrain.integrations.rollout import CompletionSampler

ENV = {
    "CWTRAIN_ROLLOUT_BASE_URL": "http://127.0.0.1:9/v1",
    "CWTRAIN_ROLLOUT_MODEL": "tiny-model",
    "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "dep-1",
}


def _fake_endpoint(requests: list[dict[str, Any]]) -> httpx.MockTransport:
    """Answers each group: completion i of n is tokens [100+i, 7] (stop) with log-probs -0.5."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        choices = []
        for i in range(body["n"]):
            ids = [100 + i, 7] if body["max_tokens"] >= 2 else [100 + i]
            choices.append(
                {
                    "index": i,
                    "text": "x" * len(ids),
                    "finish_reason": "stop" if len(ids) == 2 else "length",
                    "token_ids": ids,
                    "prompt_token_ids": body["prompt"],
                    "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                }
            )
        return httpx.Response(
            200,
            json={"choices": choices, "usage": {}},
            headers={"x-cwtrain-snapshot-identity": "run-v000003"},
        )

    return httpx.MockTransport(handler)


class _Tok:
    pad_token_id = 0
    eos_token_id = 2

    def decode(self, ids: Any) -> str:
        return " ".join(map(str, ids))


def _generation(config: dict[str, Any], requests: list[dict[str, Any]]) -> Any:
    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration

    settings = CoreWeaveConfig.from_generation_config(config, ENV)
    sampler = CompletionSampler(settings.rollout, transport=_fake_endpoint(requests), tokenizer=_Tok())
    return CoreWeaveGeneration(config, _Tok(), environ=ENV, sampler=sampler)


def test_generation_implements_the_interface_and_lifecycle_calls() -> None:
    from nemo_rl.models.generation.interfaces import GenerationInterface

    gen = _generation({"max_new_tokens": 4}, [])
    assert isinstance(gen, GenerationInterface)
    assert gen.init_collective("1.2.3.4", 1234, 2) == []  # the abstract method's signature
    assert gen.init_collective("1.2.3.4", 1234, 2, train_world_size=2, refit_backend="nccl") == []  # grpo.setup's
    assert gen.prepare_for_generation() is True and gen.finish_generation(tags=["x"]) is True
    gen.prepare_refit_info({"w": ((2, 2), torch.bfloat16)})
    assert gen.refit_info == {"w": ((2, 2), torch.bfloat16)}
    assert gen.served_model_name == "tiny-model"
    assert gen.weight_synchronizer is None
    assert gen.shutdown() is True


def test_generate_groups_identical_prompts_and_fills_the_output_spec() -> None:
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    requests: list[dict[str, Any]] = []
    gen = _generation({"max_new_tokens": 4, "temperature": 0.7, "_pad_token_id": 9}, requests)
    data = BatchedDataDict(
        {
            "input_ids": torch.tensor([[5, 6, 0], [5, 6, 0], [8, 0, 0], [5, 6, 0]]),
            "input_lengths": torch.tensor([2, 2, 1, 2]),
        }
    )
    out = gen.generate(data, greedy=False)
    assert isinstance(out, BatchedDataDict)
    assert sorted((r["prompt"], r["n"]) for r in requests) == [([5, 6], 3), ([8], 1)]
    assert all(r["temperature"] == 0.7 and r["max_tokens"] == 4 for r in requests)
    assert out["output_ids"].tolist() == [[5, 6, 100, 7], [5, 6, 101, 7], [8, 100, 7, 9], [5, 6, 102, 7]]
    assert out["generation_lengths"].tolist() == [2, 2, 2, 2]
    assert out["unpadded_sequence_lengths"].tolist() == [4, 4, 3, 4]
    assert out["truncated"].tolist() == [False] * 4
    assert out["logprobs"].dtype == torch.float32
    assert out["logprobs"][2].tolist() == [0.0, -0.5, -0.5, 0.0]
    assert out["logprobs"][0].tolist() == [0.0, 0.0, -0.5, -0.5]
    assert gen.served_identities == ("run-v000003",)


def test_greedy_max_model_len_and_stop_strings() -> None:
    requests: list[dict[str, Any]] = []
    config = {"max_new_tokens": 50, "stop_strings": ["</s>"], "coreweave_cfg": {"max_model_len": 4}}
    gen = _generation(config, requests)
    data = {"input_ids": torch.tensor([[5, 6, 7]]), "input_lengths": torch.tensor([3]), "stop_strings": [["END"]]}
    out = gen.generate(data, greedy=True)
    (request,) = requests
    assert request["temperature"] == 0.0
    assert request["max_tokens"] == 1  # max(1, min(50, 4 - 3))
    assert request["stop"] == ["</s>", "END"] and request["include_stop_str_in_output"] is True
    assert out["truncated"].tolist() == [True]


def test_config_keys_beat_variables_and_errors_name_the_key() -> None:
    config = {"coreweave_cfg": {"model": "from-config", "full_every": 5, "timeout": 30}}
    env = {
        **ENV,
        "CWTRAIN_ROLLOUT_MODEL": "from-env",
        "CWTRAIN_HOTLOAD_FULL_EVERY": "7",
        "CWTRAIN_HOTLOAD_TIMEOUT": "99",
    }
    settings = CoreWeaveConfig.from_generation_config(config, env)
    assert settings.rollout.model == "from-config" and settings.hotload.full_every == 5
    assert settings.hotload.timeout == 30.0  # the request timeout is also the hot-load budget
    assert settings.rollout.require_logprobs is True
    assert settings.hotload.run_id.startswith("nemo-rl-")
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.full_every"):
        CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"full_every": 65}}, ENV)
    with pytest.raises(ConfigError, match="unknown key"):
        CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"basu_url": "x"}}, ENV)
    with pytest.raises(ConfigError, match="importance_sampling needs temperature 1"):
        CoreWeaveConfig.from_generation_config(
            {"temperature": 0.6, "coreweave_cfg": {"importance_sampling": True}}, ENV
        )
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_FULL_EVERY='abc'"):
        CoreWeaveConfig.from_generation_config({}, {**ENV, "CWTRAIN_HOTLOAD_FULL_EVERY": "abc"})


def test_hotload_half_is_cores_settings_with_nemo_rls_keys_and_rules() -> None:
    """Core's HotLoadSettings (one run-id rule for every framework) under NeMo-RL's config keys."""
    from cwtrain.hotload import HotLoadSettings

    config = {"coreweave_cfg": {"run_id": "grpo-a", "prompt_cache_policy": "reset_all", "state_dir": "/tmp/s"}}
    settings = CoreWeaveConfig.from_generation_config(config, ENV).hotload
    assert isinstance(settings, HotLoadSettings)
    assert (settings.deployment_id, settings.run_id, settings.state_dir) == ("dep-1", "grpo-a", "/tmp/s")
    assert settings.prompt_cache_policy.name == "RESET_ALL" and settings.timeout == 1800.0
    unset = CoreWeaveConfig.from_generation_config({}, {k: v for k, v in ENV.items() if "DEPLOYMENT" not in k})
    assert unset.hotload.deployment_id == ""  # not required to read the config, only to publish
    # core's run-id rule: '.' and '..' are refused for NeMo-RL too, naming the key or the variable
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.run_id='\.\.' is not a usable run id"):
        CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"run_id": ".."}}, ENV)
    with pytest.raises(ConfigError, match=r"CWTRAIN_HOTLOAD_RUN_ID='\.' is not a usable run id"):
        CoreWeaveConfig.from_generation_config({}, {**ENV, "CWTRAIN_HOTLOAD_RUN_ID": "."})
    # NeMo-RL's own rules: the hot-load budget falls back to `timeout`; state_dir is absolute
    both = CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"timeout": 30, "hotload_timeout": 5}}, ENV)
    assert both.hotload.timeout == 5.0 and both.rollout.timeout == 30.0
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.hotload_timeout='0'"):
        CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"hotload_timeout": 0}}, ENV)
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.state_dir='rel' must be an absolute path"):
        CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"state_dir": "rel"}}, ENV)
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.prompt_cache_policy='bogus'"):
        CoreWeaveConfig.from_generation_config({"coreweave_cfg": {"prompt_cache_policy": "bogus"}}, ENV)


def test_refit_rebinding_routes_coreweave_to_the_synchronizer_only() -> None:
    import nemo_rl.algorithms.grpo as grpo

    from cwtrain.integrations.nemo_rl import install_refit
    from cwtrain.integrations.nemo_rl.refit import grpo_hooks, uninstall

    calls: list[tuple[object, object]] = []

    class Sync:
        def sync_weights(self, *, timer: object | None = None, kv_scales: Mapping[str, float] | None = None) -> None:
            calls.append((timer, kv_scales))

    coreweave = _generation({"max_new_tokens": 4}, [])
    coreweave.weight_synchronizer = Sync()
    without_synchronizer = _generation({"max_new_tokens": 4}, [])

    class VllmLike:
        pass

    grpo.CALLS.clear()
    original = grpo.refit_policy_generation
    wrapper = install_refit()
    try:
        assert install_refit() is wrapper  # idempotent
        assert grpo_hooks().originals == {"refit_policy_generation": original}
        timer = grpo.Timer()
        assert grpo.refit_policy_generation(None, coreweave, True, timer=timer) is None  # as NeMo-RL's returns
        grpo.grpo_train(None, coreweave)
        assert calls == [(timer, None), (None, None)] and grpo.CALLS == []
        grpo.grpo_train(None, VllmLike())
        grpo.grpo_train(None, without_synchronizer)
        assert grpo.CALLS == ["nemo-rl refit", "nemo-rl refit"]
    finally:
        uninstall()
    assert grpo.refit_policy_generation is original
    assert grpo_hooks().originals == {}


def test_worker_classes_are_ray_actors_of_nemo_rl_workers() -> None:
    import importlib

    from ray.actor import ActorClass

    import cwtrain.integrations.nemo_rl as nemo
    from cwtrain.integrations.nemo_rl.worker_mixin import HotLoadWorkerMixin

    module_name, _, attr = nemo.DTENSOR_WORKER_FQN.rpartition(".")
    worker = getattr(importlib.import_module(module_name), attr)
    assert isinstance(worker, ActorClass)  # a Ray remote class, as NeMo-RL's own workers
    impl = worker.__ray_metadata__.modified_class
    assert issubclass(impl, HotLoadWorkerMixin)
    assert "DTensorPolicyWorkerV2Impl" in [c.__name__ for c in impl.__mro__]
    env = nemo.worker_env({"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].endswith(":/x")
    assert any(Path(p, "cwtrain").is_dir() for p in env["PYTHONPATH"].split(":"))


def test_patch_helper_refuses_other_versions_and_detects_applied(tmp_path: Path) -> None:
    from cwtrain.integrations.nemo_rl.patch import apply_patch, patch_text

    assert 'backend == "coreweave"' in patch_text()
    with pytest.raises(CWTrainError, match=r"NeMo-RL 0\.6\.2 is installed"):
        apply_patch(tmp_path, installed="0.6.2")
    grpo = tmp_path / "nemo_rl" / "algorithms" / "grpo.py"
    grpo.parent.mkdir(parents=True)
    grpo.write_text("def setup():\n    pass\n")
    with pytest.raises(CWTrainError, match="does not apply"):
        apply_patch(tmp_path, installed="0.7.0")
    grpo.write_text('    elif backend == "coreweave":\n')
    assert apply_patch(tmp_path, installed="0.7.0") == "already applied"


def test_patch_helper_without_nemo_rl_does_not_ask_for_the_plugin_it_runs_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: the helper runs from the plug-in, so the fix is NeMo-RL's environment, not the plug-in."""
    import cwtrain.integrations.nemo_rl.patch as patch

    monkeypatch.setattr(patch, "installed_version", lambda framework: None)
    with pytest.raises(CWTrainError) as refused:
        patch.apply_patch(tmp_path)
    message = str(refused.value)
    assert message.startswith("NeMo-RL is not installed in this environment: the patch is for nemo_rl v0.7.0")
    assert "the NeMo-RL v0.7.0 image ships it" in message and "pip install" not in message


def test_generation_without_nemo_rl_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "nemo_rl.models.generation.interfaces", None)
    monkeypatch.delitem(sys.modules, "cwtrain.integrations.nemo_rl.generation", raising=False)
    with pytest.raises(ImportError, match=r"pip install \./packages/cwtrain-nemo-rl"):
        importlib.import_module("cwtrain.integrations.nemo_rl.generation")


def test_install_wraps_setup_for_coreweave_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import nemo_rl.algorithms.grpo as grpo
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    import cwtrain.integrations.nemo_rl as nemo
    from cwtrain.integrations.nemo_rl.metrics import RunLogger
    from cwtrain.integrations.nemo_rl.refit import uninstall
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

    for key, value in {**ENV, "COREWEAVE_API_TOKEN": "t0ken"}.items():
        monkeypatch.setenv(key, value)
    for name in (nemo.DTENSOR_WORKER_FQN, nemo.MEGATRON_WORKER_FQN):
        ACTOR_ENVIRONMENT_REGISTRY.pop(name, None)
    original_setup = grpo.setup
    hooks = nemo.install()
    try:
        assert nemo.install() is hooks  # idempotent
        assert nemo.DTENSOR_WORKER_FQN in ACTOR_ENVIRONMENT_REGISTRY
        config = {"policy": {"model_name": str(tmp_path), "generation": {"backend": "coreweave", "max_new_tokens": 4}}}
        result = grpo.setup(config, _Tok(), None, None)
        policy, generation, logger = result[0], result[1], result[7]
        assert len(result) == 13
        assert policy.kwargs == {"worker_extension_cls_fqn": nemo.DTENSOR_WORKER_FQN}
        sync = generation.weight_synchronizer
        assert isinstance(sync, HotLoadWeightSynchronizer)
        assert sync.hf_checkpoint == tmp_path
        assert isinstance(logger, RunLogger) and sync.metrics_sink == logger.record
        other = {"policy": {"model_name": "m", "generation": {"backend": "vllm"}}}
        plain = grpo.setup(other, _Tok(), None, None)
        assert plain[:2] == ("default policy", None) and not isinstance(plain[7], RunLogger)
        gym = {**config, "env": {"should_use_nemo_gym": True}}
        with pytest.raises(ConfigError, match=r"coreweave_cfg\.max_model_len"):
            grpo.setup(gym, _Tok(), None, None)
    finally:
        uninstall()
    assert grpo.setup is original_setup


def test_setup_wrapper_reads_nemo_rls_master_config_object(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """v0.7.0 hands setup a MasterConfig model (attributes, not keys); inherited vLLM settings that make
    grpo_train parse the generation's metrics as vLLM's are turned off for coreweave."""
    import nemo_rl.algorithms.grpo as grpo

    from cwtrain.integrations.nemo_rl.metrics import RunLogger
    from cwtrain.integrations.nemo_rl.refit import grpo_hooks

    for key, value in {**ENV, "COREWEAVE_API_TOKEN": "t0ken"}.items():
        monkeypatch.setenv(key, value)

    class MasterConfig:  # attribute access only, as NeMo-RL's
        def __init__(self, **sections: Any) -> None:
            self.__dict__.update(sections)

        def __getitem__(self, key: str) -> Any:
            raise TypeError("'MasterConfig' object is not subscriptable")

    generation = {
        "backend": "coreweave",
        "max_new_tokens": 4,
        "vllm_cfg": {"async_engine": True, "enable_vllm_metrics_logger": True, "max_model_len": 16},
    }
    config = MasterConfig(policy={"model_name": str(tmp_path), "generation": generation}, env={})
    standin = grpo.setup

    def setup_taking_a_master_config(master_config: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> Any:
        return standin({"policy": master_config.policy}, tokenizer, *args, **kwargs)

    monkeypatch.setattr(grpo, "setup", setup_taking_a_master_config)
    wrapper = grpo_hooks().install_setup("cwtrain.integrations.nemo_rl.worker.CoreWeaveDTensorPolicyWorker")
    try:
        result = wrapper(config, _Tok(), None, None)
        assert isinstance(result[7], RunLogger)
        assert generation["vllm_cfg"]["enable_vllm_metrics_logger"] is False
        assert generation["vllm_cfg"]["async_engine"] is True  # everything else as it was
        gym = MasterConfig(policy=config.policy, env={"should_use_nemo_gym": True})
        with pytest.raises(ConfigError, match="max_model_len"):
            wrapper(gym, _Tok(), None, None)
    finally:
        grpo_hooks().uninstall()


def test_the_gym_endpoints_sampler_learns_the_versions_published_and_burned_before_and_after_it_starts() -> None:
    gen = _generation({"max_new_tokens": 4, "coreweave_cfg": {"run_id": "run"}}, [])
    gen.note_published(3)
    gen.note_burned(4)
    try:
        gym = gen.gym_model_server().model.sampler  # its own sampler, started after those notes
        assert (gym.run_id, gym.published_version, gym.burned_versions) == ("run", 3, {4})
        gen.note_burned(5)
        gen.note_published(6)
        assert (gym.published_version, gym.burned_versions) == (6, {4, 5})
    finally:
        assert gen.shutdown() is True


def test_rows_carry_the_version_that_served_them_and_metrics_sum_every_bucket() -> None:
    """``weight_version`` per row (this run's only); the generate's counters cover all its requests."""
    requests: list[dict[str, Any]] = []
    config = {"max_new_tokens": 4, "stop_strings": [], "coreweave_cfg": {"run_id": "run"}}
    gen = _generation(config, requests)
    assert gen.sampler.run_id == "run"  # the sampler samples for the run the synchronizer publishes
    gen.note_published(3)
    assert gen.sampler.published_version == 3
    gen.note_burned(4)  # the synchronizer's hot-load of v4 failed: never sampled from
    assert gen.sampler.burned_versions == {4} and gen.sampler.published_version == 3
    data = {
        "input_ids": torch.tensor([[5, 6], [5, 6], [8, 0]]),
        "input_lengths": torch.tensor([2, 2, 1]),
        "stop_strings": [None, None, ["END"]],  # two buckets: different stop strings
    }
    out = gen.generate(data)
    assert len(requests) == 2
    assert out["weight_version"].tolist() == [3, 3, 3] and out["weight_version"].dtype == torch.long
    metrics = gen.get_logger_metrics()
    assert metrics["coreweave/served_version_samples/3"] == 3.0  # both buckets, not the last one's
    assert metrics["coreweave/staleness_max"] == 0.0 and metrics["coreweave/samples_without_version"] == 0.0
    other = _generation({"max_new_tokens": 4, "coreweave_cfg": {"run_id": "another"}}, [])
    row = other.generate({"input_ids": torch.tensor([[5, 6]]), "input_lengths": torch.tensor([2])})
    assert row["weight_version"].tolist() == [-1]  # run-v000003 is no version of run "another"
    assert other.get_logger_metrics()["coreweave/samples_without_version"] == 1.0


def test_the_documented_keys_are_the_known_keys_with_their_variables() -> None:
    """docs/nemo-rl.md holds the one table of coreweave_cfg keys: every key, each with its variable."""
    from cwtrain.integrations.nemo_rl import config as module

    text = (Path(__file__).resolve().parents[2] / "docs" / "nemo-rl.md").read_text(encoding="utf-8")
    table = text[text.index("| key | variable | default |") :].split("\n\n", 1)[0].splitlines()[2:]
    variables = {**module._ROLLOUT_VARS, **module._HOTLOAD_VARS}
    documented: dict[str, str | None] = {}
    for row in table:
        keys_cell, vars_cell = (cell.strip() for cell in row.strip("|").split("|")[:2])
        keys = [k.strip(" `") for k in keys_cell.split(",")]
        names = [v.strip(" `") for v in vars_cell.split(",")] if vars_cell != "–" else []
        prefix = "_".join(names[0].split("_")[:2]) if names else ""  # CWTRAIN_ROLLOUT, CWTRAIN_HOTLOAD
        if names and names[0].endswith("…"):  # `CWTRAIN_ROLLOUT_…`: the key's own name, upper-cased
            names = [f"{prefix}_{k.upper()}" for k in keys]
        names = [prefix + n if n.startswith("_") else n for n in names]
        assert not names or len(names) == len(keys), row
        for i, key in enumerate(keys):
            documented[key] = names[i] if names else None
    assert set(documented) == set(module.KNOWN_KEYS)
    for key, variable in documented.items():
        assert variables.get(key) == variable, key

"""cwtrain-gym and its model_server against the REAL NeMo Gym (``CWTRAIN_GYM_VENV``; skipped without it).

Gym runs from its own environment, through its command line, as cwtrain drives it; its
servers run in that environment too (``uv_venv_dir`` links, no package index needed).
Run with ``scripts/contracts-nemo.sh`` (once per Gym version). Gym's data downloads are
replaced by three AIME-shaped rows (no network); nothing else is.

* the NeMo Gym recipe's evaluation: ``gym eval prepare --benchmark aime24`` writes the file the
  recipe evaluates, whose rows need the prompt config the recipe passes;
* the default collector drives real Gym with the recipe's settings: Gym's stdout ends up on
  stderr, scores are read, the endpoint is sampled with the deployment's model and key;
* Gym's stock ``vllm_model`` for training talks to cwtrain's model_server unchanged and gets the
  deployment's exact token ids and log-probs;
* ``cwtrain gym eval`` end to end, and Gym's stock ``vllm_model`` configs unchanged against the
  local stack, need the local stack's ``/v1/chat/completions`` (skipped until it serves it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from nemo_support import (
    GYM_ENV_ROOT,
    ROOT,
    gym_install_root,
    gym_server_venvs,
    gym_venv,
    gym_version,
    local_chat_served,
    write_tiny_tokenizer,
)

from cwtrain.integrations.gym.collect import CollectionJob, GymCLICollector, GymEndpoint
from cwtrain.integrations.gym.scores import read_scores

RECIPE = ROOT / "recipes" / "nemo-gym"
AIME_ROWS = [{"problem": f"What is {i} + {i}?", "answer": 2 * i} for i in range(1, 4)]


def recipe_settings() -> dict[str, str]:
    """The evaluation settings of the NeMo Gym recipe's ConfigMap (``config.yaml``)."""
    return dict(yaml.safe_load((RECIPE / "config.yaml").read_text(encoding="utf-8"))["data"])


@dataclass
class Gym:
    """A real Gym: its environment, version, install root, and a working root with the recipe's benchmark."""

    venv: Path
    version: str
    install_root: Path
    root: Path
    servers: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "NEMO_GYM_EXTRA_ROOTS": str(GYM_ENV_ROOT),
        }


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Gym:
    venv = gym_venv()
    install = gym_install_root(venv)
    root = tmp_path_factory.mktemp("gym-root")
    # a working root laid out like Gym's install root (the recipe runs Gym from there), holding the
    # benchmark; the rest (server configs) Gym finds in its install root
    for part in ("benchmarks/aime24", "benchmarks/prompts"):
        shutil.copytree(install / part, root / part, ignore=shutil.ignore_patterns("data", "__pycache__"))
    servers = gym_server_venvs(
        tmp_path_factory.mktemp("gym-venvs"),
        venv,
        [
            "resources_servers/math_with_judge",
            "resources_servers/cwtrain_digits",
            "responses_api_agents/simple_agent",
            "responses_api_models/vllm_model",
            "environment_servers/legacy_agent",
        ],
    )
    return Gym(venv, gym_version(venv), install, root, servers)


def gym_cli(gym: Gym, *args: str) -> subprocess.CompletedProcess[str]:
    """``gym ARGS`` in the working root, with Hugging Face's ``load_dataset`` replaced by AIME-shaped rows."""
    code = f"""
        import sys, datasets
        datasets.load_dataset = lambda repo, *a, **k: {AIME_ROWS!r}
        from nemo_gym.cli.main import main
        sys.argv = ["gym", *{list(args)!r}]
        sys.exit(main())
        """
    return subprocess.run(
        [str(gym.venv / "bin" / "python"), "-c", textwrap.dedent(code)],
        cwd=gym.root, env=gym.env(), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def settings_file(gym: Gym, path: Path, config_paths: list[str], **extra: Any) -> Path:
    """A Gym config chaining ``config_paths``, with its servers run in the linked environments."""
    body = {"config_paths": config_paths, "uv_venv_dir": str(gym.servers), "skip_venv_if_present": True, **extra}
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


def test_aime24_prepare_writes_what_the_recipe_evaluates(gym: Gym) -> None:
    settings = recipe_settings()
    done = gym_cli(gym, "eval", "prepare", "--benchmark", settings["GYM_BENCHMARK"])
    assert done.returncode == 0, done.stdout + done.stderr
    prepared = gym.root / settings["GYM_INPUT"]
    assert prepared.is_file(), f"gym eval prepare wrote no {settings['GYM_INPUT']}:\n{done.stdout}"
    rows = [json.loads(line) for line in prepared.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == {"question": "What is 1 + 1?", "expected_answer": "2"}  # fields only: a prompt config is needed
    assert (gym.install_root / settings["GYM_PROMPT_CONFIG"]).is_file()
    assert (gym.install_root / settings["GYM_CONFIG"]).is_file()


@dataclass
class Served:
    """cwtrain's model_server endpoint, serving a local deployment (and the local stack around it)."""

    base_url: str
    model: str
    deployment_base_url: str
    token: str
    endpoint: Any
    api_url: str
    bucket: str
    gateway_id: str
    server_token: str  # the model server's bearer token: Gym's api_key for it


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A local deployment of the tiny model behind cwtrain's model_server endpoint (rendering chats
    with a HuggingFace tokenizer of the tiny model)."""
    from transformers import AutoTokenizer

    from cwtrain.integrations.gym import ChatRenderer, GymModel, GymModelServer
    from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig
    from cwtrain.local import LocalStack

    hf = tmp_path_factory.mktemp("hf")
    write_tiny_tokenizer(hf)
    with LocalStack(replicas=1) as stack:
        target = stack.deploy(seed=0)
        config = RolloutConfig.from_env(
            {"CWTRAIN_ROLLOUT_BASE_URL": target.base_url, "CWTRAIN_ROLLOUT_MODEL": target.model,
             "CWTRAIN_ROLLOUT_API_KEY": stack.token, "CWTRAIN_ROLLOUT_TIMEOUT": "120"}
        )  # fmt: skip
        model = GymModel(
            CompletionSampler(config),
            ChatRenderer(AutoTokenizer.from_pretrained(hf)),
            max_model_len=200,
            salt=lambda: "gym-contract",  # what the synchronizer's served identity is in a run
        )
        with GymModelServer(model, advertise="127.0.0.1") as server:
            yield Served(
                server.base_url, target.model, target.base_url, stack.token, model, stack.api_url, stack.bucket,
                target.gateway_id, server.token,
            )  # fmt: skip
        model.sampler.close()


def collect(gym: Gym, job: CollectionJob, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in gym.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(gym.root)
    job.output_path.parent.mkdir(parents=True, exist_ok=True)
    job.workdir.mkdir(parents=True, exist_ok=True)
    return GymCLICollector(server_timeout=600)(job)


@pytest.mark.slow
def test_collector_runs_real_gym_with_the_recipes_evaluation(
    gym: Gym, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = recipe_settings()
    prepared = gym.root / settings["GYM_INPUT"]
    if not prepared.is_file():
        assert gym_cli(gym, "eval", "prepare", "--benchmark", settings["GYM_BENCHMARK"]).returncode == 0
    # the recipe's config, wrapped only to run Gym's servers in the linked environments
    config = settings_file(gym, tmp_path / "gym.yaml", [settings["GYM_CONFIG"]])
    job = CollectionJob(
        endpoint=GymEndpoint(served.base_url, served.model, served.server_token, token_ids=False),
        config_paths=(config,),
        input_path=prepared,
        output_path=tmp_path / "results" / "rollouts.jsonl",
        workdir=tmp_path / "work",
        agent=settings["GYM_AGENT"],
        num_repeats=2,
        concurrency=4,
        prompt_config=gym.install_root / settings["GYM_PROMPT_CONFIG"],
    )
    capfd.readouterr()
    result = collect(gym, job, monkeypatch)
    out, err = capfd.readouterr()
    assert out == "", out[-2000:]  # Gym prints progress and metric blocks on its stdout: they went to stderr
    assert "Finished rollout collection!" in err
    scores = read_scores(result.output_path, result.aggregate_metrics_path)
    assert scores.rollouts == scores.scored == 2 * len(AIME_ROWS)
    assert set(scores.by_agent) == {settings["GYM_AGENT"]}
    assert isinstance(scores.aggregate_metrics, list)
    rows = [json.loads(line) for line in result.output_path.read_text(encoding="utf-8").splitlines()]
    assert all("Solve the following math problem" in json.dumps(r["responses_create_params"]) for r in rows)


@pytest.mark.slow
def test_stock_training_model_server_gets_exact_ids_from_gym_model(
    gym: Gym, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from cwtrain.local.engine.model import init_weights, token_logprobs

    config = settings_file(
        gym,
        tmp_path / "gym.yaml",
        [
            "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",  # Gym's own, unchanged
            "resources_servers/cwtrain_digits/configs/cwtrain_digits.yaml",
        ],
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": [{"role": "user", "content": f"digits {i}"}]},
                        "agent_ref": {"name": "cwtrain_digits_simple_agent"}}) + "\n"
            for i in range(3)
        ),
        encoding="utf-8",
    )  # fmt: skip
    served.endpoint.clear_metrics()
    # NeMo-RL's NemoGym actor gives Gym a dummy key: model_server uses the deployment's own
    job = CollectionJob(
        endpoint=GymEndpoint(served.base_url, served.model, served.server_token, token_ids=True),
        config_paths=(config,),
        input_path=rows,
        output_path=tmp_path / "results" / "rollouts.jsonl",
        workdir=tmp_path / "work",
        num_repeats=2,
        concurrency=4,
    )
    result = collect(gym, job, monkeypatch)
    outputs = [json.loads(line)["response"]["output"] for line in result.output_path.read_text().splitlines()]
    assert len(outputs) == 6
    weights = init_weights(seed=0)
    for output in outputs:
        (message,) = [item for item in output if "generation_token_ids" in item]
        served_lp = torch.tensor(message["generation_log_probs"])
        mine = torch.tensor(token_logprobs(weights, message["prompt_token_ids"], message["generation_token_ids"]))
        assert torch.allclose(served_lp, mine, atol=1e-3)
    metrics = served.endpoint.metrics()
    assert metrics["coreweave/gym_requests"] == 6.0 and metrics["coreweave/gym_refused"] == 0.0
    assert len(served.endpoint.identities) == 1  # every sample names the identity that served it


@pytest.mark.slow
@pytest.mark.parametrize("model_config", ["vllm_model.yaml", "vllm_model_for_training.yaml"])
def test_stock_model_server_configs_work_against_the_local_stack(
    gym: Gym, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_config: str
) -> None:
    """Gym's own model server configs, pointed at the local deployment itself (no model_server)."""
    if not local_chat_served(served.deployment_base_url, served.model, served.token):
        pytest.skip("the local stack does not serve /v1/chat/completions (and /tokenize) yet: see issue 19")
    config = settings_file(
        gym,
        tmp_path / "gym.yaml",
        [f"responses_api_models/vllm_model/configs/{model_config}", "resources_servers/cwtrain_digits/configs/cwtrain_digits.yaml"],
    )  # fmt: skip
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"responses_create_params": {"input": [{"role": "user", "content": "digits"}]},
                    "agent_ref": {"name": "cwtrain_digits_simple_agent"}}) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    training = model_config.endswith("_for_training.yaml")
    job = CollectionJob(
        endpoint=GymEndpoint(served.deployment_base_url, served.model, served.token, token_ids=training),
        config_paths=(config,),
        input_path=rows,
        output_path=tmp_path / "results" / "rollouts.jsonl",
        workdir=tmp_path / "work",
        num_repeats=2,
    )
    result = collect(gym, job, monkeypatch)
    scores = read_scores(result.output_path)
    assert scores.rollouts == scores.scored == 2
    if training:
        for line in result.output_path.read_text().splitlines():
            output = json.loads(line)["response"]["output"]
            assert any(item.get("generation_token_ids") for item in output)


@pytest.mark.slow
@pytest.mark.e2e
def test_cwtrain_gym_eval_with_real_gym_on_the_local_stack(
    gym: Gym, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The recipe's command, `cwtrain gym eval`, creating and deleting a local deployment; stdout is one JSON document."""
    if not local_chat_served(served.deployment_base_url, served.model, served.token):
        pytest.skip(
            "the local stack does not serve /v1/chat/completions yet (Gym's stock model server needs it): issue 19"
        )
    from cwtrain.cli import main as cwtrain_main

    settings = recipe_settings()
    prepared = gym.root / settings["GYM_INPUT"]
    if not prepared.is_file():
        assert gym_cli(gym, "eval", "prepare", "--benchmark", settings["GYM_BENCHMARK"]).returncode == 0
    text = (RECIPE / "deployment.example.json").read_text(encoding="utf-8")
    for placeholder, value in {"<gateway-id>": served.gateway_id, "<dynamo-vllm-version>": "1.2.3",
                               "<bucket>": served.bucket, "<base-model-path>": "base/tiny"}.items():  # fmt: skip
        text = text.replace(placeholder, value)
    request = json.loads(text)
    request["name"] = "gym-contract-eval"
    request["autoscaling"] = {**request["autoscaling"], "min": 1, "max": 1}
    request_file = tmp_path / "deployment.json"
    request_file.write_text(json.dumps(request), encoding="utf-8")
    config = settings_file(gym, tmp_path / "gym.yaml", [settings["GYM_CONFIG"]])
    for key, value in gym.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CWTRAIN_ROLLOUT_API_KEY", served.token)
    monkeypatch.chdir(gym.root)
    capfd.readouterr()
    code = cwtrain_main(
        [
            "--base-url", served.api_url, "--token", served.token,
            "gym", "eval", "--request", str(request_file), "--config", str(config), "--input", settings["GYM_INPUT"],
            "--prompt-config", settings["GYM_PROMPT_CONFIG"], "--agent", settings["GYM_AGENT"],
            "--output", str(tmp_path / "results" / "rollouts.jsonl"), "--num-repeats", "1",
            "--timeout", "300", "--poll-interval", "0.5",
        ]
    )  # fmt: skip
    out, _ = capfd.readouterr()
    assert code == 0
    document = json.loads(out)  # one JSON document, nothing else
    assert document["deployment"]["deleted"] is True
    assert document["scores"]["rollouts"] == len(AIME_ROWS)

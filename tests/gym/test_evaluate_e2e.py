"""The gym evaluation end to end against ``cwtrain-local``: the NeMo Gym recipe's example
request, filled in, becomes a real temporary deployment; a stand-in for Gym's collection
step samples from its endpoint over HTTP; the deployment is gone afterwards, after
success, failure and Ctrl-C alike (``keep`` leaves it).

The scenarios of :func:`test_evaluate_cleans_up_in_every_case` run in parallel threads so
the deployments come up together.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gym_support import FakeGym, write_rows

from cwtrain.cli import main as cwtrain_main
from cwtrain.errors import CWTrainError, NotFoundError, UsageError
from cwtrain.infra import InferenceClient, ResourceStatus, lifecycle
from cwtrain.integrations.gym import CollectionJob, CollectionResult, evaluate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "recipes" / "nemo-gym" / "deployment.example.json"


@dataclass(frozen=True)
class GymStack:
    """The module's local stack as the tests use it, with the gateway every evaluation attaches to."""

    api_url: str
    token: str
    bucket: str
    gateway_id: str


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[GymStack]:
    from cwtrain.local.stack import gateway_request

    with shared_stack.view("gym-evaluate", replicas=1) as local:
        local.seed_base_model("base/tiny")
        with InferenceClient(local.token, base_url=local.api_url) as api:
            gateway = lifecycle.create_gateway(api, gateway_request("gym-gateway", local.region))
            lifecycle.wait_for_gateway(api, gateway.id, timeout=60, poll_interval=0.1)
        yield GymStack(local.api_url, local.token, local.bucket, gateway.id)


def request(stack: GymStack, name: str) -> dict[str, Any]:
    """The recipe's example request with its placeholders filled for the local stack."""
    text = EXAMPLE.read_text(encoding="utf-8")
    for placeholder, value in {
        "<gateway-id>": stack.gateway_id,
        "<dynamo-vllm-version>": "1.2.3",
        "<bucket>": stack.bucket,
        "<base-model-path>": "base/tiny",
    }.items():
        text = text.replace(placeholder, value)
    body = json.loads(text)
    body["name"] = name
    body["model"]["name"] = f"{name}-model"
    body["autoscaling"] = {**body["autoscaling"], "min": 1, "max": 1}
    return body  # type: ignore[no-any-return]


def gym_files(tmp_path: Path, rewards: list[float]) -> tuple[Path, Path]:
    config = tmp_path / "env.yaml"
    config.write_text(yaml.safe_dump({"math_agent": {"responses_api_agents": {"simple_agent": {}}}}), encoding="utf-8")
    return config, write_rows(tmp_path / "rows.jsonl", rewards)


def sampling_collector(seen: list[CollectionJob], fail_with: BaseException | None = None) -> Callable[..., Any]:
    """A stand-in for Gym's collection step: one real completion per row through the gateway."""

    def collect(job: CollectionJob) -> CollectionResult:
        seen.append(job)
        headers = {"Authorization": f"Bearer {job.endpoint.api_key}"}
        rows = [json.loads(line) for line in job.input_path.read_text(encoding="utf-8").splitlines()]
        results = []
        for row in rows:
            prompt = row["responses_create_params"]["input"][-1]["content"]
            body = {"model": job.endpoint.model, "prompt": prompt, "max_tokens": 4, "temperature": 1.0}
            response = httpx.post(f"{job.endpoint.base_url}/completions", json=body, headers=headers, timeout=60)
            response.raise_for_status()
            text = response.json()["choices"][0]["text"]
            results.append({"reward": row["fake_reward"], "agent_ref": row["agent_ref"], "response": text})
        if fail_with is not None:
            raise fail_with
        job.output_path.write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
        return CollectionResult(job.output_path)

    return collect


def gone(api: InferenceClient, deployment_id: str) -> bool:
    try:
        api.get_deployment(deployment_id)
    except NotFoundError:
        return True
    return False


def test_evaluate_cleans_up_in_every_case(stack: GymStack, tmp_path: Path) -> None:
    config, rows = gym_files(tmp_path, [1.0, 0.0, 0.5])
    outcomes: dict[str, Any] = {}
    jobs: dict[str, list[CollectionJob]] = {}

    def run(name: str, fail_with: BaseException | None = None, keep: bool = False) -> None:
        jobs[name] = []
        try:
            with InferenceClient(stack.token, base_url=stack.api_url) as api:
                outcomes[name] = evaluate(
                    api,
                    request(stack, f"gym-{name}"),
                    config_paths=[config],
                    input_path=rows,
                    output_path=tmp_path / name / "rollouts.jsonl",
                    api_key=stack.token,
                    keep=keep,
                    ready_timeout=180,
                    delete_timeout=60,
                    poll_interval=0.2,
                    collector=sampling_collector(jobs[name], fail_with),
                )
        except BaseException as exc:  # the thread reports what evaluate raised
            outcomes[name] = exc

    threads = [
        threading.Thread(target=run, args=("ok",)),
        threading.Thread(target=run, args=("fails", CWTrainError("the verifier crashed"))),
        threading.Thread(target=run, args=("interrupted", KeyboardInterrupt())),
        threading.Thread(target=run, args=("kept",), kwargs={"keep": True}),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=400)
    assert not any(t.is_alive() for t in threads)

    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        # success: scores from the rollouts, endpoint and model of the temporary deployment
        ok = outcomes["ok"]
        assert not isinstance(ok, BaseException), ok
        assert ok.scores.rollouts == 3 and ok.scores.scored == 3
        assert ok.scores.mean_reward == pytest.approx(0.5)
        assert ok.scores.by_agent["math_agent"].rollouts == 3
        assert ok.model == "gym-ok-model"
        assert ok.rollout_base_url.endswith("/v1")
        assert ok.output_path.read_text(encoding="utf-8").count("\n") == 3
        assert ok.deployment_deleted and gone(api, ok.deployment_id)
        (job,) = jobs["ok"]
        assert job.endpoint.base_url == ok.rollout_base_url and job.endpoint.model == ok.model
        assert job.endpoint.api_key == stack.token

        # failure and Ctrl-C: the error reaches the caller, the deployment is gone anyway
        assert isinstance(outcomes["fails"], CWTrainError) and "verifier crashed" in str(outcomes["fails"])
        assert isinstance(outcomes["interrupted"], KeyboardInterrupt)
        for name in ("fails", "interrupted"):
            (job,) = jobs[name]  # the collection step ran against a READY deployment
            names = [d.name for d in api.list_deployments()]
            assert f"gym-{name}" not in names, f"{name}: the temporary deployment is still there"

        # keep: still READY afterwards, and an evaluation naming it by id is refused
        kept = outcomes["kept"]
        assert not isinstance(kept, BaseException), kept
        assert not kept.deployment_deleted
        assert api.get_deployment(kept.deployment_id).status is ResourceStatus.READY
        body = {**request(stack, "gym-reuse"), "id": kept.deployment_id}
        with pytest.raises(CWTrainError, match="already exists"):
            evaluate(
                api,
                body,
                config_paths=[config],
                input_path=rows,
                output_path=tmp_path / "reuse.jsonl",
                api_key=stack.token,
                collector=sampling_collector([]),
            )
        assert api.get_deployment(kept.deployment_id).status is ResourceStatus.READY  # untouched
        assert lifecycle.delete_deployment(api, kept.deployment_id, timeout=60, poll_interval=0.2)


def test_bad_input_is_refused_before_anything_is_created(stack: GymStack, tmp_path: Path) -> None:
    config, rows = gym_files(tmp_path, [1.0])
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        before = {d.id for d in api.list_deployments()}
        unfilled = json.loads(EXAMPLE.read_text(encoding="utf-8"))
        with pytest.raises(UsageError, match="still has placeholders"):
            evaluate(
                api, unfilled, config_paths=[config], input_path=rows, output_path=tmp_path / "o.jsonl", api_key="k"
            )
        with pytest.raises(CWTrainError, match="does not exist"):
            evaluate(
                api,
                request(stack, "gym-noinput"),
                config_paths=[config],
                input_path=tmp_path / "absent.jsonl",
                output_path=tmp_path / "o.jsonl",
                api_key="k",
            )
        assert {d.id for d in api.list_deployments()} == before


def start_interrupted_cli(
    stack: GymStack, tmp_path: Path, fake_gym: FakeGym, config: Path, rows: Path
) -> tuple[Any, Path]:
    """`cwtrain gym eval` in a child process whose collection waits long enough to be stopped."""
    request_file = tmp_path / "sigterm.json"
    request_file.write_text(json.dumps(request(stack, "gym-sigterm")), encoding="utf-8")
    state = tmp_path / "sigterm-gym-state.json"
    env = {
        **os.environ,
        "FAKE_GYM_STATE": str(state),
        "FAKE_GYM_LOG": str(tmp_path / "sigterm-gym-calls.jsonl"),
        "FAKE_GYM_EVAL_SLEEP": "120",
    }
    env.pop("COREWEAVE_API_TOKEN", None)
    argv = [
        str(Path(sys.executable).parent / "cwtrain"), "--base-url", stack.api_url, "--token", stack.token,
        "gym", "eval", "--request", str(request_file), "--config", str(config), "--input", str(rows),
        "--output", str(tmp_path / "sigterm" / "rollouts.jsonl"), "--agent", "math_agent",
        "--timeout", "180", "--delete-timeout", "60", "--poll-interval", "0.2",
    ]  # fmt: skip
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return child, tmp_path / "sigterm-gym-calls.jsonl"


def test_cli_gym_eval_with_a_stand_in_gym(
    stack: GymStack,
    tmp_path: Path,
    fake_gym: FakeGym,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """`cwtrain gym eval` end to end: the default collector drives the stand-in `gym` CLI, whose
    progress lines (on its stdout, as real Gym's) end up on stderr: stdout is one JSON document.

    Alongside, a second `cwtrain gym eval` in a child process gets SIGTERM (what Kubernetes
    sends to a Job's pod) during the collection: it exits 143 (as Ctrl-C, with 128 + 15) and its deployment is gone.
    """
    config, rows = gym_files(tmp_path, [1.0, 0.0])
    monkeypatch.delenv("CWTRAIN_ROLLOUT_API_KEY", raising=False)
    monkeypatch.delenv("COREWEAVE_API_TOKEN", raising=False)
    child, child_calls = start_interrupted_cli(stack, tmp_path, fake_gym, config, rows)
    try:
        request_file = tmp_path / "deployment.json"
        request_file.write_text(json.dumps(request(stack, "gym-cli")), encoding="utf-8")
        argv = [
            "--base-url", stack.api_url, "--token", stack.token,
            "gym", "eval", "--request", str(request_file), "--config", str(config),
            "--input", str(rows), "--output", str(tmp_path / "out" / "rollouts.jsonl"),
            "--agent", "math_agent", "--num-repeats", "2", "--timeout", "180", "--delete-timeout", "60",
            "--poll-interval", "0.2",
        ]  # fmt: skip
        capfd.readouterr()
        code = cwtrain_main(argv)
        out, err = capfd.readouterr()
        assert code == 0
        result = json.loads(out)  # one JSON document, nothing else
        assert "Finished rollout collection!" in err and "Finished rollout collection!" not in out
        assert result["deployment"]["deleted"] is True
        assert result["model"] == "gym-cli-model"
        assert result["scores"]["rollouts"] == 4
        assert result["scores"]["mean_reward"] == pytest.approx(0.5)
        assert result["aggregate_metrics"].endswith("rollouts_aggregate_metrics.json")
        assert result["scores"]["aggregate_metrics"][0]["agent_metrics"]["rollouts"] == 4
        state = fake_gym.state()
        assert state["base_url"] == result["rollout_base_url"] and state["api_key"] == stack.token
        assert state["stopped"] is True
        assert all(stack.token not in " ".join(call) for call in fake_gym.calls())

        # the child: wait until its collection runs, then stop it as Kubernetes would
        deadline = time.monotonic() + 240
        while not (child_calls.exists() and '"eval"' in child_calls.read_text(encoding="utf-8")):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child's collection never started"
            time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 143, err
    assert err.rstrip().endswith("error: terminated (SIGTERM)")
    assert out == ""  # no result document for an interrupted evaluation
    assert json.loads((tmp_path / "sigterm-gym-state.json").read_text(encoding="utf-8"))["stopped"] is True
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        assert gone(api, result["deployment"]["id"])
        assert "gym-sigterm" not in [d.name for d in api.list_deployments()]

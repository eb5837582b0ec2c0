"""cwtrain's model_server endpoint: what NeMo Gym's model server sends it, what the deployment
receives, what comes back (against a recording deployment; the local stack below; real Gym in
tests/contracts/test_gym_real.py)."""

from __future__ import annotations

import json
import pickle
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from model_server_support import RecordingEndpoint, TurnTokenizer

from cwtrain.errors import RolloutError
from cwtrain.integrations.gym.model_server import (
    MAX_BODY_BYTES,
    ChatRenderer,
    GymModel,
    GymModelError,
    GymModelServer,
    bind_address,
)
from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig

NEMO_RL_STANDIN = Path(__file__).resolve().parents[1] / "nemo_rl" / "standin"
DEPLOYMENT = {
    "CWTRAIN_ROLLOUT_BASE_URL": "https://deployment.example/v1",
    "CWTRAIN_ROLLOUT_MODEL": "served-model",
    "CWTRAIN_ROLLOUT_API_KEY": "deployment-key",
}


def gym_model(endpoint: RecordingEndpoint, *, max_model_len: int | None = 40, salt: str | None = "run-v000004",
              tokenizer: TurnTokenizer | None = None, run_id: str | None = "run") -> GymModel:  # fmt: skip
    config = RolloutConfig.from_env(DEPLOYMENT, max_attempts=1)

    def served() -> str:
        if salt is None:
            raise RolloutError("no served snapshot identity")
        return salt

    sampler = CompletionSampler(config, transport=endpoint.transport(), run_id=run_id)
    return GymModel(sampler, ChatRenderer(tokenizer or TurnTokenizer()), max_model_len=max_model_len, salt=served)


def first_turn(**extra: Any) -> dict[str, Any]:
    # what Gym's vllm_model sends for return_token_id_information: true (NeMo-RL's actor: its model and key)
    return {
        "model": "/shared/hf/base",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 8,
        "temperature": 0.7,
        "top_p": 1.0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
        **extra,
    }


def test_a_chat_becomes_one_token_id_completion_on_the_deployment() -> None:
    endpoint = RecordingEndpoint()
    model = gym_model(endpoint)
    tok = TurnTokenizer()
    answer, identity = model.chat(first_turn())
    (sent,) = endpoint.requests
    prompt = tok.encode("u:hi|a:")
    assert sent["model"] == "served-model"  # the deployment's name, not the checkpoint path Gym sends
    assert endpoint.headers[0]["authorization"] == "Bearer deployment-key"
    assert sent["prompt"] == prompt and sent["n"] == 1
    assert sent["max_tokens"] == 8 and sent["temperature"] == 0.7
    assert sent["nvext"] == {"cache_salt": "run-v000004"}
    assert identity == "run-v000004"
    assert answer["model"] == "served-model" and answer["system_fingerprint"] == "run-v000004"
    (choice,) = answer["choices"]
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] == "uva"
    assert message["prompt_token_ids"] == prompt
    assert message["generation_token_ids"] == [20, 21, 0]
    assert message["generation_log_probs"] == [-0.25] * 3
    assert choice["finish_reason"] == "stop"
    assert [c["token"] for c in choice["logprobs"]["content"]] == ["token_id:20", "token_id:21", "token_id:0"]
    assert answer["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 3, "total_tokens": len(prompt) + 3}
    assert model.tokenize({"model": "x", "messages": first_turn()["messages"]})["tokens"] == prompt


def test_earlier_turns_keep_their_exact_ids_when_the_template_renders_them_differently() -> None:
    endpoint = RecordingEndpoint()
    tok = TurnTokenizer(drop_thinking=True)
    model = gym_model(endpoint, tokenizer=tok, max_model_len=200)
    first_prompt = tok.encode("u:hi|a:")
    generated = [*tok.encode("<think>hm</think>ok"), 0]  # what the model produced, thinking included
    second = first_turn(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>hm</think>ok", "prompt_token_ids": first_prompt,
             "generation_token_ids": generated, "generation_log_probs": [-0.1] * len(generated)},
            {"role": "user", "content": "more"},
        ]
    )  # fmt: skip
    answer, _ = model.chat(second)
    sent = endpoint.requests[0]["prompt"]
    # the exact ids of turn one (with its thinking), then what the template adds after that turn's EOS
    assert sent == first_prompt + generated + tok.encode("u:more|a:")
    assert sent != tok.encode(tok.rendered[0])  # the template alone would have dropped the thinking
    assert answer["choices"][0]["message"]["prompt_token_ids"] == sent
    assert model.tokenize(second)["tokens"] == sent
    explicit = first_turn(required_prefix_token_ids=first_prompt + generated[:-1])  # cut by max_tokens: no EOS
    explicit["messages"] = second["messages"]
    model.chat(explicit)
    assert endpoint.requests[1]["prompt"] == first_prompt + generated[:-1] + tok.encode("|u:more|a:")


def test_a_template_that_does_not_extend_the_history_is_refused() -> None:
    renderer = ChatRenderer(TurnTokenizer())
    with pytest.raises(GymModelError, match="no longer than its history") as info:
        renderer.splice([1, 2, 0], [5, 6, 0], [5, 6, 0])
    assert info.value.status == 400
    with pytest.raises(GymModelError, match="without the EOS token"):
        renderer.splice([1, 2, 0], [5, 6, 7], [5, 6, 7, 8])


def test_max_tokens_is_capped_and_an_overflow_is_a_context_length_400() -> None:
    endpoint = RecordingEndpoint()
    model = gym_model(endpoint, max_model_len=10)
    model.chat(first_turn(max_tokens=100))
    assert endpoint.requests[0]["max_tokens"] == 10 - len(TurnTokenizer().encode("u:hi|a:"))
    long = first_turn(messages=[{"role": "user", "content": "x" * 20}])
    with pytest.raises(GymModelError) as info:
        model.chat(long)
    assert info.value.status == 400
    # Gym's vllm_model treats a 400 mentioning "context length" as a turn cut at max_output_tokens
    assert str(info.value).startswith("context length: This model's maximum context length is 10 tokens")
    assert len(endpoint.requests) == 1
    assert model.metrics()["coreweave/gym_context_overflows"] == 1.0
    unbounded = gym_model(endpoint, max_model_len=None)
    with pytest.raises(GymModelError, match="max_tokens is required"):
        unbounded.chat(first_turn(max_tokens=None))


def test_no_served_identity_fails_closed() -> None:
    endpoint = RecordingEndpoint()
    with pytest.raises(GymModelError, match="no served snapshot identity") as info:
        gym_model(endpoint, salt=None).chat(first_turn())
    assert info.value.status == 503 and endpoint.requests == []


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"n": 2}, "n must be 1"),
        ({"stream": True}, "stream is not supported"),
        ({"top_k": 5}, "top_k must be unset"),
        ({"messages": []}, "non-empty list"),
        ({"max_tokens": 0}, "positive integer"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text content"),
    ],
)
def test_requests_it_cannot_serve_are_400s(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(GymModelError, match=match) as info:
        gym_model(RecordingEndpoint()).chat(first_turn(**extra))
    assert info.value.status == 400


def test_deployment_errors_are_passed_on() -> None:
    endpoint = RecordingEndpoint()
    endpoint.status, endpoint.error = 400, "This model's maximum context length is 40 tokens"
    with pytest.raises(GymModelError, match="maximum context length") as info:
        gym_model(endpoint).chat(first_turn())
    assert info.value.status == 400
    endpoint.status = 503
    with pytest.raises(GymModelError, match="the deployment failed") as info:
        gym_model(endpoint).chat(first_turn())
    assert info.value.status == 502
    error = GymModelError(418, "teapot", "TeapotError")
    again = pickle.loads(pickle.dumps(error))
    assert (again.status, str(again), again.kind) == (418, "teapot", "TeapotError")


def test_metrics_count_requests_and_served_identities() -> None:
    endpoint = RecordingEndpoint(identity="run-v000007")
    model = gym_model(endpoint)
    assert model.metrics() == {}
    model.chat(first_turn())
    model.chat(first_turn())
    metrics = model.metrics()
    assert metrics["coreweave/gym_requests"] == 2.0
    assert metrics["coreweave/gym_completion_tokens"] == 6.0
    assert metrics["coreweave/served_version"] == 7.0
    assert model.identities == ("run-v000007",)
    model.clear_metrics()
    assert model.metrics() == {} and model.identities == ()
    # another run's identity (or an unknown run) is no version of this run
    for run_id in ("other", None):
        elsewhere = gym_model(RecordingEndpoint(identity="run-v000007"), run_id=run_id)
        elsewhere.chat(first_turn())
        assert "coreweave/served_version" not in elsewhere.metrics()


def test_server_speaks_http_as_gym_and_vllm_clients_expect() -> None:
    endpoint = RecordingEndpoint()
    with GymModelServer(gym_model(endpoint), advertise="127.0.0.1") as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        auth = {"Authorization": f"Bearer {server.token}"}  # what Gym's model server sends as its api_key
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", headers=auth, timeout=30) as http:
            models = http.get("/v1/models").json()
            assert [m["id"] for m in models["data"]] == ["served-model"]
            chat = http.post("/v1/chat/completions", json=first_turn())
            assert chat.status_code == 200 and chat.headers["x-cwtrain-snapshot-identity"] == "run-v000004"
            tokens = http.post("/tokenize", json={"model": "m", "messages": first_turn()["messages"]}).json()
            assert tokens["tokens"] == chat.json()["choices"][0]["message"]["prompt_token_ids"]
            assert tokens["max_model_len"] == 40
            bad = http.post("/v1/chat/completions", content=b"{not json")
            assert bad.status_code == 400 and bad.json()["type"] == "BadRequestError"
            assert http.post("/v1/completions", json={}).status_code == 404
            overflow = http.post(
                "/v1/chat/completions", json=first_turn(messages=[{"role": "user", "content": "x" * 50}])
            )
            assert overflow.status_code == 400 and "context length" in overflow.text


def _raw(port: int, head: str, body: bytes = b"", host: str = "127.0.0.1") -> tuple[int, dict[str, Any], float]:
    """One request over a raw socket: ``(status, JSON body, seconds to the answer)``."""
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        raw = b""
        while b"\r\n\r\n" not in raw:
            data = sock.recv(65536)
            assert data, f"closed without an answer: {raw!r}"
            raw += data
        top, _, rest = raw.partition(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in top.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        while len(rest) < length:
            rest += sock.recv(65536)
    return int(top.split()[1]), json.loads(rest[:length]), time.monotonic() - started


@pytest.mark.faults
@pytest.mark.fault_row("gym-relay")
def test_the_endpoint_is_no_open_relay_token_first_bounded_bodies() -> None:
    endpoint = RecordingEndpoint()
    with GymModelServer(gym_model(endpoint), advertise="127.0.0.1") as server:
        assert server.host == "127.0.0.1" and len(server.token) >= 32
        chat = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
        for auth in ("", "\r\nAuthorization: Bearer dummy_key", "\r\nAuthorization: Bearer " + server.token + "x"):
            # a 1 GiB body is declared and never sent: the refusal comes before reading any of it
            status, doc, seconds = _raw(server.port, chat + auth + f"\r\nContent-Length: {1 << 30}", b"{")
            assert status == 401 and doc["type"] == "AuthenticationError" and seconds < 5, doc
            for path in ("/v1/models", "/health"):
                status, doc, _ = _raw(server.port, f"GET {path} HTTP/1.1\r\nHost: x" + auth)
                assert status == 401, (path, doc)
        assert endpoint.requests == []  # nothing reached the deployment
        good = f"\r\nAuthorization: Bearer {server.token}"
        status, doc, seconds = _raw(server.port, chat + good + f"\r\nContent-Length: {MAX_BODY_BYTES + 1}", b"{")
        assert status == 413 and seconds < 5, doc
        status, doc, _ = _raw(server.port, chat + good + "\r\nContent-Length: abc", b"{")
        assert status == 400, doc
        body = json.dumps(first_turn()).encode()
        status, doc, _ = _raw(server.port, chat + good + f"\r\nContent-Length: {len(body)}", body)
        assert status == 200 and doc["choices"][0]["message"]["generation_token_ids"] == [20, 21, 0]
        assert len(endpoint.requests) == 1
        assert endpoint.headers[0]["authorization"] == "Bearer deployment-key"  # the deployment's key, not Gym's
        deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        status, doc, _ = _raw(server.port, chat + good + f"\r\nContent-Length: {len(deep)}", deep)
        assert status == 400 and "levels deep" in doc["message"], doc


@pytest.mark.faults
@pytest.mark.fault_row("gym-relay")
def test_the_endpoint_listens_only_where_it_is_advertised() -> None:
    with GymModelServer(gym_model(RecordingEndpoint()), advertise="127.0.0.2") as server:
        assert server.host == "127.0.0.2" and server.base_url == f"http://127.0.0.2:{server.port}/v1"
        with pytest.raises(OSError):  # not every interface: another address of this machine is refused
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        status, _, _ = _raw(
            server.port, f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}", host="127.0.0.2"
        )
        assert status == 200
    with GymModelServer(gym_model(RecordingEndpoint()), advertise="localhost", token="chosen-token") as server:
        assert server.host == "127.0.0.1" and server.token == "chosen-token"
    assert bind_address("10.1.2.3") == "10.1.2.3" and bind_address("::1") == "::1"
    assert bind_address("localhost") == "127.0.0.1"


@pytest.mark.e2e
@pytest.mark.slow
def test_generation_serves_gym_from_the_local_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CoreWeaveGeneration's model_server endpoint samples the local deployment with its model name and
    key, salted and tagged with the identity the synchronizer published; log-probs are the model's."""
    monkeypatch.syspath_prepend(str(NEMO_RL_STANDIN))  # NeMo-RL's stand-ins, as tests/nemo_rl/conftest.py does
    import torch
    from cwtrain_test_workers import HalfWorker  # type: ignore[import-not-found]

    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer
    from cwtrain.local import LocalStack
    from cwtrain.local.engine.model import init_weights, token_logprobs, write_base_checkpoint

    class Policy:
        def __init__(self, worker: Any) -> None:
            self.worker = worker

        def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> list[Any]:
            return [getattr(self.worker, method_name)(**kwargs)]

    with LocalStack(replicas=1) as stack:
        for key, value in stack.env().items():
            monkeypatch.setenv(key, value)
        target = stack.deploy(seed=0)
        write_base_checkpoint(tmp_path / "hf", seed=0)
        tok = TurnTokenizer()
        config = {
            "max_new_tokens": 6,
            "coreweave_cfg": {
                "base_url": target.base_url, "model": target.model, "api_key": stack.token,
                "deployment_id": target.deployment_id, "run_id": "gym-test", "max_model_len": 64, "timeout": 120,
            },
        }  # fmt: skip
        generation = CoreWeaveGeneration(config, tok)  # type: ignore[arg-type]
        assert generation.cfg["vllm_cfg"]["max_model_len"] == 64  # where NeMo-RL's Gym rollouts read it
        worker = HalfWorker(0, 1, init_weights(seed=0))
        sync = HotLoadWeightSynchronizer(Policy(worker), generation, config, hf_checkpoint=tmp_path / "hf")
        try:
            (base_url,) = generation.dp_openai_server_base_urls
            assert generation.dp_openai_server_base_urls == [base_url]  # started once
            nemo_gym: dict[str, Any] = {"config_paths": ["vllm_model_for_training.yaml"]}
            generation.configure_nemo_gym(nemo_gym)  # what the patched setup does before Gym starts
            token = nemo_gym["policy_model"]["responses_api_models"]["vllm_model"]["api_key"]
            assert token == generation.gym_model_server().token
            with httpx.Client(timeout=120) as http:
                refused = http.post(f"{base_url}/chat/completions", json=first_turn())
                assert refused.status_code == 401  # Gym's placeholder key, or none, is refused
                http.headers["Authorization"] = f"Bearer {token}"
                early = http.post(f"{base_url}/chat/completions", json=first_turn())
                assert early.status_code == 503  # nothing published yet: fails closed
                for step in range(2):
                    if step:
                        worker.train_step(step)
                    sync.sync_weights()
                    generation.clear_logger_metrics()
                    response = http.post(f"{base_url}/chat/completions", json=first_turn(max_tokens=6))
                    assert response.status_code == 200, response.text
                    identity = f"gym-test-v{step:06d}"
                    assert response.headers["x-cwtrain-snapshot-identity"] == identity
                    message = response.json()["choices"][0]["message"]
                    served = message["generation_log_probs"]
                    mine = token_logprobs(
                        worker.weights(), message["prompt_token_ids"], message["generation_token_ids"]
                    )
                    assert torch.allclose(torch.tensor(served), torch.tensor(mine), atol=1e-4)
                    metrics = generation.get_logger_metrics()
                    assert metrics["coreweave/gym_requests"] == 1.0
                    assert metrics["coreweave/served_version"] == float(step)
                    assert generation.served_identities == (identity,)
        finally:
            generation.shutdown()

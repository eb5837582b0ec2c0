"""A replica process against moto: base load, health, models, completions shapes, peer copy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from _replica_util import MODEL, TOKEN, ReplicaProcess, upload_base

from cwtrain.local.engine.model import Tokenizer, init_weights, token_logprobs
from cwtrain.local.engine.processes import TOKEN_VARIABLE
from cwtrain.local.engine.snapshots import served_from_weights_file

pytestmark = pytest.mark.e2e
TOK = Tokenizer()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def replica(s3_server: Any) -> Iterator[ReplicaProcess]:
    s3 = s3_server.client()
    bucket = f"rep-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "US-EAST-04A"})
    upload_base(s3, bucket, "base", seed=3)
    proc = ReplicaProcess(s3_server, bucket, name="solo")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _complete(replica: ReplicaProcess, **body: Any) -> httpx.Response:
    return replica.client.post("/v1/completions", json={"model": MODEL, **body})


def test_health_reports_initial_identity(replica: ReplicaProcess) -> None:
    doc = replica.health()
    assert doc["name"] == "solo"
    assert doc["state"] == "READY"
    assert doc["identity"] == "initial"
    assert doc["error_reason"] is None
    assert replica.client.get("/v1/models").json()["data"][0]["id"] == MODEL


def test_token_id_prompt_with_every_id_shape(replica: ReplicaProcess) -> None:
    prompt = TOK.encode("abc: ")
    resp = _complete(
        replica,
        prompt=prompt,
        n=4,
        max_tokens=12,
        logprobs=1,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
        nvext={"extra_fields": ["completion_token_ids", "engine_data"], "cache_salt": "x"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cwtrain-snapshot-identity"] == "initial"
    doc = resp.json()
    assert doc["system_fingerprint"] == "initial"
    assert [c["index"] for c in doc["choices"]] == [0, 1, 2, 3]
    total = 0
    weights = init_weights(seed=3)
    for choice in doc["choices"]:
        ids = choice["token_ids"]
        total += len(ids)
        assert choice["prompt_token_ids"] == prompt
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
        assert choice["nvext"]["completion_token_ids"] == ids
        assert choice["nvext"]["engine_data"]["prompt_token_ids"] == prompt
        assert choice["finish_reason"] in ("stop", "length")
        assert (choice["finish_reason"] == "length") == (len(ids) == 12 and ids[-1] != TOK.eos_token_id)
        assert choice["text"] == TOK.decode(ids)
        expected = token_logprobs(weights, prompt, ids)
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-4)
    assert doc["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": total,
        "total_tokens": len(prompt) + total,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": None,
    }


def test_same_seed_same_tokens_other_seed_differs(replica: ReplicaProcess) -> None:
    def ids(seed: int) -> list[list[int]]:
        body = {"prompt": "hello", "n": 3, "max_tokens": 16, "seed": seed, "return_token_ids": True, "ignore_eos": True}
        return [c["token_ids"] for c in _complete(replica, **body).json()["choices"]]

    assert ids(7) == ids(7)
    assert ids(7) != ids(8)


def test_text_prompt_add_special_tokens_and_stops(replica: ReplicaProcess) -> None:
    body = {"prompt": "hi", "max_tokens": 1, "return_token_ids": True, "temperature": 0}
    with_bos = _complete(replica, **body).json()["choices"][0]["prompt_token_ids"]
    without = _complete(replica, **body, add_special_tokens=False).json()["choices"][0]["prompt_token_ids"]
    assert with_bos == [TOK.bos_token_id, *TOK.encode("hi")]
    assert without == TOK.encode("hi")
    # greedy decoding: the first token, used as a stop token, ends the sequence right there
    greedy = _complete(replica, prompt="hi", max_tokens=8, temperature=0, return_token_ids=True, ignore_eos=True)
    first = greedy.json()["choices"][0]["token_ids"][0]
    stopped = _complete(
        replica, prompt="hi", max_tokens=8, temperature=0, return_token_ids=True, stop_token_ids=[first]
    ).json()["choices"][0]
    assert stopped["token_ids"] == [first]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == first
    text = greedy.json()["choices"][0]["text"]
    if text:
        cut = _complete(replica, prompt="hi", max_tokens=8, temperature=0, stop=[text[0]], ignore_eos=True)
        choice = cut.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == text[0]
        assert choice["text"] == ""


def test_batch_of_prompts_and_top_logprobs(replica: ReplicaProcess) -> None:
    resp = _complete(
        replica, prompt=[TOK.encode("ab"), TOK.encode("cd")], n=2, max_tokens=3, logprobs=3, ignore_eos=True
    )
    doc = resp.json()
    assert len(doc["choices"]) == 4
    for choice in doc["choices"]:
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
        for token, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert top[token] == chosen
            assert max(top.values()) >= chosen


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": "x", "model": "other"}, 404, "model"),
        ({"prompt": [1, 999]}, 400, "prompt"),
        ({}, 400, "prompt"),
        ({"prompt": "x", "n": 0}, 400, "n"),
        ({"prompt": "x", "n": 257}, 400, "n"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"prompt": "x", "max_tokens": 10_000}, 400, "max_tokens"),
        ({"prompt": [5] * 250, "max_tokens": 10}, 400, "input_tokens"),
    ],
)
def test_invalid_requests_get_openai_errors(
    replica: ReplicaProcess, body: dict[str, Any], status: int, param: Any
) -> None:
    resp = replica.client.post("/v1/completions", json={"model": MODEL} | body)
    assert resp.status_code == status
    assert resp.json()["error"]["param"] == param
    assert resp.json()["error"]["message"]


def test_openai_client_parses_n_greater_than_one(replica: ReplicaProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=replica.url + "/v1", api_key=replica.token)
    out = client.completions.create(
        model=MODEL, prompt="count: ", n=3, max_tokens=5, logprobs=1, extra_body={"return_token_ids": True}
    )
    assert len(out.choices) == 3
    assert out.system_fingerprint == "initial"
    assert out.usage is not None and out.usage.completion_tokens == sum(
        len(c.model_extra["token_ids"]) for c in out.choices
    )
    client.close()


def test_admin_weights_and_peer_copy(replica: ReplicaProcess, s3_server: Any) -> None:
    resp = replica.client.get("/admin/weights")
    assert resp.status_code == 200
    served = served_from_weights_file(resp.content)
    assert served.identity == "initial"
    for name, tensor in init_weights(seed=3).items():
        assert torch.equal(served.lm.weights[name], tensor)
    # a cold replica pointed at an empty bucket can only get weights from its peer
    s3 = s3_server.client()
    empty = f"empty-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=empty, CreateBucketConfiguration={"LocationConstraint": "US-EAST-04A"})
    peer = ReplicaProcess(s3_server, empty, name="copy", peer=replica.url)
    try:
        assert peer.wait_ready()["identity"] == "initial"
        body = {"model": MODEL, "prompt": "peer", "n": 2, "max_tokens": 8, "seed": 5, "return_token_ids": True}
        a = replica.client.post("/v1/completions", json=body).json()["choices"]
        b = peer.client.post("/v1/completions", json=body).json()["choices"]
        assert [c["token_ids"] for c in a] == [c["token_ids"] for c in b]
    finally:
        peer.stop()


def test_concurrent_seeded_requests_are_batched_without_changing_tokens(replica: ReplicaProcess) -> None:
    from concurrent.futures import ThreadPoolExecutor

    prompt = TOK.encode("even: ")

    def one(seed: int) -> tuple[list[int], list[float]]:
        body = {"prompt": prompt, "max_tokens": 12, "seed": seed, "logprobs": 0, "return_token_ids": True}
        choice = _complete(replica, **body).json()["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"]

    alone = [one(seed) for seed in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, range(8)))
    assert together == alone
    assert len({tuple(ids) for ids, _ in alone}) > 1  # the seeds do make different samples


def test_missing_base_reports_error_and_replica_exits_with_its_parent(s3_server: Any) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from cwtrain.local.harness.objectstore import free_port

    port = free_port()
    argv = [
        sys.executable, "-m", "cwtrain.local.engine.replica", "--name", "orphan", "--port", str(port),
        "--s3-endpoint", s3_server.endpoint_url, "--bucket", "none", "--model-name", "m",
        "--model-bucket", "none", "--model-path", "p",
    ]  # fmt: skip
    launcher = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen({argv!r}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    env = dict(os.environ) | s3_server.credentials | {TOKEN_VARIABLE: TOKEN}
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, env=env)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())

    def alive() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(") ", 1)[1][0] != "Z"
        except FileNotFoundError:
            return False

    try:
        deadline = time.monotonic() + 180
        resp = None
        while time.monotonic() < deadline:  # the bucket has no base checkpoint: 503 and ERROR
            try:
                resp = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, headers=AUTH)
                if resp.json()["state"] == "ERROR":
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert resp is not None and resp.status_code == 503 and resp.json()["identity"] is None
        assert "config.json" in resp.json()["error_reason"]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(), "the replica outlived the process that started it"
    finally:
        if alive():
            os.kill(pid, signal.SIGKILL)
        parent.stdout.close()


def test_routed_experts_shape_follows_the_tokens(replica: ReplicaProcess) -> None:
    import base64

    prompt = TOK.encode("moe: ")
    resp = _complete(
        replica,
        prompt=prompt,
        n=1,
        max_tokens=6,
        seed=2,
        return_token_ids=True,
        nvext={"extra_fields": ["routed_experts"]},
    )
    doc = resp.json()
    choice = doc["choices"][0]
    routes = choice["nvext"]["routed_experts"]
    rows = len(prompt) + len(choice["token_ids"]) - 1
    assert routes["shape"] == [rows, 2, 2] and routes["start"] == 0 and routes["dtype"] == "uint8"
    assert len(base64.b64decode(routes["data"])) == rows * 2 * 2
    assert doc["nvext"]["routed_experts"] == routes  # n = 1: also at the top level

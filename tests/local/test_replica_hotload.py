"""Hot-loads on a replica process: real deltas and FULL snapshots from moto, verified swaps."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _replica_util import MODEL, ReplicaProcess, put_object, put_snapshot, upload_base

from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.local.engine.model import Tokenizer, init_weights, to_tensor_data, token_logprobs

pytestmark = pytest.mark.e2e
TOK = Tokenizer()
PREFIX = "hotload"


def _bump(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """New BF16 weights: a few tensors changed by a visible amount."""
    gen = torch.Generator().manual_seed(seed)
    out = dict(weights)
    for name in ("lm_head.weight", "model.layers.0.mlp.up_proj.weight"):
        out[name] = (weights[name].float() + 0.05 * torch.randn(weights[name].shape, generator=gen)).to(torch.bfloat16)
    return out


@pytest.fixture(scope="module")
def world(s3_server: Any) -> Iterator[dict[str, Any]]:
    """A bucket with the base and a chain v0 (FULL) → v1 → v2 (deltas), plus a corrupt v3."""
    s3 = s3_server.client()
    bucket = f"hl-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "US-EAST-04A"})
    upload_base(s3, bucket, "base", seed=0)
    w0 = _bump(init_weights(seed=0), 1)
    w1, w2 = _bump(w0, 2), None
    w2 = _bump(w1, 3)
    with DeltaEncoder(workers=1) as enc:
        put_snapshot(s3, bucket, PREFIX, "run-v000000", enc.encode_full(to_tensor_data(w0)))
        put_snapshot(s3, bucket, PREFIX, "run-v000001", enc.encode(
            to_tensor_data(w1), to_tensor_data(w0), version="run-v000001", base_version="run-v000000"))  # fmt: skip
        put_snapshot(s3, bucket, PREFIX, "run-v000002", enc.encode(
            to_tensor_data(w2), to_tensor_data(w1), version="run-v000002", base_version="run-v000001"))  # fmt: skip
        bad = enc.encode(
            to_tensor_data(_bump(w2, 4)), to_tensor_data(w2), version="run-v000003", base_version="run-v000002"
        )
    shard = bytearray(bad.files[0].tobytes())
    shard[-3] ^= 0x01  # one flipped bit inside the last zstd frame's raw payload
    for file in bad.files:  # stored with the SHA-256 of the flipped bytes: only the codec's checks can catch it
        put_object(s3, bucket, f"{PREFIX}/run-v000003/{file.name}", bytes(shard))
    put_object(s3, bucket, f"{PREFIX}/run-v000003/{bad.index.name}", bad.index.tobytes())
    yield {"s3": s3, "bucket": bucket, "weights": [w0, w1, w2]}


@pytest.fixture(scope="module")
def replicas(world: dict[str, Any], s3_server: Any) -> Iterator[dict[str, ReplicaProcess]]:
    """Three replicas started together (process start is dominated by importing torch)."""
    procs = {
        "a": ReplicaProcess(s3_server, world["bucket"], name="a", prefix=PREFIX),
        "b": ReplicaProcess(s3_server, world["bucket"], name="b", prefix=PREFIX),
        "slow": ReplicaProcess(s3_server, world["bucket"], name="slow", prefix=PREFIX, apply_delay=1.0),
    }
    try:
        for proc in procs.values():
            assert proc.wait_ready()["identity"] == "initial"
        yield procs
    finally:
        for proc in procs.values():
            proc.proc.terminate()
        for proc in procs.values():
            proc.stop()


CHAIN = [("run-v000000", "FULL"), ("run-v000001", "INCREMENTAL"), ("run-v000002", "INCREMENTAL")]


def _served_logprobs(replica: ReplicaProcess) -> tuple[str, list[int], list[float]]:
    prompt = TOK.encode("check: ")
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "logprobs": 0, "return_token_ids": True, "seed": 1}
    resp = replica.client.post("/v1/completions", json=body)
    choice = resp.json()["choices"][0]
    return resp.headers["x-cwtrain-snapshot-identity"], choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _assert_serves(replica: ReplicaProcess, identity: str, weights: dict[str, torch.Tensor]) -> None:
    served, ids, logprobs = _served_logprobs(replica)
    assert served == identity
    assert logprobs == pytest.approx(token_logprobs(weights, TOK.encode("check: "), ids), abs=1e-4)


def test_full_then_deltas_then_corrupt_delta(world: dict[str, Any], replicas: dict[str, ReplicaProcess]) -> None:
    w0, w1, w2 = world["weights"]
    replica = replicas["a"]
    assert replica.hot_load("run-v000000", CHAIN[:1], "h0").status_code == 202
    assert replica.wait_settled("h0")["state"] == "READY"
    _assert_serves(replica, "run-v000000", w0)

    assert replica.hot_load("run-v000002", CHAIN, "h2").status_code == 202
    doc = replica.wait_settled("h2")
    assert (doc["state"], doc["identity"], doc["error_reason"]) == ("READY", "run-v000002", None)
    _assert_serves(replica, "run-v000002", w2)

    resp = replica.hot_load("run-v000003", [*CHAIN, ("run-v000003", "INCREMENTAL")], "h3")
    assert resp.status_code == 202
    doc = replica.wait_settled("h3")
    assert doc["state"] == "ERROR" and doc["identity"] == "run-v000002"
    assert "run-v000003" in doc["error_reason"]
    _assert_serves(replica, "run-v000002", w2)  # the old weights keep serving

    # a later good hot-load clears the error
    assert replica.hot_load("run-v000001", CHAIN[:2], "h4").status_code == 202
    doc = replica.wait_settled("h4")
    assert (doc["state"], doc["identity"], doc["error_reason"]) == ("READY", "run-v000001", None)
    _assert_serves(replica, "run-v000001", w1)


def test_bad_chains_fail_cleanly_then_cold_replay(world: dict[str, Any], replicas: dict[str, ReplicaProcess]) -> None:
    replica = replicas["b"]
    replica.hot_load("nope", [("nope", "FULL")], "m1")
    doc = replica.wait_settled("m1")
    assert doc["state"] == "ERROR" and doc["identity"] == "initial" and "nope" in doc["error_reason"]
    # v2 is a delta over v1; a chain that puts it right after v0 is refused before decoding
    replica.hot_load("run-v000002", [CHAIN[0], CHAIN[2]], "m2")
    doc = replica.wait_settled("m2")
    assert doc["state"] == "ERROR" and "run-v000001" in doc["error_reason"]
    _assert_serves(replica, "initial", init_weights(seed=0))
    # malformed requests are refused synchronously
    assert replica.hot_load("x", [], "m3").status_code == 400
    assert replica.hot_load("x", [("y", "FULL")], "m4").status_code == 400
    assert replica.client.post("/admin/hotload", json={"identity": "x"}).status_code == 400
    # a replica on the base replays the chain from its FULL root
    assert replica.hot_load("run-v000002", CHAIN, "cold").status_code == 202
    doc = replica.wait_settled("cold")
    assert (doc["state"], doc["identity"], doc["error_reason"]) == ("READY", "run-v000002", None)
    _assert_serves(replica, "run-v000002", world["weights"][2])


def test_in_flight_requests_finish_on_old_weights_and_peer_copies_new(
    world: dict[str, Any], replicas: dict[str, ReplicaProcess], s3_server: Any
) -> None:
    replica = replicas["slow"]
    replica.hot_load("run-v000000", CHAIN[:1], "s0")
    deadline = time.monotonic() + 30
    while (mid := replica.health())["state"] == "PENDING_UPDATE":  # accepted; its loader not started yet
        assert time.monotonic() < deadline, mid
        time.sleep(0.01)
    assert mid["state"] == "UPDATING" and mid["identity"] == "initial"
    served, _, _ = _served_logprobs(replica)
    assert served == "initial"  # still serving the old weights while the new ones wait
    assert replica.wait_settled("s0")["identity"] == "run-v000000"
    # a new replica copies the served identity from its peer, not the base
    peer = ReplicaProcess(s3_server, world["bucket"], name="peer", prefix=PREFIX, peer=replica.url)
    try:
        assert peer.wait_ready()["identity"] == "run-v000000"
        _assert_serves(peer, "run-v000000", world["weights"][0])
        # a busy replica refuses a second hot-load but accepts a retry of the running one
        assert peer.hot_load("run-v000001", CHAIN[:2], "p1").status_code == 202
    finally:
        peer.stop()
    assert replica.hot_load("run-v000001", CHAIN[:2], "s1").status_code == 202
    assert replica.hot_load("run-v000001", CHAIN[:2], "s1").status_code == 202
    assert replica.hot_load("run-v000002", CHAIN, "s2").status_code == 409
    assert replica.wait_settled("s1")["identity"] == "run-v000001"

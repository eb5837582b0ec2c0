"""End to end against ``LocalStack``: real engine replicas, real snapshots, real HTTP, moto S3.

One stack per module (two replicas of the tiny model). The tests run in order and build
one chain: FULL v0 → delta v1 → (corrupt delta: FAILED) → delta v2 with a replica killed
mid hot-load → every replica killed, so the restarted ones replay v0..v2 cold.
The client side is cwtrain's own ``InferenceClient`` and the official ``openai`` client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from _reference_snapshot import assert_same_weights, check_served, served_by_replicas

from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.store.object_writer import SHA256_METADATA
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState, ReplicaState, SnapshotType
from cwtrain.infra.models import IncrementalSnapshotMetadata
from cwtrain.local import DeployedModel, LocalStack
from cwtrain.local.engine.model import Tokenizer, init_weights, to_tensor_data, token_logprobs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOK = Tokenizer()
PROMPT = TOK.encode("check: ")


def _bump(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = dict(weights)
    for name in ("lm_head.weight", "model.layers.0.mlp.up_proj.weight"):
        noise = 0.05 * torch.randn(weights[name].shape, generator=gen)
        out[name] = (weights[name].float() + noise).to(torch.bfloat16)
    return out


def _sha(file: Any) -> dict[str, str]:
    return {SHA256_METADATA: file.sha256()}


class World:
    def __init__(self, stack: LocalStack, target: DeployedModel) -> None:
        self.stack = stack
        self.target = target
        self.s3 = stack.s3_client()
        self.client = InferenceClient(stack.token, base_url=stack.api_url)
        self.openai = openai.OpenAI(base_url=target.base_url, api_key=stack.token, max_retries=0)
        self.weights: dict[str, dict[str, torch.Tensor]] = {}
        self.encoder = DeltaEncoder(workers=1)

    def put(self, identity: str, snapshot: Any, *, corrupt: bool = False) -> None:
        prefix = f"{self.target.path_prefix}/{identity}"
        for file in snapshot.files:  # with the SHA-256 metadata cwtrain's uploader writes (replicas check it)
            self.s3.put_object(
                Bucket=self.target.bucket, Key=f"{prefix}/{file.name}", Body=file.tobytes(), Metadata=_sha(file)
            )
        if corrupt:
            self.stack.faults.flip_byte(self.target.bucket, f"{prefix}/{snapshot.files[0].name}", offset=-3)
        self.s3.put_object(
            Bucket=self.target.bucket,
            Key=f"{prefix}/{snapshot.index.name}",
            Body=snapshot.index.tobytes(),
            Metadata=_sha(snapshot.index),
        )

    def publish(self, identity: str, weights: dict[str, torch.Tensor], previous: str | None, **kw: Any) -> None:
        if previous is None:
            snapshot = self.encoder.encode_full(to_tensor_data(weights))
        else:
            snapshot = self.encoder.encode(
                to_tensor_data(weights),
                to_tensor_data(self.weights[previous]),
                version=identity,
                base_version=previous,
            )
        self.put(identity, snapshot, **kw)
        self.weights[identity] = weights

    def hot_load(self, identity: str, previous: str | None, timeout: float = 120.0) -> Any:
        incremental = IncrementalSnapshotMetadata(previous) if previous else None
        kind = SnapshotType.INCREMENTAL if previous else SnapshotType.FULL
        created = self.client.create_hot_load(
            self.target.deployment_id, identity, snapshot_type=kind, incremental=incremental
        )
        deadline = time.monotonic() + timeout
        while True:
            hot_load = self.client.get_hot_load(created.id)
            if hot_load.state in (HotLoadState.COMPLETED, HotLoadState.FAILED, HotLoadState.CANCELED):
                return hot_load
            assert time.monotonic() < deadline, f"hot-load {identity} did not end: {hot_load}"
            time.sleep(0.05)

    def sample(self, n: int = 1) -> Any:
        return self.openai.completions.create(
            model=self.target.model,
            prompt=PROMPT,
            n=n,
            max_tokens=8,
            logprobs=0,
            seed=3,
            extra_body={"return_token_ids": True},
        )

    def assert_serves(self, identity: str) -> None:
        for _ in range(2):  # both replicas, round-robin
            response = self.sample()
            assert response.system_fingerprint == identity
            choice = response.choices[0]
            ids = choice.model_extra["token_ids"]
            expected = token_logprobs(self.weights[identity], PROMPT, ids)
            assert choice.logprobs.token_logprobs == pytest.approx(expected, abs=1e-4)
        # Byte for byte, by the reference reader (not cwtrain's codec): the chain in the bucket
        # and what every replica holds are the trainer's weights.
        if identity == "initial":
            for served, weights in served_by_replicas(self.stack, self.target.deployment_id):
                assert served == identity
                assert_same_weights(weights, self.weights[identity], "the base weights a replica serves")
        else:
            check_served(
                self.stack,
                self.target.deployment_id,
                self.target.path_prefix,
                identity,
                self.weights[identity],
                bucket=self.target.bucket,
            )

    def replica_health(self) -> list[dict[str, Any]]:
        slots = self.stack.supervisor.slots[self.target.deployment_id]
        return [dict(s.process.health or {}) for s in slots if s.process is not None]


@pytest.fixture(scope="module")
def world(shared_stack: Any) -> Iterator[World]:
    with shared_stack.view("e2e-local-stack", replicas=2) as stack:
        world = World(stack, stack.deploy(seed=0))
        world.weights["initial"] = init_weights(seed=0)
        try:
            yield world
        finally:
            world.encoder.close()
            world.client.close()


def test_openai_client_gets_completions_with_n_greater_than_one(world: World) -> None:
    assert [m.id for m in world.openai.models.list().data] == [world.target.model]
    response = world.sample(n=3)
    assert len(response.choices) == 3 and sorted(c.index for c in response.choices) == [0, 1, 2]
    assert response.system_fingerprint == "initial"
    text = world.openai.completions.create(model=world.target.model, prompt="hello", n=2, max_tokens=4)
    assert len(text.choices) == 2 and all(isinstance(c.text, str) for c in text.choices)
    world.assert_serves("initial")


def test_full_then_delta_switch_the_served_weights(world: World) -> None:
    w0 = _bump(world.weights["initial"], 1)
    world.publish("run-v000000", w0, None)
    full = world.hot_load("run-v000000", None)
    assert full.state is HotLoadState.COMPLETED, full
    world.assert_serves("run-v000000")
    world.publish("run-v000001", _bump(w0, 2), "run-v000000")
    delta = world.hot_load("run-v000001", "run-v000000")
    assert delta.state is HotLoadState.COMPLETED
    assert [ref.identity for ref in delta.snapshot_chain] == ["run-v000000", "run-v000001"]
    replicas = world.client.list_hot_load_replicas(delta.id)
    assert len(replicas) == 2
    assert all(r.state is ReplicaState.READY and r.current_snapshot_identity == "run-v000001" for r in replicas)
    world.assert_serves("run-v000001")


def test_corrupted_byte_fails_and_the_previous_identity_keeps_serving(world: World) -> None:
    world.publish("run-v000002-bad", _bump(world.weights["run-v000001"], 3), "run-v000001", corrupt=True)
    failed = world.hot_load("run-v000002-bad", "run-v000001")
    assert failed.state is HotLoadState.FAILED
    replicas = world.client.list_hot_load_replicas(failed.id)
    assert all(r.state is ReplicaState.ERROR and r.error_reason for r in replicas)
    assert all(r.current_snapshot_identity == "run-v000001" for r in replicas)
    world.assert_serves("run-v000001")  # proven by completions that report it


def test_replica_killed_during_a_hot_load(world: World) -> None:
    killed_slot = world.stack.supervisor.slots[world.target.deployment_id][0]
    generation = killed_slot.generation
    world.stack.faults.kill_replica_during_next_hot_load(world.target.deployment_id, index=0)
    world.publish("run-v000002", _bump(world.weights["run-v000001"], 4), "run-v000001")
    done = world.hot_load("run-v000002", "run-v000001", timeout=180)
    assert done.state is HotLoadState.COMPLETED
    # On a fast machine the replica can switch before the kill lands, so the hot-load may
    # complete first; either way the supervisor restarts the killed replica from its peer.
    deadline = time.monotonic() + 180
    while True:
        health = world.replica_health()
        if (
            killed_slot.generation == generation + 1
            and len(health) == 2
            and all(h.get("identity") == "run-v000002" and h.get("state") == "READY" for h in health)
        ):
            break
        assert time.monotonic() < deadline, (killed_slot, health)
        time.sleep(0.1)
    assert killed_slot.process is not None
    assert "--peer" in killed_slot.process.argv  # it copied the weights from the other replica
    world.assert_serves("run-v000002")


def test_cold_replicas_replay_the_chain(world: World) -> None:
    slots = world.stack.supervisor.slots[world.target.deployment_id]
    before = [s.generation for s in slots]
    world.stack.faults.kill_replica(world.target.deployment_id, 0)
    world.stack.faults.kill_replica(world.target.deployment_id, 1)
    deadline = time.monotonic() + 180
    while True:
        health = world.replica_health()
        if (
            [s.generation for s in slots] > before
            and len(health) == 2
            and all(h.get("identity") == "run-v000002" and h.get("state") == "READY" for h in health)
        ):
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.1)
    assert any("--peer" not in s.process.argv for s in slots if s.process is not None)  # a cold replay
    world.assert_serves("run-v000002")


def test_client_survives_a_dropped_create_and_failing_reads(world: World) -> None:
    faults = world.stack.faults.api
    world.publish("run-v000003", _bump(world.weights["run-v000002"], 5), "run-v000002")
    faults.drop_next(1, method="POST", path=r"^/hotLoads$")  # created, but the answer is lost
    faults.fail_next(2, code="unavailable", method="GET", path=r"^/hotLoads/[^/]+$")
    done = world.hot_load("run-v000003", "run-v000002")
    assert done.state is HotLoadState.COMPLETED
    assert ("drop", "POST", "/hotLoads") in faults.fired and faults.pending() == []
    mine = [h for h in world.client.list_hot_loads(world.target.deployment_id) if h.identity == "run-v000003"]
    assert len(mine) == 1  # the retry adopted the hot-load the lost answer had created
    world.assert_serves("run-v000003")

"""Faults on the data path: cut uploads, corrupted stored bytes, killed and cold replicas.

A trainer (``_faults_trainer.Trainer``) publishes the local model's weights to a 2-replica
deployment of the local stack; each test breaks one thing and checks what must hold:
nothing corrupt is ever served, replicas keep the previous identity on a refused
snapshot, the trainer's next publish recovers, and every replica ends on the same bytes
as the trainer (log-probs of a completion equal the trainer's own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from _faults_trainer import Trainer

from cwtrain.errors import HotLoadFailedError
from cwtrain.hotload.files.write import write_delta, write_full_snapshot
from cwtrain.hotload.format.identity import snapshot_prefix
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState, ReplicaState
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, Tokenizer, token_logprobs, weights_to_safetensors

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

POLL = 0.1
PROMPT = "hello"


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("faults-data", replicas=2) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        yield local


def _trainer(stack: LocalStack, target: Any, run: str) -> Trainer:
    client = InferenceClient(stack.token, base_url=stack.api_url)
    loader = HotLoader(client, deployment_id=target.deployment_id, timeout=180, poll_interval=POLL)
    trainer = Trainer(loader, run=run)
    trainer.publish(full=True)
    return trainer


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="faults-data")


@pytest.fixture(scope="module")
def trainer(stack: LocalStack, target: Any) -> Trainer:
    return _trainer(stack, target, "data-faults")


def _complete(stack: LocalStack, target: Any, seed: int = 7) -> tuple[str, list[int], list[float]]:
    """One seeded completion through the gateway: (serving identity, token ids, log-probs)."""
    tok = Tokenizer()
    response = httpx.post(
        f"{target.base_url}/completions",
        headers={"Authorization": f"Bearer {stack.token}"},
        json={
            "model": target.model, "prompt": tok.encode(PROMPT), "max_tokens": 8, "n": 1, "seed": seed,
            "temperature": 1.0, "logprobs": 1, "return_token_ids": True,
        },
        timeout=30,
    )  # fmt: skip
    response.raise_for_status()
    body = response.json()
    choice = body["choices"][0]
    return body["system_fingerprint"], choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _serves_trainer_bytes(stack: LocalStack, target: Any, trainer: Trainer, tries: int = 4) -> None:
    """Every answer (round robin over replicas) comes from the trainer's identity and weights."""
    assert trainer.served is not None
    for seed in range(tries):
        identity, ids, served = _complete(stack, target, seed)
        assert identity == trainer.served_identity
        mine = token_logprobs(trainer.served, Tokenizer().encode(PROMPT), ids)
        assert torch.allclose(torch.tensor(served), torch.tensor(mine), atol=1e-4)


def _checkpoint(weights: dict[str, torch.Tensor], where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps(ModelConfig().to_json()))
    (where / "model.safetensors").write_bytes(weights_to_safetensors(weights, {"format": "pt"}))
    return where


@pytest.mark.fault_row("s3-drop")
def test_upload_connections_cut_mid_body(stack: LocalStack, target: Any, trainer: Trainer) -> None:
    proxy = stack.faults.s3
    assert proxy is not None
    trainer.step()
    cuts = proxy.cut_count
    proxy.cut_next(after_bytes=16 * 1024, count=2)
    hot_load = trainer.publish()
    assert proxy.cut_count == cuts + 2
    assert hot_load.state is HotLoadState.COMPLETED
    s3 = stack.s3_client()
    prefix = snapshot_prefix(target.path_prefix, hot_load.identity) + "/"
    listing = s3.list_objects_v2(Bucket=target.bucket, Prefix=prefix)["Contents"]
    assert listing
    for obj in listing:
        stored = s3.get_object(Bucket=target.bucket, Key=obj["Key"])
        assert stored["Metadata"]["cwtrain-sha256"] == hashlib.sha256(stored["Body"].read()).hexdigest()
    _serves_trainer_bytes(stack, target, trainer)


@pytest.mark.fault_row("flip-delta")
def test_flipped_byte_in_a_delta(stack: LocalStack, target: Any, trainer: Trainer, tmp_path: Path) -> None:
    assert trainer.served is not None
    previous = trainer.served_identity
    trainer.step()
    identity = trainer.identity()
    base = _checkpoint(trainer.served, tmp_path / "base")
    new = _checkpoint(trainer.weights, tmp_path / "new")
    write_delta(base, new, tmp_path / "delta", version="1", base_version="0")
    info = trainer.loader.upload(tmp_path / "delta", identity, previous_identity=previous)
    shard = next(f for f in info.files if f.name.endswith(".safetensors"))
    key = snapshot_prefix(target.path_prefix, identity) + "/" + Path(shard).name
    stack.faults.flip_byte(target.bucket, key, offset=-1)
    hot_load = trainer.loader.trigger(identity, info)
    with pytest.raises(HotLoadFailedError) as failed:
        trainer.loader.wait(hot_load.id, timeout=120)
    assert any(r.error_reason for r in failed.value.replicas), "the failure names no reason"
    assert _complete(stack, target)[0] == previous  # the previous identity keeps serving
    trainer.version += 1  # the corrupt identity is burnt: identities are immutable
    recovered = trainer.publish(full=True)
    assert recovered.state is HotLoadState.COMPLETED
    _serves_trainer_bytes(stack, target, trainer)


@pytest.mark.fault_row("flip-full")
def test_flipped_byte_in_a_full_snapshot(stack: LocalStack, target: Any, trainer: Trainer, tmp_path: Path) -> None:
    assert trainer.served is not None
    previous = trainer.served_identity
    trainer.step()
    identity = trainer.identity()
    full = write_full_snapshot(_checkpoint(trainer.weights, tmp_path / "src"), tmp_path / "full")
    info = trainer.loader.upload(full, identity)
    key = snapshot_prefix(target.path_prefix, identity) + "/model.safetensors"
    stack.faults.flip_byte(target.bucket, key, offset=-3)  # inside the last tensor's data
    hot_load = trainer.loader.trigger(identity, info)
    with pytest.raises(HotLoadFailedError) as failed:
        trainer.loader.wait(hot_load.id, timeout=120)
    assert any(r.error_reason for r in failed.value.replicas)
    assert _complete(stack, target)[0] == previous
    trainer.version += 1
    assert trainer.publish(full=True).state is HotLoadState.COMPLETED
    _serves_trainer_bytes(stack, target, trainer)


@pytest.mark.fault_row("replica-killed")
def test_replica_killed_during_a_hot_load(stack: LocalStack, target: Any, trainer: Trainer) -> None:
    stack.faults.kill_replica_during_next_hot_load(target.deployment_id)
    trainer.step()
    try:
        hot_load = trainer.publish()
        assert hot_load.state is HotLoadState.COMPLETED
    except HotLoadFailedError as exc:  # a clean end: failed, with the reason
        assert str(exc) and any(r.error_reason for r in exc.replicas)
        trainer.version += 1
        trainer.publish(full=True)
    # The restarted replica catches up: every answer comes from the trainer's bytes.
    latest = trainer.loader.latest_completed()
    assert latest is not None
    for _ in range(600):
        replicas = trainer.loader.status(latest.id).replicas
        if len(replicas) == 2 and all(
            r.state is ReplicaState.READY and r.current_snapshot_identity == trainer.served_identity for r in replicas
        ):
            break
        import time

        time.sleep(0.2)
    else:
        pytest.fail(f"replicas did not catch up: {replicas}")
    _serves_trainer_bytes(stack, target, trainer, tries=6)


@pytest.mark.fault_row("cold-replica")
def test_cold_replica_replays_thirty_deltas(stack: LocalStack) -> None:
    target = stack.deploy(name="faults-cold", replicas=1)
    trainer = _trainer(stack, target, "cold")
    for _ in range(30):
        trainer.step(scale=0.01)
        assert trainer.publish().state is HotLoadState.COMPLETED
    last = trainer.loader.latest_completed()
    assert last is not None and last.identity == trainer.identity(30)
    assert len(last.snapshot_chain) == 31  # FULL root + 30 deltas
    stack.faults.kill_replica(target.deployment_id, 0)
    import time

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            identity, _, _ = _complete(stack, target)
            if identity == trainer.served_identity:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    _serves_trainer_bytes(stack, target, trainer)

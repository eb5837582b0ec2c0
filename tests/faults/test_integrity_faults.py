"""Integrity on the data path: replicas serve only the bytes that were hashed, and ERROR has a way back.

- ``flip-full-object``: a plain FULL checkpoint (no Adler-32s, so the codec cannot catch a
  flipped byte) is uploaded, one byte of its tensor data is inverted in the store (the
  object keeps its ``cwtrain-sha256`` metadata), and the hot-load is triggered. The
  replicas must refuse it naming the object and keep serving the previous identity; the
  CLI's ``hotload trigger`` must refuse it before any hot-load is created.
- ``error-recovery``: the only replica of a deployment is killed after one byte of the delta
  it serves was inverted, so its cold restart cannot replay the chain. The deployment must
  say so (not "restarting replicas"), and a rollback to the intact FULL must be accepted in
  STATUS_ERROR and bring the deployment back to READY on that FULL's bytes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from _faults_trainer import Trainer

from cwtrain.cli import main
from cwtrain.errors import HotLoadFailedError
from cwtrain.hotload.format.identity import snapshot_prefix
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, Tokenizer, token_logprobs, weights_to_safetensors

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

POLL = 0.1
PROMPT = "hello"


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(replicas=1) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        yield local


def _trainer(stack: LocalStack, name: str) -> tuple[Any, Trainer]:
    target = stack.deploy(name=name, replicas=1)
    client = InferenceClient(stack.token, base_url=stack.api_url)
    loader = HotLoader(client, deployment_id=target.deployment_id, timeout=180, poll_interval=POLL)
    trainer = Trainer(loader, run=name)
    trainer.publish(full=True)
    return target, trainer


def _complete(stack: LocalStack, target: Any, seed: int = 7) -> tuple[str, list[int], list[float]]:
    """One seeded completion through the gateway: (serving identity, token ids, log-probs)."""
    response = httpx.post(
        f"{target.base_url}/completions",
        headers={"Authorization": f"Bearer {stack.token}"},
        json={
            "model": target.model, "prompt": Tokenizer().encode(PROMPT), "max_tokens": 8, "seed": seed,
            "temperature": 1.0, "logprobs": 1, "return_token_ids": True,
        },
        timeout=30,
    )  # fmt: skip
    response.raise_for_status()
    body = response.json()
    choice = body["choices"][0]
    return body["system_fingerprint"], choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _serves(stack: LocalStack, target: Any, identity: str, weights: dict[str, torch.Tensor]) -> None:
    for seed in range(3):
        served, ids, logprobs = _complete(stack, target, seed)
        assert served == identity
        mine = token_logprobs(weights, Tokenizer().encode(PROMPT), ids)
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(mine), atol=1e-4)


def _plain_checkpoint(weights: dict[str, torch.Tensor], where: Path) -> Path:
    """A FULL checkpoint as a framework saves it: safetensors without checksums, and config.json."""
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps(ModelConfig().to_json()))
    (where / "model.safetensors").write_bytes(weights_to_safetensors(weights, {"format": "pt"}))
    return where


def _deployment(stack: LocalStack, deployment_id: str) -> dict[str, Any]:
    status, body = stack.api("GET", f"/deployments/{deployment_id}")
    assert status == 200, body
    return body["deployment"]["status"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def plain(stack: LocalStack) -> tuple[Any, Trainer]:
    return _trainer(stack, "integrity")


@pytest.mark.fault_row("flip-full-object")
def test_replicas_refuse_a_flipped_plain_full_naming_the_object(
    stack: LocalStack, plain: tuple[Any, Trainer], tmp_path: Path
) -> None:
    target, trainer = plain
    previous = trainer.served_identity
    assert previous is not None and trainer.served is not None
    trainer.step()
    identity = trainer.identity()
    info = trainer.loader.upload(_plain_checkpoint(trainer.weights, tmp_path / "ckpt"), identity)
    key = snapshot_prefix(target.path_prefix, identity) + "/model.safetensors"
    stack.faults.flip_byte(target.bucket, key, offset=-3)  # tensor data: no checksum of the codec covers it
    hot_load = trainer.loader.trigger(identity, info)  # the library default: no read-back
    with pytest.raises(HotLoadFailedError) as failed:
        trainer.loader.wait(hot_load.id, timeout=120)
    reasons = [r.error_reason for r in failed.value.replicas if r.error_reason]
    assert reasons and all(f"s3://{target.bucket}/{key}" in r and "SHA-256" in r for r in reasons), reasons
    _serves(stack, target, previous, trainer.served)  # the previous weights keep serving
    trainer.version += 1  # the corrupt identity is burnt: identities are immutable
    assert trainer.publish(full=True).state is HotLoadState.COMPLETED
    assert trainer.served_identity is not None and trainer.served is not None
    _serves(stack, target, trainer.served_identity, trainer.served)


@pytest.mark.fault_row("flip-full-object")
def test_cli_trigger_refuses_a_flipped_full_before_creating_a_hot_load(
    stack: LocalStack, plain: tuple[Any, Trainer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, trainer = plain
    trainer.step()
    identity = trainer.identity()
    trainer.loader.upload(_plain_checkpoint(trainer.weights, tmp_path / "ckpt"), identity)
    key = snapshot_prefix(target.path_prefix, identity) + "/model.safetensors"
    stack.faults.flip_byte(target.bucket, key, offset=-100)
    before = len(trainer.loader.list())
    code = main(["hotload", "trigger", "--deployment", target.deployment_id, "--identity", identity, "--no-wait"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    error = captured.err.strip().splitlines()[-1]
    assert error.startswith("error: ") and f"s3://{target.bucket}/{key}" in error and "--no-verify" in error
    assert len(trainer.loader.list()) == before  # no hot-load was created
    trainer.version += 1


def _broken_chain(stack: LocalStack, name: str) -> tuple[Any, Trainer, str, dict[str, torch.Tensor]]:
    """A deployment in STATUS_ERROR: its only replica restarted cold on a FULL and a delta one of whose bytes
    was inverted. Returns the deployment, its trainer, the FULL root's identity and weights."""
    target, trainer = _trainer(stack, name)
    root = trainer.served_identity
    assert root is not None and trainer.served is not None
    root_weights = {k: v.clone() for k, v in trainer.served.items()}
    trainer.step()
    assert trainer.publish().state is HotLoadState.COMPLETED  # a delta on the FULL root
    delta = trainer.served_identity
    assert delta is not None
    prefix = snapshot_prefix(target.path_prefix, delta) + "/"
    s3 = stack.s3_client()
    shard = next(
        o["Key"]
        for o in s3.list_objects_v2(Bucket=target.bucket, Prefix=prefix)["Contents"]
        if o["Key"].endswith(".safetensors")
    )
    stack.faults.flip_byte(target.bucket, shard, offset=-1)
    stack.faults.kill_replica(target.deployment_id, 0)  # no peer: it must replay FULL + the corrupt delta

    deadline = time.monotonic() + 180
    status = _deployment(stack, target.deployment_id)
    message = ""
    while time.monotonic() < deadline:
        status = _deployment(stack, target.deployment_id)
        message = status["conditions"][1]["message"]
        if status["status"] == "STATUS_ERROR" and "cannot load" in message:
            break
        time.sleep(0.2)
    assert status["status"] == "STATUS_ERROR", status
    assert f"cannot load {delta!r}" in message and f"s3://{target.bucket}/{shard}" in message, message
    assert "restarting" not in message and "hotload rollback" in message
    return target, trainer, root, root_weights


@pytest.mark.fault_row("error-recovery")
def test_a_corrupt_chain_after_a_restart_says_why_and_a_rollback_recovers(stack: LocalStack) -> None:
    target, trainer, root, root_weights = _broken_chain(stack, "recovery")
    back = trainer.loader.rollback(root)  # accepted in STATUS_ERROR: the way back
    assert back.state is HotLoadState.COMPLETED and back.identity == root
    deadline = time.monotonic() + 60
    while _deployment(stack, target.deployment_id)["status"] != "STATUS_READY":
        assert time.monotonic() < deadline, _deployment(stack, target.deployment_id)
        time.sleep(0.1)
    _serves(stack, target, root, root_weights)
    trainer.served, trainer.served_identity = root_weights, root
    assert trainer.publish(full=True).state is HotLoadState.COMPLETED  # publishing works again


@pytest.mark.fault_row("error-recovery")
def test_a_deployment_in_error_after_a_bad_delta_takes_a_fresh_full_from_the_cli(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26 item 10: no delete, no manual rollback: `cwtrain hotload publish` of a fresh FULL brings it back."""
    target, trainer, _, _ = _broken_chain(stack, "fresh-full")
    trainer.step()
    fresh = _plain_checkpoint(trainer.weights, tmp_path / "fresh")
    identity = trainer.identity()
    argv = ["hotload", "publish", "--deployment", target.deployment_id, "--checkpoint", str(fresh)]
    code = main([*argv, "--identity", identity, "--poll-interval", str(POLL)])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert json.loads(out)["status"]["state"] == "COMPLETED"
    deadline = time.monotonic() + 60
    while _deployment(stack, target.deployment_id)["status"] != "STATUS_READY":
        assert time.monotonic() < deadline, _deployment(stack, target.deployment_id)
        time.sleep(0.1)
    _serves(stack, target, identity, trainer.weights)

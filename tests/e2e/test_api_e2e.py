"""The control-plane client, HotLoader and CLI against cwtrain-local over real HTTP and moto S3.

One stack per module: a gateway and a hot-load deployment are created through
``cwtrain.infra`` (and again through the CLI), snapshots are published FULL then as a
delta, every replica must serve each, rollback returns to the FULL one, and deletes wait
until the API answers NOT_FOUND. Fault injection covers a create whose response is lost.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _reference_snapshot import check_served, checkpoint_weights

from cwtrain.cli import main
from cwtrain.errors import AlreadyExistsError, NotFoundError
from cwtrain.hotload.files.checkpoint import load_full_dir
from cwtrain.hotload.files.write import write_delta
from cwtrain.hotload.format.tensors import TensorData
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient, lifecycle
from cwtrain.infra.enums import HotLoadState, ReplicaState, ResourceStatus, SnapshotType
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import write_base_checkpoint

pytestmark = pytest.mark.e2e

POLL = 0.1


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("e2e-api", replicas=2) as local:
        local.seed_base_model("base/e2e", seed=0)
        yield local


@pytest.fixture
def api(stack: LocalStack) -> Iterator[InferenceClient]:
    with InferenceClient(stack.token, base_url=stack.api_url) as client:
        yield client


def _gateway_request(name: str, stack: LocalStack) -> dict[str, Any]:
    return {
        "name": name,
        "zones": [stack.region],
        "coreWeaveAuth": {},
        "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"},
    }


def _deployment_request(
    name: str, gateway_id: str, stack: LocalStack, prefix: str = "hotload", replicas: int = 2
) -> dict[str, Any]:
    return {
        "name": name,
        "gatewayIds": [gateway_id],
        "runtime": {"engine": "dynamo-vllm", "version": "1.2.3", "engineConfig": {}, "engineEnv": {}},
        "resources": {"instanceType": "CPU_LOCAL", "gpuCount": 1},
        "model": {"name": f"{name}-model", "bucket": stack.bucket, "path": "base/e2e"},
        "autoscaling": {"min": replicas, "max": replicas, "concurrency": 64},
        "traffic": {"weight": 100},
        "hotLoad": {"bucket": stack.bucket, "pathPrefix": prefix, "transitionMode": "TRANSITION_MODE_ASYNC"},
    }


def _served(loader: HotLoader, hot_load_id: str, identity: str, stack: LocalStack, weights: Any) -> None:
    """Every replica serves ``identity``, and serves ``weights`` (the trainer's) byte for byte.

    The bytes are checked by the tests' reference reader (tests/_reference_snapshot.py): the
    snapshot chain decoded from the bucket without cwtrain's codec, and each replica's weights.
    """
    replicas = loader.verify_served(hot_load_id, identity)
    assert len(replicas) == 2
    assert all(r.state is ReplicaState.READY and r.current_snapshot_identity == identity for r in replicas)
    check_served(stack, loader.deployment_id, "hotload", identity, weights)


@pytest.mark.slow
def test_python_api_sequence(stack: LocalStack, api: InferenceClient, tmp_path: Path) -> None:
    gateway = lifecycle.create_gateway(api, _gateway_request("e2e-gw", stack))
    gateway = lifecycle.wait_for_gateway(api, gateway.id, timeout=60, poll_interval=POLL)
    assert gateway.endpoints
    dep = lifecycle.create_deployment(api, _deployment_request("e2e-dep", gateway.id, stack))
    dep = lifecycle.wait_for_deployment(api, dep.id, timeout=120, poll_interval=POLL)
    assert dep.status is ResourceStatus.READY and dep.hot_load is not None
    view = lifecycle.deployment_view(api, dep)
    assert view["rollout_base_url"] == lifecycle.rollout_base_url(gateway.endpoints[0])

    loader = HotLoader(api, dep.id, s3=stack.s3_client(), timeout=120, poll_interval=POLL)
    assert loader.current_identity() == "initial"
    assert loader.check_snapshot_access() == f"s3://{stack.bucket}/hotload/"

    # FULL from a checkpoint directory.
    write_base_checkpoint(tmp_path / "v0", seed=1)
    full = loader.publish(tmp_path / "v0", "py-v000000")
    assert full.state is HotLoadState.COMPLETED and full.type is SnapshotType.FULL
    v0 = checkpoint_weights(tmp_path / "v0")
    _served(loader, full.id, "py-v000000", stack, v0)

    # A delta from tensors in memory (no staging on disk), against exactly what is served.
    base = {
        name: TensorData(t.dtype, t.shape, bytes(memoryview(t.data)))
        for name, t in load_full_dir(tmp_path / "v0").items()
    }
    new = dict(base)
    name = sorted(base)[0]
    changed = np.frombuffer(base[name].data, dtype=np.uint8).copy()
    changed[::2] ^= 1  # the low mantissa byte of each BF16 value: a small change
    new[name] = TensorData(base[name].dtype, base[name].shape, changed.tobytes())
    stack.faults.api.drop_next(1, method="POST", path="/hotLoads$")  # created, but the answer is lost
    delta = loader.publish(new, "py-v000001", previous_identity="py-v000000", base=base)
    assert [h.id for h in loader.list() if h.identity == "py-v000001"] == [delta.id]  # adopted, not doubled
    assert delta.state is HotLoadState.COMPLETED and delta.type is SnapshotType.INCREMENTAL
    _served(loader, delta.id, "py-v000001", stack, new)

    listed = loader.list()
    assert [h.identity for h in listed[:2]] == ["py-v000001", "py-v000000"]
    status = loader.status(delta.id)
    assert status.hot_load.previous_identity == "py-v000000" and len(status.replicas) == 2
    assert loader.current_identity() == "py-v000001"

    # Single-flight: a hot-load created while another runs waits for it, then goes through.
    first = loader.rollback("py-v000000", wait=False)
    again = loader.trigger("py-v000001", previous_identity="py-v000000")
    assert api.get_hot_load(first.id).terminal
    assert loader.wait(again.id).state is HotLoadState.COMPLETED
    _served(loader, again.id, "py-v000001", stack, new)

    back = loader.rollback("py-v000000")
    assert back.state is HotLoadState.COMPLETED and back.type is SnapshotType.FULL and back.id != full.id
    _served(loader, back.id, "py-v000000", stack, v0)
    assert loader.current_identity() == "py-v000000"

    assert lifecycle.delete_deployment(api, dep.id, timeout=60, poll_interval=POLL) is True
    with pytest.raises(NotFoundError):
        api.get_deployment(dep.id)
    assert lifecycle.delete_gateway(api, gateway.id, timeout=60, poll_interval=POLL) is True
    assert lifecycle.delete_deployment(api, dep.id, timeout=5, poll_interval=POLL) is False


def test_lost_create_response_yields_exactly_one_deployment(stack: LocalStack, api: InferenceClient) -> None:
    gateway = lifecycle.create_gateway(api, _gateway_request("lost-gw", stack))
    api.sleep = lambda seconds: None
    stack.faults.api.drop_next(1, method="POST", path="/deployments$")
    dep = lifecycle.create_deployment(
        api, _deployment_request("lost-dep", gateway.id, stack, prefix="lost", replicas=1)
    )
    assert ("drop", "POST", "/deployments") in [
        (k, m, p.removeprefix("/v1alpha1/inference")) for k, m, p in stack.faults.api.fired
    ]
    same_name = [d for d in api.list_deployments() if d.name == "lost-dep"]
    assert [d.id for d in same_name] == [dep.id]

    # The same id with another spec is a conflict naming both.
    with pytest.raises(AlreadyExistsError, match=f"{dep.id} is taken by deployment 'lost-dep'"):
        api.create_deployment(_deployment_request("other-name", gateway.id, stack), deployment_id=dep.id)
    # Another id with the same name names the owner.
    with pytest.raises(AlreadyExistsError, match=dep.id):
        api.create_deployment(_deployment_request("lost-dep", gateway.id, stack))
    lifecycle.delete_deployment(api, dep.id, timeout=60, poll_interval=POLL)
    lifecycle.delete_gateway(api, gateway.id, timeout=60, poll_interval=POLL)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


@pytest.mark.slow
def test_cli_sequence(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in stack.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("COREWEAVE_API_TOKEN", stack.token)
    gw_file = tmp_path / "gateway.json"
    gw_file.write_text(json.dumps({"id": str(uuid.uuid4()), **_gateway_request("cli-gw", stack)}))
    code, gateway = _cli(capsys, "gateway", "create", "-f", str(gw_file), "--wait", "--poll-interval", "0.1")
    assert code == 0 and gateway["status"] == "READY" and gateway["endpoints"]

    dep_file = tmp_path / "deployment.json"
    dep_file.write_text(json.dumps(_deployment_request("cli-dep", gateway["id"], stack, prefix="cli")))
    code, dep = _cli(
        capsys, "deployment", "create", "-f", str(dep_file), "--wait", "--timeout", "120", "--poll-interval", "0.1"
    )
    assert code == 0 and dep["status"] == "READY"
    assert dep["hot_load"] == {"bucket": stack.bucket, "path_prefix": "cli", "transition_mode": "ASYNC"}
    assert dep["rollout_base_url"].endswith("/v1")
    code, got = _cli(capsys, "deployment", "get", dep["id"])
    assert code == 0 and got["id"] == dep["id"] and got["rollout_base_url"] == dep["rollout_base_url"]

    code, check = _cli(capsys, "hotload", "check", "--deployment", dep["id"])
    assert code == 0 and check == {
        "deployment": dep["id"],
        "bucket": stack.bucket,
        "path_prefix": "cli",
        "uri": f"s3://{stack.bucket}/cli/",
        "result": "ok",
    }

    write_base_checkpoint(tmp_path / "v0", seed=3)
    write_base_checkpoint(tmp_path / "v1", seed=4)
    write_delta(tmp_path / "v0", tmp_path / "v1", tmp_path / "d1", version="000001", base_version="000000")
    code, info = _cli(capsys, "hotload", "inspect", str(tmp_path / "d1"), "--previous-identity", "cli-v000000")
    assert code == 0 and info["type"] == "INCREMENTAL"

    poll = ("--poll-interval", "0.1")
    code, full = _cli(
        capsys,
        "hotload",
        "publish",
        "--deployment",
        dep["id"],
        "--checkpoint",
        str(tmp_path / "v0"),
        "--identity",
        "cli-v000000",
        *poll,
    )
    assert code == 0 and full["status"]["state"] == "COMPLETED" and full["spec"]["type"] == "FULL"
    code, delta = _cli(
        capsys,
        "hotload",
        "publish",
        "--deployment",
        dep["id"],
        "--checkpoint",
        str(tmp_path / "d1"),
        "--identity",
        "cli-v000001",
        "--previous-identity",
        "cli-v000000",
        *poll,
    )
    assert code == 0 and delta["spec"]["type"] == "INCREMENTAL"
    assert delta["spec"]["incremental_snapshot_metadata"]["previous_snapshot_identity"] == "cli-v000000"
    check_served(stack, dep["id"], "cli", "cli-v000001", checkpoint_weights(tmp_path / "v1"))

    code, status = _cli(capsys, "hotload", "status", delta["spec"]["id"])
    assert code == 0 and len(status["replicas"]) == 2
    assert {r["current_snapshot_identity"] for r in status["replicas"]} == {"cli-v000001"}
    code, listed = _cli(capsys, "hotload", "list", "--deployment", dep["id"], "--limit", "1")
    assert code == 0 and [h["spec"]["identity"] for h in listed] == ["cli-v000001"]

    code, back = _cli(capsys, "hotload", "rollback", "--deployment", dep["id"], "--identity", "cli-v000000", *poll)
    assert code == 0 and back["status"]["state"] == "COMPLETED" and back["spec"]["identity"] == "cli-v000000"
    code, waited = _cli(capsys, "hotload", "wait", back["spec"]["id"], *poll)
    assert code == 0 and waited["spec"]["id"] == back["spec"]["id"]
    code, status = _cli(capsys, "hotload", "status", back["spec"]["id"])
    assert {r["current_snapshot_identity"] for r in status["replicas"]} == {"cli-v000000"}
    check_served(stack, dep["id"], "cli", "cli-v000000", checkpoint_weights(tmp_path / "v0"))

    code, trig = _cli(
        capsys,
        "hotload",
        "trigger",
        "--deployment",
        dep["id"],
        "--identity",
        "cli-v000001",
        "--previous-identity",
        "cli-v000000",
        "--no-wait",
    )
    assert code == 0 and trig["status"]["state"] in ("PENDING", "IN_PROGRESS", "COMPLETED")
    code, waited = _cli(capsys, "hotload", "wait", trig["spec"]["id"], *poll)
    assert code == 0 and waited["status"]["state"] == "COMPLETED"

    code, deleted = _cli(capsys, "deployment", "delete", dep["id"], "--wait", "--poll-interval", "0.1")
    assert code == 0 and deleted == {"id": dep["id"], "result": "deleted"}
    code, _ = _cli(capsys, "deployment", "get", dep["id"])
    assert code == 1
    code, gone = _cli(capsys, "deployment", "delete", dep["id"], "--ignore-not-found")
    assert code == 0 and gone["result"] == "not_found"
    code, deleted = _cli(capsys, "gateway", "delete", gateway["id"], "--wait", "--poll-interval", "0.1")
    assert code == 0 and deleted["result"] == "deleted"

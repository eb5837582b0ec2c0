"""Control-plane faults during deployment create, hot-load trigger and wait.

Each case arms one fault in the local control plane (503 ``unavailable``, a delay past the
client's timeout, or a response dropped after the server acted) and checks that the
client's retries with client-chosen ids leave exactly one resource and that waits survive.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _faults_trainer import Trainer

from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient, lifecycle
from cwtrain.infra.enums import HotLoadState, ReplicaState
from cwtrain.local import LocalStack

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

POLL = 0.1


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("faults-api", replicas=2) as local:
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="faults-api")


@pytest.fixture
def api(stack: LocalStack) -> Iterator[InferenceClient]:
    with InferenceClient(stack.token, base_url=stack.api_url, timeout=1.0) as client:
        client.sleep = lambda seconds: None  # retries without the backoff sleeps
        yield client


@pytest.fixture(scope="module")
def trainer(stack: LocalStack, target: Any) -> Iterator[Trainer]:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in stack.env().items():
            patch.setenv(key, value)
        client = InferenceClient(stack.token, base_url=stack.api_url, timeout=1.0)
        client.sleep = lambda seconds: None
        loader = HotLoader(client, deployment_id=target.deployment_id, timeout=120, poll_interval=POLL)
        trainer = Trainer(loader, run="api-faults")
        trainer.publish(full=True)
        yield trainer
        client.close()


def _arm(stack: LocalStack, kind: str, method: str, path: str) -> None:
    faults = stack.faults.api
    if kind == "503":
        faults.fail_next(2, code="unavailable", method=method, path=path)
    elif kind == "timeout":
        faults.delay_next(1, seconds=2.5, method=method, path=path)
    else:
        faults.drop_next(1, method=method, path=path)


KINDS = ["503", "timeout", "lost"]


@pytest.mark.fault_row("api-create")
@pytest.mark.parametrize("kind", KINDS)
def test_deployment_create_survives(kind: str, stack: LocalStack, target: Any, api: InferenceClient) -> None:
    name = f"create-{kind}-{uuid.uuid4().hex[:6]}"
    body = {
        "name": name,
        "gatewayIds": [target.gateway_id],
        "runtime": {"engine": "dynamo-vllm", "version": "1.2.3", "engineConfig": {}, "engineEnv": {}},
        "resources": {"instanceType": "CPU_LOCAL", "gpuCount": 1},
        "model": {"name": f"{name}-m", "bucket": stack.bucket, "path": "base/faults-api"},
        "autoscaling": {"min": 1, "max": 1, "concurrency": 8},
        "traffic": {"weight": 100},
        "hotLoad": {"bucket": stack.bucket, "pathPrefix": name, "transitionMode": "TRANSITION_MODE_ASYNC"},
    }
    fired = len(stack.faults.api.fired)
    _arm(stack, kind, "POST", r"^/deployments$")
    dep = lifecycle.create_deployment(api, body)
    assert len(stack.faults.api.fired) > fired, "the fault did not fire"
    assert [d.id for d in api.list_deployments() if d.name == name] == [dep.id]
    assert lifecycle.delete_deployment(api, dep.id, timeout=60, poll_interval=POLL) is True


@pytest.mark.fault_row("api-trigger")
@pytest.mark.parametrize("kind", KINDS)
def test_hot_load_trigger_survives(kind: str, stack: LocalStack, trainer: Trainer, api: InferenceClient) -> None:
    trainer.step()
    identity = trainer.identity()
    fired = len(stack.faults.api.fired)
    _arm(stack, kind, "POST", r"^/hotLoads$")
    hot_load = trainer.publish()
    assert len(stack.faults.api.fired) > fired, "the fault did not fire"
    assert hot_load.state is HotLoadState.COMPLETED
    same = [h.id for h in api.list_hot_loads(trainer.loader.deployment_id) if h.identity == identity]
    assert same == [hot_load.id]


@pytest.mark.fault_row("api-wait")
@pytest.mark.parametrize("kind", KINDS)
def test_wait_survives(kind: str, stack: LocalStack, trainer: Trainer) -> None:
    trainer.step()
    identity = trainer.identity()
    fired = len(stack.faults.api.fired)
    path = r"^/hotLoads/[^/:]+(/replicas)?$"
    if kind == "503":
        stack.faults.api.fail_next(4, code="unavailable", method="GET", path=path)
    elif kind == "timeout":
        stack.faults.api.delay_next(2, seconds=2.5, method="GET", path=path)
    else:
        stack.faults.api.drop_next(2, method="GET", path=path)
    hot_load = trainer.publish()
    assert len(stack.faults.api.fired) > fired, "the fault did not fire"
    assert hot_load.state is HotLoadState.COMPLETED
    replicas = trainer.loader.verify_served(hot_load.id, identity)
    assert len(replicas) == 2 and all(r.state is ReplicaState.READY for r in replicas)

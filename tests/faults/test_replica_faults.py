"""Replicas that misbehave on one hot-load (``stack.faults.replicas``), on a 2-replica deployment.

A replica that fails to load leaves the hot-load FAILED with its reason while its peer keeps
the new identity (no rollback: the fleet serves a mix until a later hot-load); a replica that
reports success but stays on the old identity leaves a COMPLETED hot-load that verification
refuses, and the gateway keeps routing to it. In both cases a later hot-load (here a
re-activation) brings every replica onto one identity. The faults fire at a chosen version
and only there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _faults_trainer import Trainer

from cwtrain.errors import HotLoadFailedError, HotLoadVerificationError
from cwtrain.hotload import follow
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState, ReplicaState
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import Tokenizer

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

POLL = 0.1
TOK = Tokenizer()


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("faults-replicas", replicas=2) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="faults-replicas")  # each test publishes a run of its own (a FULL first)


@pytest.fixture(autouse=True)
def _no_faults(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    stack.faults.replicas.clear()
    # A replica left behind is given 1 s to catch up after COMPLETED, not the library's 30 s:
    # the local one never will, and what is checked is what follows the wait.
    monkeypatch.setattr(follow, "CATCH_UP_SECONDS", 1.0)


def _trainer(stack: LocalStack, target: Any, run: str) -> Trainer:
    client = InferenceClient(stack.token, base_url=stack.api_url)
    trainer = Trainer(HotLoader(client, deployment_id=target.deployment_id, timeout=180, poll_interval=POLL), run=run)
    trainer.publish(full=True)
    return trainer


def _served(stack: LocalStack, target: Any, requests: int = 8) -> list[str]:
    """The identity that answered each of ``requests`` completions through the gateway (round-robin)."""
    seen = []
    with httpx.Client(headers={"Authorization": f"Bearer {stack.token}"}, timeout=60) as http:
        for _ in range(requests):
            body = {"model": target.model, "prompt": TOK.encode("hi"), "max_tokens": 1}
            response = http.post(target.base_url + "/completions", json=body)
            assert response.status_code == 200, response.text
            seen.append(response.headers["x-cwtrain-snapshot-identity"])
    return seen


def _replicas(trainer: Trainer, hot_load_id: str) -> dict[str, tuple[ReplicaState, str | None, str | None]]:
    return {
        r.name: (r.state, r.current_snapshot_identity, r.error_reason)
        for r in trainer.loader.client.list_hot_load_replicas(hot_load_id)
    }


def _converged(trainer: Trainer, identity: str, timeout: float = 60.0) -> None:
    latest = trainer.loader.latest_completed()
    assert latest is not None and latest.identity == identity
    deadline = time.monotonic() + timeout
    while True:
        try:
            trainer.loader.verify_served(latest.id, identity)
            return
        except HotLoadVerificationError:
            assert time.monotonic() < deadline, _replicas(trainer, latest.id)
            time.sleep(POLL)


@pytest.mark.fault_row("replica-load-fails")
def test_a_replica_that_fails_to_load_fails_the_hot_load_and_leaves_a_mix(stack: LocalStack, target: Any) -> None:
    trainer = _trainer(stack, target, "mixfail")  # v0 FULL
    stack.faults.replicas.fail_load(index=1, identity=trainer.identity(2))  # at version 2 only
    trainer.step()
    assert trainer.publish().state is HotLoadState.COMPLETED  # v1: not this version
    assert stack.faults.replicas.fired == []
    trainer.step()
    with pytest.raises(HotLoadFailedError) as failed:
        trainer.publish()  # v2
    assert stack.faults.replicas.fired == [("fail", _name(failed), "mixfail-v000002")]
    rows = _replicas(trainer, failed.value.hot_load.id)
    (bad,) = [name for name, (state, _, _) in rows.items() if state is ReplicaState.ERROR]
    assert rows[bad][1] == "mixfail-v000001" and "injected fault" in str(rows[bad][2])
    assert "injected fault" in str(failed.value) and bad in str(failed.value)
    (good,) = set(rows) - {bad}
    assert rows[good][:2] == (ReplicaState.READY, "mixfail-v000002")
    # no rollback: the peer keeps the new identity beside the old one, and both take traffic
    assert set(_served(stack, target)) == {"mixfail-v000001", "mixfail-v000002"}
    assert stack.faults.replicas.pending() == []
    # a later hot-load reaches every replica: re-activating the last good identity converges the fleet
    trainer.loader.rollback("mixfail-v000001")
    _converged(trainer, "mixfail-v000001")
    assert set(_served(stack, target)) == {"mixfail-v000001"}


def _name(failed: pytest.ExceptionInfo[HotLoadFailedError]) -> str:
    (bad,) = [r.name for r in failed.value.replicas if r.state is ReplicaState.ERROR]
    return bad


@pytest.mark.fault_row("replica-stays-behind")
def test_a_replica_that_stays_behind_completes_the_hot_load_but_fails_verification(
    stack: LocalStack, target: Any
) -> None:
    trainer = _trainer(stack, target, "behind")  # v0 FULL
    stack.faults.replicas.stay_behind(index=0, deployment_id=target.deployment_id)  # the next hot-load
    trainer.step()
    with pytest.raises(HotLoadVerificationError, match="the fleet is split") as split:
        trainer.publish()  # v1: whatever the settings, a split fleet fails the publish
    hot_load = split.value.hot_load
    assert hot_load.state is HotLoadState.COMPLETED  # the replica said it is done
    (kind, replica, identity), *more = stack.faults.replicas.fired
    assert replica in str(split.value) and "behind-v000000" in str(split.value)
    assert (kind, identity, more) == ("stay-behind", "behind-v000001", [])
    rows = _replicas(trainer, hot_load.id)
    assert rows[replica][:2] == (ReplicaState.READY, "behind-v000000")  # its row says what it serves
    with pytest.raises(HotLoadVerificationError) as refused:
        trainer.loader.verify_served(hot_load.id, "behind-v000001")
    assert replica in str(refused.value) and "behind-v000000" in str(refused.value)
    assert set(_served(stack, target)) == {"behind-v000000", "behind-v000001"}  # still routed to
    trainer.loader.rollback("behind-v000001")  # re-activation reaches the replica left behind
    _converged(trainer, "behind-v000001")
    assert set(_served(stack, target)) == {"behind-v000001"}

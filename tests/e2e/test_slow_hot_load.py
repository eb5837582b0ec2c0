"""``cwtrain local up --slow-hot-load``: a hot-load slow enough to watch with ``hotload wait`` and to cancel.

A local hot-load ends in well under a second, so ``cwtrain hotload cancel`` could never be seen
working. With ``LocalStack(hot_load_delay=S)`` (what ``--slow-hot-load S`` starts) every replica
stays UPDATING for S seconds before it swaps; the cancel ends that wait on every replica, which
keeps serving what it served, and the deployment's identity stays the previous one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cwtrain.cli import main
from cwtrain.errors import HotLoadTimeoutError
from cwtrain.hotload import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import HotLoadState
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import ModelConfig, init_weights

pytestmark = pytest.mark.e2e
DELAY = 60.0  # far longer than the test: the replicas can only be back on "initial" early because of the cancel


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[LocalStack, Any]]:
    with LocalStack(replicas=2, hot_load_delay=DELAY) as stack:
        yield stack, stack.deploy(name="slow", replicas=2, timeout=120)


def test_the_local_up_flag_reaches_the_stack() -> None:
    from cwtrain.cli import build_parser

    args = build_parser().parse_args(["local", "up", "--slow-hot-load", "30"])
    assert args.slow_hot_load == 30.0
    assert build_parser().parse_args(["local", "up"]).slow_hot_load == 0.0


def test_a_slow_hot_load_shows_progress_and_is_canceled(
    slow: tuple[LocalStack, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack, target = slow
    for key, value in stack.env().items():
        monkeypatch.setenv(key, value)
    client = InferenceClient(stack.token, base_url=stack.api_url)
    loader = HotLoader(client, target.deployment_id, s3=stack.s3_client(), timeout=120)
    config = {"config.json": json.dumps(ModelConfig().to_json()).encode()}
    hot_load = loader.publish(init_weights(seed=7), "slow-v000001", wait=False, extra_files=config)
    started = time.monotonic()

    # `hotload wait` sees it in progress, every replica updating, until its own timeout
    events: list[Any] = []
    with pytest.raises(HotLoadTimeoutError, match=r"0/2 replicas ready"):
        loader.wait(hot_load.id, timeout=3, on_progress=events.append)
    assert events and events[-1].hot_load.state is HotLoadState.IN_PROGRESS
    assert events[-1].summary().startswith("in_progress after") and "updating=2" in events[-1].summary()
    assert main(["hotload", "wait", hot_load.id, "--timeout", "1"]) == 1
    assert "did not finish within 1s (0/2 replicas ready)" in capsys.readouterr().err

    # `hotload cancel`: CANCELED at once, and the replicas stop loading and keep serving "initial"
    assert main(["hotload", "cancel", hot_load.id]) == 0
    assert json.loads(capsys.readouterr().out)["status"]["state"] == "CANCELED"
    assert loader.wait(hot_load.id, raise_on_failure=False).state is HotLoadState.CANCELED
    supervisor = stack._supervisor
    assert supervisor is not None
    deadline = time.monotonic() + 20
    while True:
        health = [slot.health() or {} for slot in supervisor.slots[target.deployment_id]]
        if all(h.get("state") == "READY" for h in health) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [(h.get("state"), h.get("identity")) for h in health] == [("READY", "initial")] * 2
    assert time.monotonic() - started < DELAY  # stopped by the cancel, not by the end of the delay
    answer = httpx.post(
        target.base_url + "/completions",
        json={"model": target.model, "prompt": "x", "max_tokens": 1},
        headers={"Authorization": f"Bearer {stack.token}"},
        timeout=30,
    )
    assert answer.headers["x-cwtrain-snapshot-identity"] == "initial"
    assert loader.current_identity() == "initial"
    client.close()

"""``LocalStack`` leaves nothing running, even when the block raises or is interrupted."""

from __future__ import annotations

import os

import httpx
import pytest
from _stack_util import FAKE_REPLICA, seed_fake_base

from cwtrain.local import LocalStack


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0); it is not running
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_nothing_survives_an_exception(exc_type: type[BaseException]) -> None:
    seen: dict[str, object] = {}
    with pytest.raises(exc_type), LocalStack(replicas=2, replica_command=FAKE_REPLICA) as stack:
        seed_fake_base(stack.s3_client(), stack.bucket)
        gateway = stack.api(
            "POST",
            "/gateways",
            {"name": "gw", "zones": [stack.region], "coreWeaveAuth": {}, "bodyBasedRouting": {}},
        )[1]["gateway"]
        stack.wait_ready("gateway", gateway["spec"]["id"])
        body = {
            "name": "dep",
            "gatewayIds": [gateway["spec"]["id"]],
            "runtime": {"engine": "dynamo-vllm", "version": "1.2.3"},
            "resources": {"instanceType": "X", "gpuCount": 1},
            "model": {"name": "fake-model", "bucket": stack.bucket, "path": "base/fake"},
            "autoscaling": {"min": 2, "max": 2},
            "traffic": {"weight": 100},
        }
        deployment = stack.api("POST", "/deployments", body)[1]["deployment"]
        stack.wait_ready("deployment", deployment["spec"]["id"])
        slots = stack.supervisor.slots[deployment["spec"]["id"]]
        seen["pids"] = [s.process.pid for s in slots if s.process is not None]
        gateway_url = stack.api("GET", f"/gateways/{gateway['spec']['id']}")[1]["gateway"]["status"]["endpoints"][0]
        seen["urls"] = [stack.api_url, stack.s3_endpoint, stack.supervisor.s3_endpoint, gateway_url]
        seen["workdir"] = stack.workdir
        raise exc_type("boom")
    pids = seen["pids"]
    assert isinstance(pids, list) and len(pids) == 2
    assert not any(_alive(pid) for pid in pids)
    urls = seen["urls"]
    assert isinstance(urls, list) and len(urls) == 4
    assert not any(_answers(str(url)) for url in urls)
    assert not os.path.exists(str(seen["workdir"]))

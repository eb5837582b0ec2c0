"""The local control plane over real HTTP: auth, gateways, deployments, validation, faults.

Replicas are ``fake_replica.py`` processes (stdlib only, fast to start); the real engine
replica is covered in ``tests/e2e``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from _stack_util import (
    API,
    FAKE_REPLICA,
    deployment_body,
    gateway_body,
    seed_fake_base,
    wait_for,
    wait_status,
)

from cwtrain.local import LocalStack


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    # A stack of its own: fake replicas (a replica command is per stack), and the organisation flag flips.
    with LocalStack(replicas=1, replica_command=FAKE_REPLICA) as stack:
        seed_fake_base(stack.s3_client(), stack.bucket)
        yield stack


@pytest.fixture(scope="module")
def api(stack: LocalStack) -> API:
    return API(stack.api_url, stack.token)


@pytest.fixture(scope="module")
def gateway(api: API) -> dict[str, Any]:
    created = api.ok("POST", "/gateways", gateway_body("main-gw"))["gateway"]
    return wait_status(api, "gateway", created["spec"]["id"], "STATUS_READY")


def test_auth_is_required_and_roles_apply(stack: LocalStack, api: API) -> None:
    anonymous = API(stack.api_url, None)
    status, code, message = anonymous.error("GET", "/gateways")
    assert (status, code) == (401, "unauthenticated") and "bearer" in message
    status, code, _ = API(stack.api_url, "not-the-token").error("GET", "/deployments")
    assert (status, code) == (401, "unauthenticated")
    viewer = API(stack.api_url, stack.viewer_token)
    assert "items" in viewer.ok("GET", "/gateways")
    status, code, _ = viewer.error("POST", "/gateways", gateway_body("viewer-gw"))
    assert (status, code) == (403, "permission_denied")
    assert all(g["spec"]["name"] != "viewer-gw" for g in api.ok("GET", "/gateways")["items"])


def test_unknown_routes_and_methods(api: API) -> None:
    assert api.error("GET", "/nothing")[:2] == (404, "not_found")
    assert api.error("DELETE", "/hotLoads")[1] == "unimplemented"
    status, payload = api.call("POST", "/gateways", None)
    assert status == 400 and payload["code"] == "invalid_argument"


def test_gateway_lifecycle_and_parameters(api: API, gateway: dict[str, Any]) -> None:
    zones = api.ok("GET", "/gateways/parameters")["zones"]
    assert "US-EAST-04A" in zones
    assert gateway["status"]["endpoints"][0].startswith("http://127.0.0.1:")
    assert gateway["spec"]["organizationId"]
    listed = api.ok("GET", "/gateways")["items"]
    assert gateway["spec"]["id"] in [g["spec"]["id"] for g in listed]
    later = datetime.now(UTC).isoformat()
    assert api.ok("GET", "/gateways", updatedAfter=later)["items"] == []

    body = gateway_body("short-lived", zone=zones[-1])
    created = api.ok("POST", "/gateways", body)["gateway"]
    assert created["status"]["status"] == "STATUS_CREATING" and created["status"]["endpoints"] == []
    ready = wait_status(api, "gateway", body["id"], "STATUS_READY")
    endpoint = ready["status"]["endpoints"][0]
    assert httpx.get(endpoint + "/v1/models", headers={"Authorization": "Bearer x"}).status_code == 401
    assert api.ok("DELETE", f"/gateways/{body['id']}") == {}
    wait_for(lambda: api.call("GET", f"/gateways/{body['id']}")[0] == 404, what="gateway gone")
    assert api.error("GET", f"/gateways/{body['id']}")[1] == "not_found"
    with pytest.raises(httpx.TransportError):
        httpx.get(endpoint + "/v1/models", timeout=2)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"zones": ["US-EAST-04A", "US-WEST-01A"]}, "exactly one zone"),
        ({"zones": ["MARS-01A"]}, "not a valid zone"),
        ({"name": "bad_name"}, "name"),
        ({"coreWeaveAuth": None}, "coreWeaveAuth"),
        ({"pathBasedRouting": {}}, "exactly one of bodyBasedRouting"),
        ({"id": "has/slash"}, "id"),
    ],
)
def test_gateway_validation(api: API, change: dict[str, Any], needle: str) -> None:
    body = {k: v for k, v in {**gateway_body("valid-name"), **change}.items() if v is not None}
    status, code, message = api.error("POST", "/gateways", body)
    assert (status, code) == (400, "invalid_argument")
    assert needle in message


def test_gateway_client_ids_and_names_are_unique(api: API, gateway: dict[str, Any]) -> None:
    again = gateway_body("other-name")
    again["id"] = gateway["spec"]["id"]
    assert api.error("POST", "/gateways", again)[:2] == (409, "already_exists")
    status, code, message = api.error("POST", "/gateways", gateway_body("main-gw"))
    assert (status, code) == (409, "already_exists") and gateway["spec"]["id"] in message


def _valid(stack: LocalStack, gateway: dict[str, Any], name: str) -> dict[str, Any]:
    return deployment_body(name, [gateway["spec"]["id"]], stack.bucket, replicas=1)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("name",), "-bad", "name"),
        (("gatewayIds",), [], "gatewayIds"),
        (("resources", "gpuCount"), 3, "gpuCount"),
        (("model", "name"), "abc", "model.name"),
        (("runtime", "version"), "latest", "semantic version"),
        (("runtime", "engine"), "tgi", "runtime.engine"),
        (("runtime", "engine"), "vllm", "dynamo-vllm"),
        (("hotLoad", "transitionMode"), "TRANSITION_MODE_UNSPECIFIED", "TRANSITION_MODE_ASYNC"),
        (("hotLoad", "pathPrefix"), "a/../b", ".."),
        (("autoscaling",), None, "autoscaling is required"),
        (("traffic", "weight"), 101, "traffic.weight"),
    ],
)
def test_deployment_validation(
    stack: LocalStack, api: API, gateway: dict[str, Any], path: tuple[str, ...], value: Any, needle: str
) -> None:
    body = _valid(stack, gateway, "invalid-one")
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    status, code, message = api.error("POST", "/deployments", body)
    assert (status, code) == (400, "invalid_argument"), message
    assert needle in message
    assert api.error("GET", f"/deployments/{body['id']}")[1] == "not_found"


def test_deployment_preconditions(stack: LocalStack, api: API, gateway: dict[str, Any]) -> None:
    other_zone = api.ok("POST", "/gateways", gateway_body("west-gw", zone="US-WEST-01A"))["gateway"]
    body = _valid(stack, gateway, "two-zones")
    body["gatewayIds"].append(other_zone["spec"]["id"])
    status, code, message = api.error("POST", "/deployments", body)
    assert (status, code) == (400, "failed_precondition") and "one zone" in message

    body = _valid(stack, gateway, "no-weights")
    body["model"]["path"] = "base/missing"
    status, code, message = api.error("POST", "/deployments", body)
    assert code == "failed_precondition" and "base/missing/config.json" in message

    body = _valid(stack, gateway, "unknown-gw")
    body["gatewayIds"] = ["no-such-gateway"]
    assert api.error("POST", "/deployments", body)[1] == "invalid_argument"

    assert stack.state is not None
    stack.state.hot_load_enabled = False
    try:
        status, code, message = api.error("POST", "/deployments", _valid(stack, gateway, "flag-off"))
        assert (code, message) == ("failed_precondition", "hot-load is not enabled for this organization")
        plain = _valid(stack, gateway, "plain-deployment")
        del plain["hotLoad"]
        plain["model"]["name"] = "plain-model"
        plain["runtime"]["engine"] = "vllm"
        plain["runtime"]["version"] = "0.11.0"
        created = api.ok("POST", "/deployments", plain)["deployment"]
        assert "hotLoad" not in created["spec"]
    finally:
        stack.state.hot_load_enabled = True
    wait_status(api, "deployment", plain["id"], "STATUS_READY")
    api.ok("DELETE", f"/deployments/{plain['id']}")
    wait_for(lambda: api.call("GET", f"/deployments/{plain['id']}")[0] == 404, what="plain deployment gone")
    api.ok("DELETE", f"/gateways/{other_zone['spec']['id']}")


def test_deployment_lifecycle(stack: LocalStack, api: API, gateway: dict[str, Any]) -> None:
    body = _valid(stack, gateway, "lifecycle")
    created = api.ok("POST", "/deployments", body)["deployment"]
    assert created["status"]["status"] == "STATUS_CREATING"
    assert created["spec"]["hotLoad"]["transitionMode"] == "TRANSITION_MODE_ASYNC"
    assert api.error("POST", "/deployments", body)[:2] == (409, "already_exists")
    renamed = copy.deepcopy(body)
    renamed["id"] = "another-id"
    _, code, message = api.error("POST", "/deployments", renamed)
    assert code == "already_exists" and body["id"] in message

    ready = wait_status(api, "deployment", body["id"], "STATUS_READY")
    conditions = {c["type"]: c for c in ready["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["Ready"]["zone"] == "US-EAST-04A"
    gateway_id = gateway["spec"]["id"]
    listed = api.ok("GET", "/deployments", parentGatewayId=gateway_id)["items"]
    assert body["id"] in [d["spec"]["id"] for d in listed]
    assert api.ok("GET", "/deployments", parentGatewayId="elsewhere")["items"] == []

    params = api.ok("GET", "/deployments/parameters", gatewayIds=[gateway_id])
    # the public API reference's shape: gateways, runtime versions and config keys per engine, instance types
    assert set(params) == {"gatewayIds", "runtimeParameters", "resourceParameters"}
    assert params["gatewayIds"] == [gateway_id]
    runtime = params["runtimeParameters"]
    assert set(runtime) == {"runtimeVersions", "runtimeConfigOptions", "engineEnvOptions"}
    assert body["runtime"]["version"] in runtime["runtimeVersions"]["dynamo-vllm"]["versions"]
    assert "max-model-len" in runtime["runtimeConfigOptions"]["dynamo-vllm"]["allowedKeys"]
    assert "VLLM_LOGGING_LEVEL" in runtime["engineEnvOptions"]["dynamo-vllm"]["allowedNames"]
    assert body["resources"]["instanceType"] in params["resourceParameters"]["instanceTypes"]
    every = api.ok("GET", "/deployments/parameters")  # no filter: every gateway of the organisation
    assert gateway_id in every["gatewayIds"] and every["runtimeParameters"] == runtime
    assert api.error("GET", "/deployments/parameters", gatewayIds=["nope"])[1] == "not_found"

    _, code, message = api.error("DELETE", f"/gateways/{gateway_id}")
    assert code == "failed_precondition" and body["id"] in message

    changed = {"hotLoad": {"bucket": stack.bucket, "pathPrefix": "other", "transitionMode": "TRANSITION_MODE_ASYNC"}}
    _status, code, message = api.error("PATCH", f"/deployments/{body['id']}", changed)
    assert code == "failed_precondition" and "only be set when a deployment is created" in message
    patched = api.ok("PATCH", f"/deployments/{body['id']}", {"traffic": {"weight": 50}})["deployment"]
    assert patched["spec"]["traffic"]["weight"] == 50

    assert api.ok("DELETE", f"/deployments/{body['id']}") == {}
    seen = api.call("GET", f"/deployments/{body['id']}")
    assert seen[0] == 404 or seen[1]["deployment"]["status"]["status"] == "STATUS_DELETING"
    wait_for(lambda: api.call("GET", f"/deployments/{body['id']}")[0] == 404, what="deployment gone")
    assert api.error("DELETE", f"/deployments/{body['id']}")[1] == "not_found"


def test_api_faults_fail_delay_and_drop(stack: LocalStack, api: API) -> None:
    faults = stack.faults.api
    faults.fail_next(2, code="unavailable", path=r"^/gateways$", method="GET")
    for _ in range(2):
        assert api.error("GET", "/gateways")[:2] == (503, "unavailable")
    assert "items" in api.ok("GET", "/gateways")

    faults.fail_next(1, code="internal", http_status=502)
    assert api.error("GET", "/gateways/parameters")[:2] == (502, "internal")

    faults.delay_next(1, seconds=0.4, path=r"^/gateways/parameters$")
    started = time.monotonic()
    api.ok("GET", "/gateways/parameters")
    assert time.monotonic() - started >= 0.4

    body = gateway_body("dropped-gw")
    faults.drop_next(1, method="POST", path=r"^/gateways$")
    with pytest.raises(httpx.TransportError):
        api.call("POST", "/gateways", body)
    assert api.ok("GET", f"/gateways/{body['id']}")["gateway"]["spec"]["name"] == "dropped-gw"  # it acted
    assert ("drop", "POST", "/gateways") in faults.fired
    assert faults.pending() == []
    api.ok("DELETE", f"/gateways/{body['id']}")


@pytest.mark.parametrize("routing", ["headerBasedRouting", "pathBasedRouting"])
def test_gateway_header_and_path_routing(stack: LocalStack, api: API, routing: str) -> None:
    name = routing.removesuffix("BasedRouting")
    body = gateway_body(f"{name}-gw")
    del body["bodyBasedRouting"]
    body[routing] = {"headerName": "x-model"} if routing == "headerBasedRouting" else {}
    gateway = api.ok("POST", "/gateways", body)["gateway"]
    endpoint = wait_status(api, "gateway", gateway["spec"]["id"], "STATUS_READY")["status"]["endpoints"][0]
    deployment = _valid(stack, {"spec": {"id": gateway["spec"]["id"]}}, f"{name}-routed")
    deployment["model"]["name"] = f"{name}-model"
    api.ok("POST", "/deployments", deployment)
    wait_status(api, "deployment", deployment["id"], "STATUS_READY")
    auth = {"Authorization": f"Bearer {stack.token}"}
    request = {"prompt": "x", "n": 2}
    if routing == "headerBasedRouting":
        ok = httpx.post(endpoint + "/v1/completions", json=request, headers={**auth, "x-model": f"{name}-model"})
        missing = httpx.post(endpoint + "/v1/completions", json=request, headers=auth)
        assert missing.status_code == 400 and "x-model" in missing.json()["error"]["message"]
    else:
        ok = httpx.post(f"{endpoint}/{name}-model/v1/completions", json=request, headers=auth)
        wrong = httpx.post(f"{endpoint}/other-model/v1/completions", json=request, headers=auth)
        assert wrong.status_code == 404
    assert ok.status_code == 200, ok.text
    assert ok.json()["system_fingerprint"] == "initial" and len(ok.json()["choices"]) == 2
    api.ok("DELETE", f"/deployments/{deployment['id']}")
    wait_for(lambda: api.call("GET", f"/deployments/{deployment['id']}")[0] == 404, what="routed deployment gone")
    api.ok("DELETE", f"/gateways/{gateway['spec']['id']}")


def test_patching_autoscaling_scales_the_replicas(stack: LocalStack, api: API, gateway: dict[str, Any]) -> None:
    body = _valid(stack, gateway, "scaled")
    body["model"]["name"] = "scaled-model"
    api.ok("POST", "/deployments", body)
    wait_status(api, "deployment", body["id"], "STATUS_READY")
    assert len(stack.supervisor.slots[body["id"]]) == 1
    api.ok("PATCH", f"/deployments/{body['id']}", {"autoscaling": {"min": 2, "max": 2}})

    def two_ready() -> bool:
        conditions = api.ok("GET", f"/deployments/{body['id']}")["deployment"]["status"]["conditions"]
        return any(c["type"] == "Progressing" and c["message"] == "2/2 replicas ready" for c in conditions)

    wait_for(two_ready, what="a second replica")
    names = [s.name for s in stack.supervisor.slots[body["id"]]]
    assert names == ["scaled-0", "scaled-1"]
    api.ok("DELETE", f"/deployments/{body['id']}")
    wait_for(lambda: api.call("GET", f"/deployments/{body['id']}")[0] == 404, what="scaled deployment gone")

"""Lifecycle helpers: placeholders, zone check, READY waits, deletes, rollout base URL."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import httpx
import pytest
from fakeapi import FakeAPI, error_response

from cwtrain.errors import LifecycleError, NotFoundError, PermissionDeniedError, UsageError
from cwtrain.infra import lifecycle
from cwtrain.infra.enums import ResourceStatus

REQUEST = {
    "name": "qwen3-4b-rl",
    "gatewayIds": ["gw-1"],
    "runtime": {
        "engine": "dynamo-vllm",
        "version": "1.2.3",
        "engineConfig": {"chat-template": "<think>"},
        "engineEnv": {"X": "<s>"},
    },
    "resources": {"instanceType": "H100_80GB_SXM5", "gpuCount": 1},
    "model": {"name": "qwen3-4b", "bucket": "w", "path": "p"},
    "autoscaling": {"min": 2, "max": 2},
    "traffic": {"weight": 100},
    "hotLoad": {"bucket": "w", "pathPrefix": "hotload", "transitionMode": "TRANSITION_MODE_ASYNC"},
}


# ------------------------------------------------------------------ placeholders


def test_placeholders_are_found_with_paths_except_engine_config() -> None:
    body = json.loads(json.dumps(REQUEST))
    body["model"]["bucket"] = "<your-bucket>"
    body["gatewayIds"] = ["ok", "<GATEWAY ID>"]
    body["<key>"] = 1  # keys do not count
    body["notes"] = ["<1>", "< x>", "a <b>"]
    assert lifecycle.find_placeholders(body) == [
        ("gatewayIds[1]", "<GATEWAY ID>"),
        ("model.bucket", "<your-bucket>"),
        ("notes[2]", "a <b>"),
    ]


def test_load_request_refuses_placeholders_listing_five(tmp_path: Path) -> None:
    body = {f"k{i}": f"<fill-{i}>" for i in range(7)}
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(body))
    with pytest.raises(UsageError) as info:
        lifecycle.load_request(path)
    text = str(info.value)
    assert text.startswith(f"fill in {path} first; it still has placeholders: k0 = '<fill-0>'")
    assert "k4" in text and "k5 =" not in text and "and 2 more" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [("[1, 2]", "must hold a JSON object"), ("{nope", "not valid JSON")],
)
def test_load_request_bad_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        lifecycle.load_request(path)
    with pytest.raises(UsageError, match="cannot read request file"):
        lifecycle.load_request(tmp_path / "missing.json")


def test_load_request_from_stdin() -> None:
    assert lifecycle.load_request("-", stdin=io.StringIO('{"name": "x"}')) == {"name": "x"}


# ----------------------------------------------------------------------- creates


def test_create_deployment_checks_zones_and_refuses_mixed_zones() -> None:
    fake = FakeAPI()
    fake.add_gateway("gw-1", zone="US-EAST-04A")
    fake.add_gateway("gw-2", zone="US-WEST-01A")
    api = fake.client()
    body = dict(REQUEST, gatewayIds=["gw-1", "gw-2"])
    with pytest.raises(UsageError, match="one zone"):
        lifecycle.create_deployment(api, body)
    assert not [c for c in fake.calls if c[0] == "POST"]
    dep = lifecycle.create_deployment(api, REQUEST)
    assert dep.name == "qwen3-4b-rl"


def test_create_deployment_without_hot_load_warns(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeAPI()
    body = {k: v for k, v in REQUEST.items() if k != "hotLoad"}
    with caplog.at_level(logging.WARNING):
        lifecycle.create_deployment(fake.client(), body, source="dep.json")
    assert any("no hotLoad" in r.getMessage() for r in caplog.records)


def test_create_deployment_adds_the_enable_hint() -> None:
    fake = FakeAPI()
    fake.add_gateway()
    fake.inject(
        "POST",
        "/deployments",
        error_response(403, "permission_denied", "hot-load is not enabled for this organization"),
    )
    with pytest.raises(PermissionDeniedError, match="ask CoreWeave support to enable RL Rollouts"):
        lifecycle.create_deployment(fake.client(), REQUEST)


def test_create_deployment_refuses_placeholders_before_any_call() -> None:
    fake = FakeAPI()
    with pytest.raises(UsageError):
        lifecycle.create_deployment(fake.client(), dict(REQUEST, name="<name>"))
    assert not fake.calls


# ------------------------------------------------------------------------- waits


def _status_sequence(fake: FakeAPI, did: str, statuses: list[str | int]) -> None:
    for status in statuses:
        if isinstance(status, int):
            fake.inject("GET", f"/deployments/{did}", error_response(status, None, "flaky"))
            continue

        def answer(request: httpx.Request, status: str = status) -> httpx.Response:
            dep = json.loads(json.dumps(fake.deployments[did]))
            dep["status"]["status"] = status
            dep["status"]["conditions"] = [{"type": "Ready", "status": "False", "message": f"now {status}"}]
            return httpx.Response(200, json={"deployment": dep})

        fake.inject("GET", f"/deployments/{did}", answer)


def test_wait_goes_through_error_and_transient_errors(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeAPI()
    did = fake.add_deployment(status="STATUS_READY")
    _status_sequence(fake, did, ["STATUS_CREATING", "STATUS_ERROR", 503])
    seen: list[ResourceStatus] = []
    with caplog.at_level(logging.INFO):
        dep = lifecycle.wait_for_deployment(
            fake.client(max_retries=1), did, timeout=5, poll_interval=0.01, on_status=lambda d: seen.append(d.status)
        )
    assert dep.status is ResourceStatus.READY
    assert seen == [ResourceStatus.CREATING, ResourceStatus.ERROR, ResourceStatus.READY]
    assert any("ERROR" in r.getMessage() and "recoverable" in r.getMessage() for r in caplog.records)


def _dropped(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection reset by peer")


def test_waits_and_deletes_go_on_through_transport_errors(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeAPI()
    did = fake.add_deployment()
    api = fake.client(max_retries=1)
    fake.inject("GET", f"/deployments/{did}", _dropped)
    with caplog.at_level(logging.WARNING):
        assert lifecycle.wait_for_deployment(api, did, timeout=5, poll_interval=0.01).status is ResourceStatus.READY
    assert any("transient error while waiting" in r.getMessage() for r in caplog.records)
    fake.inject("DELETE", f"/deployments/{did}", _dropped)
    fake.inject("GET", f"/deployments/{did}", _dropped)
    assert lifecycle.delete_deployment(api, did, timeout=5, poll_interval=0.01) is True
    # dropped, accepted, then re-sent after the dropped GET
    assert len([c for c in fake.calls if c[0] == "DELETE"]) == 3


def test_a_wait_with_no_answer_at_all_times_out_naming_the_transport_error() -> None:
    fake = FakeAPI()
    did = fake.add_deployment()
    for _ in range(1000):
        fake.inject("GET", f"/deployments/{did}", _dropped)
    with pytest.raises(LifecycleError, match=r"not READY after 0.05s; no answer \(unavailable: cannot reach the API"):
        lifecycle.wait_for_deployment(fake.client(max_retries=1), did, timeout=0.05, poll_interval=0.01)
    fake.injected.clear()


@pytest.mark.parametrize("status", ["STATUS_FAILED", "STATUS_DELETING"])
def test_wait_stops_at_once_on_failed_or_deleting(status: str) -> None:
    fake = FakeAPI()
    did = fake.add_deployment()
    _status_sequence(fake, did, [status])
    with pytest.raises(LifecycleError, match=f"{status.removeprefix('STATUS_')}.*now {status}"):
        lifecycle.wait_for_deployment(fake.client(), did, timeout=5, poll_interval=0.01)


def test_wait_timeout_says_how_long_and_the_last_conditions() -> None:
    fake = FakeAPI()
    did = fake.add_deployment(status="STATUS_CREATING")
    fake.deployments[did]["status"]["conditions"] = [{"type": "Progressing", "status": "True", "message": "pulling"}]
    with pytest.raises(LifecycleError, match=r"not READY after 0.05s; last status CREATING.*pulling"):
        lifecycle.wait_for_deployment(fake.client(), did, timeout=0.05, poll_interval=0.01)


def test_wait_for_gateway() -> None:
    fake = FakeAPI()
    fake.add_gateway()
    assert lifecycle.wait_for_gateway(fake.client(), "gw-1", timeout=1, poll_interval=0.01).endpoints


# ----------------------------------------------------------------------- deletes


def test_delete_waits_until_not_found() -> None:
    fake = FakeAPI()
    did = fake.add_deployment()
    assert lifecycle.delete_deployment(fake.client(), did, timeout=5, poll_interval=0.01) is True
    assert did not in fake.deployments
    with pytest.raises(NotFoundError):
        fake.client().get_deployment(did)


def test_delete_of_nothing_returns_false() -> None:
    fake = FakeAPI()
    assert lifecycle.delete_deployment(fake.client(), "none", timeout=1, poll_interval=0.01) is False


def test_delete_resends_after_transient_errors_and_gateway_retries_precondition() -> None:
    fake = FakeAPI()
    fake.add_gateway()
    fake.inject("DELETE", "/gateways/gw-1", error_response(400, "failed_precondition", "deployments attached"))
    fake.inject("DELETE", "/gateways/gw-1", error_response(503, "unavailable", "busy"))
    assert lifecycle.delete_gateway(fake.client(), "gw-1", timeout=5, poll_interval=0.01) is True
    deletes = [c for c in fake.calls if c[0] == "DELETE"]
    assert len(deletes) == 3


def test_delete_deadline_is_a_lifecycle_error() -> None:
    fake = FakeAPI()
    did = fake.add_deployment()
    fake.deleting[did] = 10**6  # the service never finishes deleting
    api = fake.client()
    with pytest.raises(LifecycleError, match="still exists after"):
        lifecycle.delete_deployment(api, did, timeout=0.05, poll_interval=0.01)


# ---------------------------------------------------------------- endpoints, URL


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("gw.example.com", "https://gw.example.com/v1"),
        (" https://gw.example.com/ ", "https://gw.example.com/v1"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
        ("gw.example.com/v1", "https://gw.example.com/v1"),
    ],
)
def test_rollout_base_url(endpoint: str, url: str) -> None:
    assert lifecycle.rollout_base_url(endpoint) == url


def test_endpoints_in_gateway_order_without_duplicates_and_unreadable_skipped() -> None:
    fake = FakeAPI()
    fake.add_gateway("gw-1", endpoint="a.example.com")
    fake.add_gateway("gw-2", endpoint="a.example.com")
    fake.add_gateway("gw-3", endpoint="b.example.com")
    did = fake.add_deployment()
    fake.deployments[did]["spec"]["gatewayIds"] = ["gw-1", "missing", "gw-2", "gw-3"]
    api = fake.client(max_retries=1)
    dep = api.get_deployment(did)
    fake.inject("GET", "/gateways/gw-2", _dropped)  # unreachable once: skipped like a missing one
    assert lifecycle.endpoints(api, dep) == ("a.example.com", "b.example.com")
    assert lifecycle.endpoints(api, dep) == ("a.example.com", "b.example.com")
    view = lifecycle.deployment_view(api, dep)
    assert view["endpoints"] == ["a.example.com", "b.example.com"]
    assert view["rollout_base_url"] == "https://a.example.com/v1"


def test_no_endpoint_gives_null_base_url() -> None:
    fake = FakeAPI()
    fake.add_gateway("gw-1", endpoint="")
    api = fake.client()
    dep = api.get_deployment(fake.add_deployment())
    assert lifecycle.deployment_base_url(api, dep) is None


def test_delete_answered_404_while_get_finds_it_is_an_error() -> None:
    fake = FakeAPI()
    did = fake.add_deployment()
    fake.inject("DELETE", f"/deployments/{did}", error_response(405, None, "method not allowed"))
    with pytest.raises(LifecycleError, match="but GET still finds it"):
        lifecycle.delete_deployment(fake.client(), did, timeout=1, poll_interval=0.01)
    fake.inject("DELETE", f"/deployments/{did}", error_response(404, "not_found", "no route"))
    with pytest.raises(LifecycleError, match="but GET still finds it"):
        lifecycle.delete_deployment(fake.client(), did, timeout=1, poll_interval=0.01)

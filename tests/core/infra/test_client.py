"""InferenceClient against an httpx.MockTransport stand-in: headers, errors, retries, ids, pages."""

from __future__ import annotations

import json
import logging
import uuid

import httpx
import pytest
from fakeapi import FakeAPI, error_response

from cwtrain.errors import (
    AlreadyExistsError,
    APIError,
    ConfigError,
    FailedPreconditionError,
    HotLoadInProgressError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    TransportError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UsageError,
)
from cwtrain.infra import (
    IncrementalSnapshotMetadata,
    InferenceClient,
    PromptCachePolicy,
    SnapshotType,
    token_from_env,
)

TOKEN = "test-token-123456"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "COREWEAVE_API_TOKEN",
        "CW_API_TOKEN",
        "COREWEAVE_API_URL",
        "CWTRAIN_API_HEADERS",
        "CWTRAIN_API_INSECURE",
    ):
        monkeypatch.delenv(name, raising=False)


def _recording(responses: list[httpx.Response]) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses.pop(0) if len(responses) > 1 else responses[0]

    return httpx.MockTransport(handler), seen


def _client(transport: httpx.MockTransport, **kwargs: object) -> tuple[InferenceClient, list[float]]:
    sleeps: list[float] = []
    api = InferenceClient(TOKEN, base_url="https://api.test/", transport=transport, **kwargs)  # type: ignore[arg-type]
    api.sleep = sleeps.append
    return api, sleeps


# ----------------------------------------------------------------- configuration


def test_headers_and_path_prefix() -> None:
    transport, seen = _recording([httpx.Response(200, json={"deployment": {"spec": {"id": "d"}}})])
    api, _ = _client(transport)
    assert api.get_deployment("d").id == "d"
    request = seen[0]
    assert str(request.url) == "https://api.test/v1alpha1/inference/deployments/d"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Accept"] == "application/json"
    assert request.headers["User-Agent"].startswith("cwtrain/")


def test_token_and_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CW_API_TOKEN", " fallback-token ")
    assert token_from_env() == "fallback-token"
    monkeypatch.setenv("COREWEAVE_API_TOKEN", "first-token")
    assert token_from_env() == "first-token"
    monkeypatch.setenv("COREWEAVE_API_URL", "http://localhost:1234/")
    transport, seen = _recording([httpx.Response(200, json={})])
    api = InferenceClient(transport=transport)
    assert api.base_url == "http://localhost:1234"
    api.get_gateway_parameters()
    assert seen[0].headers["Authorization"] == "Bearer first-token"


def test_missing_token_is_a_config_error_naming_both_variables() -> None:
    with pytest.raises(ConfigError) as info:
        InferenceClient()
    assert "COREWEAVE_API_TOKEN" in str(info.value) and "CW_API_TOKEN" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_extra_headers_from_env_replace_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CWTRAIN_API_HEADERS", json.dumps({"authorization": "Custom abc", "X-Org": 7}))
    transport, seen = _recording([httpx.Response(200, json={})])
    InferenceClient(transport=transport).get_gateway_parameters()
    assert seen[0].headers["Authorization"] == "Custom abc"
    assert seen[0].headers["X-Org"] == "7"


def test_headers_alone_need_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CWTRAIN_API_HEADERS", '{"X-Api-Key": "abc"}')
    transport, seen = _recording([httpx.Response(200, json={})])
    InferenceClient(transport=transport).get_gateway_parameters()
    assert "Authorization" not in seen[0].headers and seen[0].headers["X-Api-Key"] == "abc"


def test_bad_headers_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CWTRAIN_API_HEADERS", "[1, 2]")
    with pytest.raises(ConfigError, match="CWTRAIN_API_HEADERS"):
        InferenceClient(TOKEN)


# ------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("status", "body", "cls", "code"),
    [
        (400, {"code": "invalid_argument", "message": "bad"}, InvalidArgumentError, "invalid_argument"),
        (404, {"code": 5, "message": "gone"}, NotFoundError, "not_found"),
        (409, {"code": "6", "message": "dup"}, AlreadyExistsError, "already_exists"),
        (409, {"code": "aborted", "message": "x"}, APIError, "aborted"),
        (403, {"code": "PERMISSION_DENIED", "message": "role"}, PermissionDeniedError, "permission_denied"),
        (400, {"code": "failed_precondition", "message": "not ready"}, FailedPreconditionError, "failed_precondition"),
        (400, {"code": 9, "message": "hot-load already in progress"}, HotLoadInProgressError, "failed_precondition"),
        (401, {"message": "no"}, UnauthenticatedError, "unauthenticated"),
        (412, {}, FailedPreconditionError, "failed_precondition"),
        (501, {"code": "unimplemented", "message": "later"}, UnimplementedError, "unimplemented"),
        (418, {"message": "teapot"}, APIError, "unknown"),
    ],
)
def test_error_mapping(status: int, body: dict[str, object], cls: type[APIError], code: str) -> None:
    transport, _ = _recording([httpx.Response(status, json={**body, "details": [{"k": 1}]})])
    api, _ = _client(transport)
    with pytest.raises(APIError) as info:
        api.get_deployment("d")
    assert type(info.value) is cls
    assert info.value.code == code
    assert info.value.http_status == status
    assert info.value.details == [{"k": 1}]
    assert str(info.value).startswith(f"{code}: ")


def test_non_json_error_body_and_empty_message() -> None:
    transport, _ = _recording([httpx.Response(403, text="<html>denied</html>")])
    api, _ = _client(transport)
    with pytest.raises(PermissionDeniedError, match="<html>denied</html>"):
        api.get_deployment("d")
    transport, _ = _recording([httpx.Response(404, content=b"")])
    api, _ = _client(transport)
    with pytest.raises(NotFoundError, match="HTTP 404"):
        api.get_deployment("d")


def test_empty_2xx_body_is_empty_object() -> None:
    transport, _ = _recording([httpx.Response(200, content=b"")])
    api, _ = _client(transport)
    assert api.get_gateway_parameters() == {}


# ----------------------------------------------------------------------- retries


def test_transient_errors_are_retried_with_growing_jittered_backoff() -> None:
    transport, seen = _recording(
        [
            httpx.Response(503, json={"code": "unavailable", "message": "busy"}),
            httpx.Response(500, json={"code": "internal", "message": "oops"}),
            httpx.Response(200, text="not json"),
            httpx.Response(200, json={"deployment": {"spec": {"id": "d"}}}),
        ]
    )
    api, sleeps = _client(transport)
    assert api.get_deployment("d").id == "d"
    assert len(seen) == 4
    assert len(sleeps) == 3
    for slept, base in zip(sleeps, (0.5, 1.0, 2.0)):
        assert base <= slept < base * 1.25


def test_gives_up_after_max_retries_and_raises_the_last_error() -> None:
    transport, seen = _recording([httpx.Response(504, json={"code": "deadline_exceeded", "message": "slow"})])
    api, sleeps = _client(transport)
    with pytest.raises(APIError, match="deadline_exceeded"):
        api.get_deployment("d")
    assert len(seen) == 4 and len(sleeps) == 3


def test_retry_after_is_honoured_and_capped() -> None:
    transport, _ = _recording(
        [
            httpx.Response(429, headers={"Retry-After": "7"}, json={"message": "slow down"}),
            httpx.Response(429, headers={"Retry-After": "120"}, json={"message": "slow down"}),
            httpx.Response(200, json={}),
        ]
    )
    api, sleeps = _client(transport)
    api.get_gateway_parameters()
    assert sleeps[0] == 7.0
    assert sleeps[1] == 30.0


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(501, json={"code": "unimplemented", "message": "no"}),
        httpx.Response(503, json={"code": "unimplemented", "message": "no"}),
        httpx.Response(400, json={"code": "invalid_argument", "message": "no"}),
        httpx.Response(409, json={"message": "bare conflict"}),
    ],
)
def test_non_retryable_errors_are_sent_once(response: httpx.Response) -> None:
    transport, seen = _recording([response])
    api, sleeps = _client(transport)
    with pytest.raises(APIError):
        api.get_deployment("d")
    assert len(seen) == 1 and not sleeps


def test_transport_errors_are_retried_then_raised_apart_from_api_errors_without_secrets() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError(f"refused {TOKEN}")

    api, _ = _client(httpx.MockTransport(handler))
    with pytest.raises(TransportError) as info:
        api.get_deployment("d")
    # the service never answered: its own branch, not an APIError, and transient
    assert not isinstance(info.value, APIError) and info.value.transient
    assert str(info.value).startswith("unavailable: cannot reach the API")
    assert len(calls) == 4
    assert TOKEN not in str(info.value)
    assert "cannot reach the API" in str(info.value)


def test_delete_and_cancel_are_never_retried() -> None:
    transport, seen = _recording([httpx.Response(503, json={"code": "unavailable", "message": "x"})])
    api, _ = _client(transport)
    with pytest.raises(UnavailableError):
        api.delete_deployment("d")
    with pytest.raises(UnavailableError):
        api.cancel_hot_load("h")
    assert [r.method for r in seen] == ["DELETE", "POST"]
    assert seen[1].url.path.endswith("/hotLoads/h:cancel")
    assert json.loads(seen[1].content) == {}


def test_ids_with_slashes_are_refused_before_io() -> None:
    transport, seen = _recording([httpx.Response(200, json={})])
    api, _ = _client(transport)
    with pytest.raises(UsageError):
        api.get_hot_load("a/b")
    assert not seen


# ----------------------------------------------------------- client-chosen ids


def test_create_deployment_reuses_one_id_across_retries() -> None:
    fake = FakeAPI()
    fake.inject("POST", "/deployments", error_response(503, "unavailable"))
    api = fake.client()
    dep = api.create_deployment({"name": "my-dep", "gatewayIds": ["gw-1"]})
    posts = [body for method, path, body in fake.calls if method == "POST"]
    assert len(posts) == 2
    assert posts[0]["id"] == posts[1]["id"] == dep.id
    assert uuid.UUID(dep.id).version == 4


def test_lost_response_is_adopted_when_the_name_matches(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeAPI()
    api = fake.client()

    def created_then_lost(request: httpx.Request) -> httpx.Response:
        fake._route(request, "/deployments", json.loads(request.content))  # the service created it ...
        return httpx.Response(502, text="bad gateway")  # ... but the answer was lost

    fake.inject("POST", "/deployments", created_then_lost)
    with caplog.at_level(logging.INFO, logger="cwtrain.infra.client"):
        dep = api.create_deployment({"id": "fixed-id", "name": "my-dep"})
    assert dep.id == "fixed-id" and dep.name == "my-dep"
    assert list(fake.deployments) == ["fixed-id"]
    assert any("fixed-id" in r.getMessage() for r in caplog.records)


def test_id_taken_by_another_name_conflicts() -> None:
    fake = FakeAPI()
    fake.add_deployment("taken")
    api = fake.client()
    with pytest.raises(AlreadyExistsError, match="taken by deployment 'name-taken'"):
        api.create_deployment({"name": "mine"}, deployment_id="taken")


def test_name_taken_by_another_deployment_names_it() -> None:
    fake = FakeAPI()
    fake.add_deployment("other")
    api = fake.client()
    with pytest.raises(AlreadyExistsError, match=r"name 'name-other' belongs to another deployment \(other\)"):
        api.create_deployment({"name": "name-other"})


def test_create_gateway_adopts_and_conflicts() -> None:
    fake = FakeAPI()
    api = fake.client()
    first = api.create_gateway({"name": "gw", "zones": ["US-EAST-04A"]}, gateway_id="g1")
    again = api.create_gateway({"name": "gw", "zones": ["US-EAST-04A"]}, gateway_id="g1")
    assert first.id == again.id == "g1"
    with pytest.raises(AlreadyExistsError):
        api.create_gateway({"name": "other"}, gateway_id="g1")


# -------------------------------------------------------------------- hot-loads


def test_create_hot_load_body() -> None:
    fake = FakeAPI()
    fake.add_deployment()
    api = fake.client()
    hot = api.create_hot_load(
        "dep-1",
        "run-v000001",
        snapshot_type=SnapshotType.INCREMENTAL,
        incremental=IncrementalSnapshotMetadata("run-v000000"),
        prompt_cache_policy=PromptCachePolicy.RESET_ALL,
        hot_load_id="hl-1",
    )
    assert hot.id == "hl-1"
    body = fake.calls[-1][2]
    assert body == {
        "deploymentId": "dep-1",
        "hotLoadId": "hl-1",
        "identity": "run-v000001",
        "type": "SNAPSHOT_TYPE_INCREMENTAL",
        "incrementalSnapshotMetadata": {
            "previousSnapshotIdentity": "run-v000000",
            "compressionFormat": "COMPRESSION_FORMAT_ZSTD",
            "checksumFormat": "CHECKSUM_FORMAT_ADLER32",
        },
        "promptCachePolicy": "PROMPT_CACHE_POLICY_RESET_ALL",
    }


def test_create_hot_load_omits_unspecified_policy_and_always_sends_an_id() -> None:
    fake = FakeAPI()
    api = fake.client()
    api.create_hot_load("dep-1", "a", prompt_cache_policy=None)
    body = fake.calls[-1][2]
    assert "promptCachePolicy" not in body and "incrementalSnapshotMetadata" not in body
    assert body["type"] == "SNAPSHOT_TYPE_FULL"
    assert uuid.UUID(body["hotLoadId"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"snapshot_type": SnapshotType.INCREMENTAL},
        {"snapshot_type": SnapshotType.FULL, "incremental": IncrementalSnapshotMetadata("p")},
        {"snapshot_type": SnapshotType.UNSPECIFIED},
    ],
)
def test_create_hot_load_misuse_is_refused_before_io(kwargs: dict[str, object]) -> None:
    fake = FakeAPI()
    api = fake.client()
    with pytest.raises(UsageError):
        api.create_hot_load("dep-1", "a", **kwargs)  # type: ignore[arg-type]
    assert not fake.calls


def test_create_hot_load_adopts_matching_spec_and_refuses_conflicts() -> None:
    fake = FakeAPI()
    api = fake.client()
    api.create_hot_load("dep-1", "a", hot_load_id="hl-1")
    fake.add_deployment()
    again = api.create_hot_load(
        "dep-1", "a", hot_load_id="hl-1", prompt_cache_policy=PromptCachePolicy.PRESERVE
    )  # absent = PRESERVE
    assert again.id == "hl-1"
    with pytest.raises(AlreadyExistsError, match="hot-load ID conflict"):
        api.create_hot_load("dep-1", "b", hot_load_id="hl-1")


def test_hot_load_retry_after_lost_response_keeps_the_id() -> None:
    fake = FakeAPI()
    api = fake.client()

    def created_then_lost(request: httpx.Request) -> httpx.Response:
        fake._route(request, "/hotLoads", json.loads(request.content))
        raise httpx.ReadTimeout("lost")

    fake.inject("POST", "/hotLoads", created_then_lost)
    hot = api.create_hot_load("dep-1", "a")
    assert list(fake.hot_loads) == [hot.id]


def test_replica_pages_are_all_fetched() -> None:
    fake = FakeAPI(replicas=5, page_size=2)
    fake.add_hot_load("h", "a")
    api = fake.client()
    replicas = api.list_hot_load_replicas("h")
    assert [r.name for r in replicas] == [f"replica-{i}" for i in range(5)]
    tokens = [c for c in fake.calls if c[1].endswith("/replicas")]
    assert len(tokens) == 3


def test_list_hot_loads_is_lazy_and_filters_by_deployment() -> None:
    fake = FakeAPI(page_size=2)
    for i in range(5):
        fake.add_hot_load(f"h{i}", f"id{i}")
    fake.add_hot_load("other", "x", deployment="dep-2")
    api = fake.client()
    first = next(iter(api.list_hot_loads("dep-1")))
    assert first.id == "h4"  # newest first
    assert len([c for c in fake.calls if c[1] == "/hotLoads"]) == 1
    assert [h.id for h in api.list_hot_loads("dep-1")] == ["h4", "h3", "h2", "h1", "h0"]


def test_repeated_page_token_is_an_error_not_a_loop() -> None:
    transport, seen = _recording([httpx.Response(200, json={"replicas": [{"name": "r"}], "nextPageToken": "same"})])
    api, _ = _client(transport)
    with pytest.raises(APIError, match="repeated the page token"):
        api.list_hot_load_replicas("h")
    assert len(seen) == 2


def test_lists_accept_items_or_the_plural_key() -> None:
    transport, _ = _recording([httpx.Response(200, json={"deployments": [{"spec": {"id": "a"}}]})])
    api, _ = _client(transport)
    assert [d.id for d in api.list_deployments()] == ["a"]
    fake = FakeAPI()
    fake.add_gateway()
    assert [g.id for g in fake.client().list_gateways()] == ["gw-1"]


def test_parameters_pass_through_and_repeat_gateway_ids() -> None:
    fake = FakeAPI()
    params = fake.client().get_deployment_parameters(["a", "b"])
    assert params["gatewayIds"] == ["a", "b"]


def test_context_manager_closes() -> None:
    fake = FakeAPI()
    with fake.client() as api:
        api.get_gateway_parameters()
    with pytest.raises(RuntimeError):
        api.get_gateway_parameters()


def test_verify_accepts_a_ca_bundle_path_and_insecure_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import certifi

    api = InferenceClient(TOKEN, verify=certifi.where())
    api.close()
    with pytest.raises(OSError):
        InferenceClient(TOKEN, verify="/nonexistent/ca.pem")
    monkeypatch.setenv("CWTRAIN_API_INSECURE", "maybe")
    with pytest.raises(ConfigError, match="CWTRAIN_API_INSECURE"):
        InferenceClient(TOKEN)

"""``deep-json``: JSON documents nested far deeper than any real one, wherever cwtrain reads JSON.

``json.loads`` raises ``RecursionError`` (not a ``ValueError``) on a document nested past the
interpreter's limit, and a document just under it parses but breaks the next recursive walk.
Each input below gets a clear error naming it instead of "internal error ... this is a bug":

- ``cwtrain deployment create -f`` / ``gateway create -f``: exit 1, one ``error:`` line naming
  the file, nothing sent;
- ``CWTRAIN_API_HEADERS``: exit 1, one line naming the variable (not its value), nothing sent;
- an API answer: a ``TransportError``;
- the local control plane and gateway: 400 in the server's error shape, and the server
  goes on answering (the replica: ``test_local_boundaries.py``; the Gym model_server:
  ``tests/gym/test_model_server.py``; the rollout sampler: ``tests/core/rollout/test_rollout_responses.py``);
- a NeMo Gym rollouts file: a ``CWTrainError`` naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _recording import TOKEN, RecordingServer, one_error_line, run_cli

from cwtrain.errors import CWTrainError, TransportError
from cwtrain.infra import InferenceClient
from cwtrain.integrations.gym.scores import read_scores
from cwtrain.jsondoc import MAX_DEPTH, json_depth, load_json
from cwtrain.local.controlplane.server import API_PREFIX, ControlPlaneServer
from cwtrain.local.controlplane.state import ControlPlaneState
from cwtrain.local.engine.gateway import GatewayServer

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("deep-json")]

#: Depths: just past the limit, just under the interpreter's recursion limit, far past it.
DEPTHS = [MAX_DEPTH + 1, 900, 100_000]


def nested(depth: int, *, kind: str = "list") -> str:
    """A document ``depth`` levels deep: ``[[[...]]]`` or ``{"a": {"a": ...}}``."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


def test_the_depth_is_measured_as_json_nests() -> None:
    assert json_depth('{"a": [1, {"b": "[[[[{{"}], "c": "\\"]"}') == 3
    assert json_depth("1") == json_depth('"[{"') == 0
    assert load_json(nested(MAX_DEPTH)) is not None
    with pytest.raises(ValueError, match=f"{MAX_DEPTH + 1} levels deep"):
        load_json(nested(MAX_DEPTH + 1, kind="object"))
    with pytest.raises(ValueError, match="levels deep"):
        load_json(nested(100_000).encode())


@pytest.fixture
def api() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("group", ["deployment", "gateway"])
def test_a_deep_request_file_is_refused_naming_it(group: str, depth: int, api: RecordingServer, tmp_path: Path) -> None:
    path = tmp_path / "request.json"
    path.write_text('{"name": "x", "spec": ' + nested(depth, kind="object") + "}")
    code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, group, "create", "-f", str(path)])
    line = one_error_line(err)
    assert code == 1 and out == "", err
    assert "internal error" not in line and str(path) in line and "levels deep" in line, line
    assert api.requests == []


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_api_headers_are_refused_naming_the_variable(
    depth: int, api: RecordingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = '{"X-Secret-Deep": ' + nested(depth) + "}"
    monkeypatch.setenv("CWTRAIN_API_HEADERS", value)
    code, out, err = run_cli(["--base-url", api.url, "--token", TOKEN, "deployment", "list"])
    line = one_error_line(err)
    assert code == 1 and out == "", err
    assert "internal error" not in line and "CWTRAIN_API_HEADERS" in line and "levels deep" in line, line
    assert "X-Secret-Deep" not in line
    assert api.requests == []


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_deep_api_answer_is_a_transport_error(depth: int) -> None:
    body = '{"deployment": ' + nested(depth, kind="object") + "}"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body.encode(), headers={"Content-Type": "application/json"})

    with (
        InferenceClient(
            base_url="http://api.example", token=TOKEN, transport=httpx.MockTransport(answer), max_retries=0
        ) as client,
        pytest.raises(TransportError, match="levels deep"),
    ):
        client.get_deployment("dep-1")


def test_the_control_plane_answers_a_deep_body_with_400() -> None:
    server = ControlPlaneServer(ControlPlaneState(), [TOKEN]).start()
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
            for depth in DEPTHS:
                answer = http.post(f"{API_PREFIX}/gateways", content=nested(depth).encode())
                assert answer.status_code == 400, answer.text
                assert answer.json()["code"] == "invalid_argument" and "levels deep" in answer.json()["message"]
            assert http.get(f"{API_PREFIX}/gateways").status_code == 200  # still answering
    finally:
        server.stop()


def test_the_gateway_answers_a_deep_body_with_400() -> None:
    spec = {"id": "gw", "coreWeaveAuth": {}, "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"}}
    gateway = GatewayServer("gw", lambda _: (spec, {"m": []}), frozenset({TOKEN})).start()
    try:
        with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
            for depth in DEPTHS:
                answer = http.post("/v1/completions", content=nested(depth, kind="object").encode())
                assert answer.status_code == 400, answer.text
                assert "levels deep" in answer.json()["error"]["message"]
            assert http.get("/v1/models").status_code == 200
    finally:
        gateway.stop()


def test_a_deep_line_of_a_gym_rollouts_file_names_the_file_and_line(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text('{"reward": 1.0}\n{"reward": ' + nested(100_000) + "}\n")
    with pytest.raises(CWTrainError, match=r"rollouts\.jsonl:2 is not JSON \(it nests"):
        read_scores(rollouts)
    rollouts.write_text('{"reward": 1.0}\n')
    metrics = tmp_path / "rollouts_aggregate_metrics.json"
    metrics.write_text(nested(900))
    with pytest.raises(CWTrainError, match=r"aggregate_metrics\.json is not JSON"):
        read_scores(rollouts, metrics)

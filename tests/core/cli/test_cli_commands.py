"""The deployment, gateway and hotload command groups, in-process, against the API stand-in.

``client_from_args`` is replaced so that commands talk to :class:`FakeAPI` through
``httpx.MockTransport``; the global options, parsing, JSON output and exit codes are real.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import NoCredentialsError
from fakeapi import FakeAPI, error_response

from cwtrain.cli import main
from cwtrain.errors import ConfigError, TransportError, UsageError
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.infra import InferenceClient
from cwtrain.infra.enums import PromptCachePolicy

REQUEST = {
    "name": "dep",
    "gatewayIds": ["gw-1"],
    "runtime": {"engine": "dynamo-vllm", "version": "1.2.3", "engineConfig": {"x": "<think>"}},
    "resources": {"instanceType": "H100_80GB_SXM5", "gpuCount": 1},
    "model": {"name": "tiny-model", "bucket": "w", "path": "p"},
    "autoscaling": {"min": 1, "max": 1},
    "traffic": {"weight": 100},
    "hotLoad": {"bucket": "w", "pathPrefix": "hotload", "transitionMode": "TRANSITION_MODE_ASYNC"},
}


@pytest.fixture(autouse=True)
def no_deployment_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands see ``CWTRAIN_HOTLOAD_DEPLOYMENT_ID`` only where a test sets it."""
    monkeypatch.delenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", raising=False)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    api = FakeAPI()
    api.add_gateway()
    tokens: list[Any] = []

    def client_from_args(args: Any) -> InferenceClient:
        tokens.append(args.token)
        return api.client()

    import cwtrain.cli.deployment
    import cwtrain.cli.gateway
    import cwtrain.cli.hotload

    for module in (cwtrain.cli.deployment, cwtrain.cli.gateway, cwtrain.cli.hotload):
        monkeypatch.setattr(module, "client_from_args", client_from_args)
    return api


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip() else None), captured.err


# ------------------------------------------------------------------- deployment


def test_deployment_create_wait_and_views(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(dict(REQUEST, id="dep-x")))

    def ready(request: httpx.Request) -> httpx.Response:
        fake.deployments["dep-x"]["status"]["status"] = "STATUS_READY"
        return httpx.Response(200, json={"deployment": fake.deployments["dep-x"]})

    fake.inject("GET", "/deployments/dep-x", ready)
    code, view, err = run(capsys, "deployment", "create", "-f", str(path), "--wait", "--poll-interval", "0.01")
    assert code == 0, err
    assert view["id"] == "dep-x" and view["status"] == "READY"
    assert view["rollout_base_url"] == "https://gw1.example.com/v1"
    assert any("with id dep-x" in r.getMessage() for r in caplog.records)  # logged before the POST
    code, view, _ = run(capsys, "deployment", "get", "dep-x")
    assert code == 0 and view["endpoints"] == ["gw1.example.com"]


def test_deployment_create_wait_failure_prints_latest_view(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(dict(REQUEST, id="dep-f")))

    def failed(request: httpx.Request) -> httpx.Response:
        fake.deployments["dep-f"]["status"].update(
            status="STATUS_FAILED", conditions=[{"type": "Ready", "status": "False", "message": "image pull failed"}]
        )
        return httpx.Response(200, json={"deployment": fake.deployments["dep-f"]})

    fake.inject("GET", "/deployments/dep-f", failed)
    code, view, err = run(capsys, "deployment", "create", "-f", str(path), "--wait", "--poll-interval", "0.01")
    assert code == 1
    assert view["status"] == "FAILED"
    assert err.strip().splitlines()[-1].startswith("error: deployment dep-f is FAILED")
    assert "image pull failed" in err


def test_placeholder_file_is_refused_before_any_call(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(dict(REQUEST, model={"name": "<model-name>", "bucket": "w", "path": "p"})))
    code, out, err = run(capsys, "deployment", "create", "-f", str(path))
    assert code == 1 and out is None
    assert err.strip() == f"error: fill in {path} first; it still has placeholders: model.name = '<model-name>'"
    assert not fake.calls


def test_unreadable_request_file(fake: FakeAPI, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "deployment", "create", "-f", str(tmp_path / "missing.json"))
    assert code == 1 and err.startswith("error: cannot read request file") and len(err.strip().splitlines()) == 1


def test_name_taken_names_the_other_deployment(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake.add_deployment("owner")
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(dict(REQUEST, name="name-owner")))
    code, _, err = run(capsys, "deployment", "create", "-f", str(path))
    assert code == 1 and "(owner)" in err


def test_deployment_delete_results(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_deployment("d1")
    code, out, _ = run(capsys, "deployment", "delete", "d1")
    assert code == 0 and out == {"id": "d1", "result": "deleting"}
    code, out, _ = run(capsys, "deployment", "delete", "d1", "--wait", "--poll-interval", "0.01")
    assert code == 0 and out == {"id": "d1", "result": "deleted"}
    code, out, err = run(capsys, "deployment", "delete", "d1")
    assert code == 1 and out is None and err.startswith("error: not_found")
    code, out, _ = run(capsys, "deployment", "delete", "d1", "--wait", "--ignore-not-found")
    assert code == 0 and out == {"id": "d1", "result": "not_found"}


def test_parameters_are_printed_unchanged(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "deployment", "parameters", "--gateway", "a", "--gateway", "b")
    assert code == 0 and out == {
        "gatewayIds": ["a", "b"],
        "runtimeParameters": {
            "runtimeVersions": {"dynamo-vllm": {"versions": ["1.2.3"]}},
            "runtimeConfigOptions": {"dynamo-vllm": {"allowedKeys": ["max-model-len"]}},
        },
        "resourceParameters": {"instanceTypes": ["H100_80GB_SXM5"]},
    }
    code, out, _ = run(capsys, "gateway", "parameters")
    assert code == 0 and out == {"zones": ["US-EAST-04A"]}


def test_deployment_list_is_get_for_each_and_filters_by_gateway(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.add_gateway("gw-2", endpoint="gw2.example.com")
    fake.add_deployment("dep-1")
    fake.add_deployment("dep-2")
    fake.deployments["dep-2"]["spec"]["gatewayIds"] = ["gw-2", "gw-1"]
    code, listed, err = run(capsys, "deployment", "list")
    assert code == 0, err
    views = []
    for deployment_id in ("dep-1", "dep-2"):
        views.append(run(capsys, "deployment", "get", deployment_id)[1])
    assert listed == views  # the same view as `get`, key for key
    assert listed[1]["endpoints"] == ["gw2.example.com", "gw1.example.com"]
    assert listed[1]["rollout_base_url"] == "https://gw2.example.com/v1"
    code, only, _ = run(capsys, "deployment", "list", "--gateway", "gw-2")
    assert code == 0 and [d["id"] for d in only] == ["dep-2"]
    assert ("GET", "/deployments", None) in fake.calls
    code, none, _ = run(capsys, "deployment", "list", "--gateway", "gw-nowhere")
    assert code == 0 and none == []


def test_gateway_list_is_get_for_each(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_gateway("gw-2", endpoint="gw2.example.com")
    code, listed, err = run(capsys, "gateway", "list")
    assert code == 0, err
    assert listed == [run(capsys, "gateway", "get", gid)[1] for gid in ("gw-1", "gw-2")]


def test_gateway_commands(fake: FakeAPI, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "gw.json"
    path.write_text(json.dumps({"id": "g2", "name": "gw-two", "zones": ["US-EAST-04A"], "coreWeaveAuth": {}}))
    code, out, _ = run(capsys, "gateway", "create", "-f", str(path))
    assert code == 0 and out["id"] == "g2" and out["status"] == "CREATING"
    code, out, _ = run(capsys, "gateway", "get", "gw-1")
    assert code == 0 and out["endpoints"] == ["gw1.example.com"] and out["zones"] == ["US-EAST-04A"]
    code, out, _ = run(capsys, "gateway", "delete", "g2", "--wait", "--poll-interval", "0.01")
    assert code == 0 and out == {"id": "g2", "result": "deleted"}


@pytest.mark.parametrize(
    "argv",
    [
        ["deployment", "delete", "x", "--timeout", "0"],
        ["deployment", "create", "-f", "x.json", "--timeout", "nan"],
        ["hotload", "publish", "--deployment", "d", "--checkpoint", "c", "--identity", "i", "--workers", "0"],
        ["hotload", "wait", "h", "--timeout", "inf"],
        ["hotload", "list"],
        ["deployment"],
        ["nope"],
    ],
)
def test_usage_errors_exit_2(fake: FakeAPI, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run(capsys, *argv)
    assert code == 2 and out is None
    assert not fake.calls


# ---------------------------------------------------------------------- hotload


def test_trigger_no_wait_then_wait_status_list(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_deployment()
    code, hot, err = run(
        capsys, "hotload", "trigger", "--deployment", "dep-1", "--identity", "a", "--no-wait", "--no-verify"
    )
    assert code == 0, err
    assert hot["status"]["state"] == "PENDING" and hot["spec"]["type"] == "FULL"
    body = next(c[2] for c in fake.calls if c[:2] == ("POST", "/hotLoads"))
    assert "promptCachePolicy" not in body
    code, done, _ = run(capsys, "hotload", "wait", hot["spec"]["id"], "--poll-interval", "0.01")
    assert code == 0 and done["status"]["state"] == "COMPLETED"
    code, status, _ = run(capsys, "hotload", "status", hot["spec"]["id"])
    assert code == 0 and list(status) == ["hot_load", "replicas"] and len(status["replicas"]) == 2
    assert status["replicas"][0]["current_snapshot_identity"] == "a"
    code, listed, _ = run(capsys, "hotload", "list", "--deployment", "dep-1", "--limit", "5")
    assert code == 0 and [h["spec"]["identity"] for h in listed] == ["a"]


def test_trigger_delta_with_reset_prompt_cache(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_deployment()
    fake.add_hot_load("h0", "a")
    code, hot, _ = run(
        capsys,
        "hotload",
        "trigger",
        "--deployment",
        "dep-1",
        "--identity",
        "b",
        "--previous-identity",
        "a",
        "--reset-prompt-cache",
        "--poll-interval",
        "0.01",
        "--no-verify",
    )
    assert code == 0 and hot["spec"]["type"] == "INCREMENTAL"
    body = next(c[2] for c in fake.calls if c[:2] == ("POST", "/hotLoads"))
    assert body["promptCachePolicy"] == "PROMPT_CACHE_POLICY_RESET_ALL"
    assert body["incrementalSnapshotMetadata"]["previousSnapshotIdentity"] == "a"


def test_failed_hot_load_is_printed_and_exits_1(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_deployment()
    fake.fail_identities.add("bad")
    code, hot, err = run(
        capsys,
        "hotload",
        "trigger",
        "--deployment",
        "dep-1",
        "--identity",
        "bad",
        "--poll-interval",
        "0.01",
        "--no-verify",
    )
    assert code == 1
    assert hot["status"]["state"] == "FAILED"
    assert "checksum mismatch" in err.strip().splitlines()[-1]


def test_invalid_identity_is_one_line_exit_1(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_deployment()
    code, out, err = run(capsys, "hotload", "trigger", "--deployment", "dep-1", "--identity", "a/b")
    assert code == 1 and out is None
    assert err.startswith("error: invalid identity 'a/b'") and len(err.strip().splitlines()) == 1
    assert not [c for c in fake.calls if c[0] == "POST"]


def test_cancel_is_unimplemented(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_hot_load("h", "a")
    code, out, err = run(capsys, "hotload", "cancel", "h")
    assert code == 1 and out is None and err.startswith("error: unimplemented")


DEPLOYMENT_COMMANDS = [
    ["hotload", "publish", "--checkpoint", "ckpt", "--identity", "x"],
    ["hotload", "trigger", "--identity", "x", "--no-wait"],
    ["hotload", "list"],
    ["hotload", "rollback", "--identity", "x"],
    ["hotload", "check"],
]


@pytest.mark.parametrize("argv", DEPLOYMENT_COMMANDS, ids=lambda argv: argv[1])
def test_a_missing_deployment_is_one_usage_line_naming_the_option_and_the_variable(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "  ")  # blank counts as unset
    code, out, err = run(capsys, *argv)
    assert code == 2 and out is None and not fake.calls
    assert len(err.splitlines()) == 1
    assert err.startswith("error: no deployment: pass --deployment ID or set CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
    text = " ".join(_help(capsys, *argv[:2]).split())
    assert re.search(r"--deployment ID [^-]*\(default: \$CWTRAIN_HOTLOAD_DEPLOYMENT_ID\)", text)


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", DEPLOYMENT_COMMANDS[1:], ids=lambda argv: argv[1])
def test_deployment_defaults_to_the_variable_local_up_exports(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    fake.add_deployment("dep-env")
    fake.add_hot_load("h0", "x", deployment="dep-env")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", "dep-env")
    asked: list[str] = []  # the first request of each run: URL and body
    handle = fake.handle

    def recording(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url} {request.content.decode()}")
        return handle(request)

    monkeypatch.setattr(fake, "handle", recording)
    run(capsys, *argv)  # check fails later (no object store here): what matters is whom it asked
    assert asked and "dep-env" in asked[0], asked
    asked.clear()
    run(capsys, *argv, "--deployment", "dep-1")  # the option beats the variable
    assert asked and "dep-1" in asked[0] and "dep-env" not in asked[0], asked


def test_rollback_of_unknown_identity(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.add_deployment()
    code, _, err = run(capsys, "hotload", "rollback", "--deployment", "dep-1", "--identity", "never")
    assert code == 1 and "no COMPLETED hot-load of 'never'" in err


def test_api_errors_are_one_line(fake: FakeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    fake.inject("GET", "/hotLoads/h", error_response(403, "permission_denied", "needs Inference Viewer"))
    code, _, err = run(capsys, "hotload", "status", "h")
    assert code == 1 and err == "error: permission_denied: needs Inference Viewer\n"


# ------------------------------------------------------- real client construction


def test_missing_token_exits_1_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("COREWEAVE_API_TOKEN", "CW_API_TOKEN", "CWTRAIN_API_HEADERS"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run(capsys, "deployment", "get", "d")
    assert code == 1 and out is None
    assert err.startswith("error: no API token") and len(err.strip().splitlines()) == 1


def test_unreachable_api_exits_1_without_the_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import cwtrain.infra.client as client_module

    monkeypatch.setattr(client_module.time, "sleep", lambda seconds: None)
    code, out, err = run(
        capsys,
        "--base-url",
        "http://127.0.0.1:9",
        "--token",
        "secret-token-value",
        "hotload",
        "list",
        "--deployment",
        "d",
    )
    assert code == 1 and out is None
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: unavailable: cannot reach the API") and "127.0.0.1:9" in last
    assert "secret-token-value" not in err


def test_inspect_needs_no_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from cwtrain.hotload.codec.encode import DeltaEncoder
    from cwtrain.hotload.format.tensors import TensorData

    for name in ("COREWEAVE_API_TOKEN", "CW_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with DeltaEncoder(workers=1) as encoder:
        snap = encoder.encode_full({"w": TensorData("F32", (2,), b"\x00" * 8)})
    for file in [*snap.files, snap.index]:
        file.write_to(tmp_path / file.name)
    (tmp_path / "config.json").write_text("{}")
    code, info, err = run(capsys, "hotload", "inspect", str(tmp_path))
    assert code == 0, err
    assert info["type"] == "FULL" and info["incremental"] is None
    assert set(info) == {
        "path",
        "type",
        "files",
        "total_bytes",
        "empty_delta",
        "incremental",
        "index_metadata",
        "index_generated",
    }


def test_check_with_bucket_and_prefix(
    capsys: pytest.CaptureFixture[str], s3_bucket: tuple[Any, str], s3_env: dict[str, str]
) -> None:
    _, bucket = s3_bucket
    code, out, err = run(capsys, "hotload", "check", "--bucket", bucket, "--prefix", "/runs/")
    assert code == 0, err
    assert out == {
        "deployment": None,
        "bucket": bucket,
        "path_prefix": "runs",
        "uri": f"s3://{bucket}/runs/",
        "result": "ok",
    }
    code, _, err = run(capsys, "hotload", "check")
    assert code == 2 and err == (
        "error: no deployment: pass --deployment ID or set CWTRAIN_HOTLOAD_DEPLOYMENT_ID, "
        "or give --bucket B [--prefix P]\n"
    )
    code, _, err = run(capsys, "hotload", "check", "--bucket", bucket, "--deployment", "d")
    assert code == 2 and "not allowed with argument" in err


# ------------------------------------------------------------ publish (the library's)


def _checkpoint(root: Path) -> Path:
    from cwtrain.hotload.codec.encode import DeltaEncoder
    from cwtrain.hotload.format.tensors import TensorData

    root.mkdir()
    with DeltaEncoder(workers=1) as encoder:
        snap = encoder.encode_full({"w": TensorData("F32", (64,), bytes(range(256)))})
    for file in [*snap.files, snap.index]:
        file.write_to(root / file.name)
    (root / "config.json").write_text("{}")
    return root


@pytest.fixture
def publishing(
    fake: FakeAPI, s3_bucket: tuple[Any, str], s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    """A hot-load deployment on the test bucket; records every version published through the one composer.

    ``HotLoader.publish`` and ``HotLoader.publish_diff`` both end in
    :meth:`cwtrain.hotload.lifecycle.cycle.VersionCycle.publish`: each record holds its plan's
    budget, the cycle's policy (``wait``, ``workers``, ``prompt_cache_policy``) and the source.
    """
    from cwtrain.hotload.lifecycle.cycle import VersionCycle

    fake.add_deployment()
    fake.deployments["dep-1"]["spec"]["hotLoad"]["bucket"] = s3_bucket[1]
    calls: list[dict[str, Any]] = []
    original = VersionCycle.publish

    def publish(self: VersionCycle, plan: Any, source: Any, **kwargs: Any) -> Any:
        policy = self.policy
        calls.append({"budget": plan.budget, "wait": policy.wait, "workers": policy.upload_workers,
                      "prompt_cache_policy": policy.prompt_cache_policy, "source": source})  # fmt: skip
        return original(self, plan, source, **kwargs)

    monkeypatch.setattr(VersionCycle, "publish", publish)
    return calls


def test_publish_is_the_library_publish_with_upload_progress(
    fake: FakeAPI,
    publishing: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt")
    argv = ["hotload", "publish", "--deployment", "dep-1", "--checkpoint", str(ckpt), "--identity", "cli-v000000"]
    with caplog.at_level(logging.INFO):
        code, hot, err = run(capsys, *argv, "--poll-interval", "0.01", "--timeout", "60", "--reset-prompt-cache")
    assert code == 0, err
    assert hot["status"]["state"] == "COMPLETED" and hot["spec"]["identity"] == "cli-v000000"
    assert len(publishing) == 1
    assert publishing[0]["budget"].total == 60.0 and publishing[0]["wait"] is True
    assert publishing[0]["prompt_cache_policy"] is PromptCachePolicy.RESET_ALL
    body = next(c[2] for c in fake.calls if c[:2] == ("POST", "/hotLoads"))
    assert body["type"] == "SNAPSHOT_TYPE_FULL" and body["promptCachePolicy"] == "PROMPT_CACHE_POLICY_RESET_ALL"
    drawn = [r.getMessage() for r in caplog.records if r.name == "cwtrain.progress"]
    assert drawn and drawn[-1].startswith("uploading cli-v000000: ") and "(100%)" in drawn[-1]
    assert any("of 'cli-v000000': completed after" in r.getMessage() for r in caplog.records)

    code, hot, err = run(capsys, *argv[:-1], "cli-v000001", "--no-wait")
    assert code == 0, err
    assert hot["status"]["state"] == "PENDING" and publishing[-1]["wait"] is False


def test_publish_options_fall_back_to_the_librarys_variables(
    fake: FakeAPI,
    publishing: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    ckpt = _checkpoint(tmp_path / "ckpt")
    argv = ["hotload", "publish", "--deployment", "dep-1", "--checkpoint", str(ckpt), "--poll-interval", "0.01"]
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "42")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_UPLOAD_WORKERS", "3")
    code, _, err = run(capsys, *argv, "--identity", "env-v000000")
    assert code == 0, err
    assert publishing[-1]["budget"].total == 42.0 and publishing[-1]["workers"] == 3
    code, _, err = run(capsys, *argv, "--identity", "env-v000001", "--timeout", "7", "--workers", "2")
    assert code == 0, err  # an option beats the variable
    assert publishing[-1]["budget"].total == 7.0 and publishing[-1]["workers"] == 2
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "soon")
    code, _, err = run(capsys, *argv, "--identity", "env-v000002")
    assert code != 0 and "CWTRAIN_HOTLOAD_TIMEOUT='soon'" in err and len(publishing) == 2
    monkeypatch.delenv("CWTRAIN_HOTLOAD_TIMEOUT")
    monkeypatch.delenv("CWTRAIN_HOTLOAD_UPLOAD_WORKERS")
    code, _, err = run(capsys, *argv, "--identity", "env-v000003")
    assert code == 0, err  # neither: the library's defaults
    assert publishing[-1]["budget"].total == 1800.0 and publishing[-1]["workers"] == 8


def test_publish_of_a_failing_hot_load_prints_it_and_exits_1(
    fake: FakeAPI, publishing: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake.fail_identities.add("bad-v000000")
    ckpt = _checkpoint(tmp_path / "ckpt")
    code, hot, err = run(
        capsys, "hotload", "publish", "--deployment", "dep-1", "--checkpoint", str(ckpt), "--identity", "bad-v000000",
        "--poll-interval", "0.01",
    )  # fmt: skip
    assert code == 1 and hot["status"]["state"] == "FAILED"
    assert err.strip().splitlines()[-1].startswith("error: hot-load ") and "checksum mismatch" in err


def _stored(s3: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"].rsplit("/", 1)[1]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_publish_with_base_is_diff_plus_publish_in_one_pass(
    fake: FakeAPI,
    publishing: list[dict[str, Any]],
    s3_bucket: tuple[Any, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    import numpy as np
    from codec_helpers import save_checkpoint

    import cwtrain.hotload.files.write

    s3, bucket = s3_bucket
    rng = np.random.default_rng(7)
    weights = {f"layer{i}.w": rng.standard_normal((64, 32)).astype(np.float32) for i in range(4)}
    base = save_checkpoint(tmp_path / "step-0", weights, shards=2)
    weights["layer1.w"][3] += 1.0  # two of four tensors change
    weights["layer3.w"][:, 5] *= 2.0
    new = save_checkpoint(tmp_path / "step-1", weights, shards=2)
    for did, prefix in (("dep-1", "hotload"), ("dep-2", "other"), ("dep-3", "kept")):
        fake.add_deployment(did)
        fake.deployments[did]["spec"]["hotLoad"].update(bucket=bucket, pathPrefix=prefix)
        fake.add_hot_load(f"h0-{did}", "run-v000000", deployment=did)
        s3.put_object(Bucket=bucket, Key=f"{prefix}/run-v000000/{INDEX_NAME}", Body=b"{}")  # the predecessor is stored
    identity = ["--identity", "run-v000001", "--previous-identity", "run-v000000", "--poll-interval", "0.01"]
    before = sorted(tmp_path.rglob("*"))

    def no_disk(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("publish --base without --keep wrote a directory")

    with monkeypatch.context() as patch:
        patch.setattr(cwtrain.hotload.files.write, "staged_directory", no_disk)
        code, hot, err = run(
            capsys, "hotload", "publish", "--deployment", "dep-1", "--checkpoint", str(new), "--base", str(base),
            *identity,
        )  # fmt: skip
    assert code == 0, err
    assert hot["status"]["state"] == "COMPLETED" and hot["spec"]["type"] == "INCREMENTAL"
    assert hot["spec"]["incremental_snapshot_metadata"]["previous_snapshot_identity"] == "run-v000000"
    source = publishing[-1]["source"]
    assert type(source).__name__ == "DiffSource" and source.keep is None  # the library's in-memory delta path
    assert sorted(tmp_path.rglob("*")) == before  # no delta directory, no staging left behind
    one_pass = _stored(s3, bucket, "hotload/run-v000001")

    code, _, err = run(
        capsys, "snapshot", "diff", str(base), str(new), "--out", str(tmp_path / "delta"), *identity[:4]
    )  # fmt: skip
    assert code == 0, err
    code, hot, err = run(
        capsys, "hotload", "publish", "--deployment", "dep-2", "--checkpoint", str(tmp_path / "delta"), *identity[:2],
        *identity[4:],
    )  # fmt: skip
    assert code == 0 and hot["spec"]["type"] == "INCREMENTAL", err
    two_steps = _stored(s3, bucket, "other/run-v000001")
    assert sorted(one_pass) == ["model-00000-of-00001.safetensors", "model.safetensors.index.json"]
    assert one_pass == two_steps  # the same objects, byte for byte

    code, hot, err = run(
        capsys, "hotload", "publish", "--deployment", "dep-3", "--checkpoint", str(new), "--base", str(base),
        "--keep", str(tmp_path / "kept"), *identity,
    )  # fmt: skip
    assert code == 0 and hot["status"]["state"] == "COMPLETED", err
    assert _stored(s3, bucket, "kept/run-v000001") == one_pass
    kept = {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}
    assert kept == {p.name: p.read_bytes() for p in (tmp_path / "delta").iterdir()}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--keep", "k"], "error: --keep DIR needs --base DIR (it keeps the delta publish computes)\n"),
        (["--base", "b"], "error: --base needs --previous-identity ID (the identity whose weights --base holds)\n"),
    ],
)
def test_publish_base_and_keep_usage(
    fake: FakeAPI, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    argv = ["hotload", "publish", "--deployment", "dep-1", "--checkpoint", "c", "--identity", "i", *options]
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, None, message) and not fake.calls


def test_publish_base_of_identical_checkpoints_publishes_nothing(
    fake: FakeAPI,
    publishing: list[dict[str, Any]],
    s3_bucket: tuple[Any, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    s3, bucket = s3_bucket
    fake.deployments["dep-1"]["spec"]["hotLoad"].update(bucket=bucket, pathPrefix="hotload")
    fake.add_hot_load("h0", "a")  # a predecessor the service takes: completed, and stored
    s3.put_object(Bucket=bucket, Key=f"hotload/a/{INDEX_NAME}", Body=b"{}")
    ckpt = _checkpoint(tmp_path / "ckpt")
    argv = ["hotload", "publish", "--deployment", "dep-1", "--checkpoint", str(ckpt), "--base", str(ckpt)]
    code, out, err = run(capsys, *argv, "--identity", "b", "--previous-identity", "a", "--keep", str(tmp_path / "k"))
    assert code == 1 and out is None and "an empty delta is never published" in err
    code, out, err = run(capsys, *argv, "--identity", "b", "--previous-identity", "a")
    assert code == 1 and out is None and "no tensor changed between 'a' and 'b'" in err
    assert not [c for c in fake.calls if c[:2] == ("POST", "/hotLoads")]


# -------------------------------------------------------------------- error table


def _raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Make every hotload command raise ``error`` (from where it opens its API client)."""
    import cwtrain.cli.hotload

    def client_from_args(args: Any) -> InferenceClient:
        raise error

    monkeypatch.setattr(cwtrain.cli.hotload, "client_from_args", client_from_args)


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (KeyboardInterrupt(), 130, "error: interrupted"),
        (UsageError("give  either\n one"), 1, "error: give either one"),
        (TransportError("cannot reach the API"), 1, "error: unavailable: cannot reach the API"),
        (FileNotFoundError(2, "No such file", "/x"), 1, "error: [Errno 2] No such file: '/x'"),
        (NoCredentialsError(), 1, "error: Unable to locate credentials"),
    ],
)
def test_error_table_gives_one_line_and_the_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: BaseException, code: int, line: str
) -> None:
    _raising(monkeypatch, error)
    monkeypatch.delenv("CWTRAIN_DEBUG", raising=False)
    got, out, err = run(capsys, "hotload", "cancel", "h")
    assert (got, out, err) == (code, None, line + "\n")


def test_other_errors_are_bugs_reported_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _raising(monkeypatch, RuntimeError("bug\nsecond line"))
    monkeypatch.delenv("CWTRAIN_DEBUG", raising=False)
    code, out, err = run(capsys, "hotload", "cancel", "h")
    assert (code, out) == (1, None)
    assert err == (
        "error: internal error (RuntimeError: bug second line); this is a bug in cwtrain: "
        "rerun with -v and report the traceback\n"
    )


def test_only_non_exceptions_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    _raising(monkeypatch, SystemExit(3))
    with pytest.raises(SystemExit):
        main(["hotload", "cancel", "h"])


def test_debug_variable_adds_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    _raising(monkeypatch, UsageError("nope"))
    monkeypatch.setenv("CWTRAIN_DEBUG", "yes")
    with caplog.at_level(logging.DEBUG):
        code, _, err = run(capsys, "hotload", "cancel", "h")
    assert code == 1 and err.endswith("error: nope\n")
    failed = [r for r in caplog.records if r.getMessage() == "command failed"]
    assert failed and failed[0].exc_info is not None and failed[0].exc_info[0] is UsageError


def test_a_bad_debug_variable_is_a_configuration_error(
    fake: FakeAPI, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CWTRAIN_DEBUG", "maybe")
    code, out, err = run(capsys, "hotload", "cancel", "h")
    assert (code, out) == (1, None)
    assert err == "error: CWTRAIN_DEBUG='maybe' is not a boolean (use 1/true/yes/on or 0/false/no/off)\n"
    assert not fake.calls


def test_the_table_is_the_one_main_uses() -> None:
    from cwtrain.cli.errors import ERROR_EXITS, find_exit

    assert [row.code for row in ERROR_EXITS] == [143, 130, 1, 1, 1, 1, 1, 1]
    assert find_exit(ConfigError("x")) is ERROR_EXITS[2] and find_exit(RuntimeError()) is ERROR_EXITS[-1]
    assert find_exit(SystemExit(0)) is None


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            ModuleNotFoundError("No module named 'torch'", name="torch"),
            "error: No module named 'torch'; torch is needed by the torch publishing path, the local stack and its "
            'demo; install it from a cwtrain checkout: pip install "./packages/cwtrain-core[torch]"',
        ),
        (
            ModuleNotFoundError("No module named 'cwtrain.local'", name="cwtrain.local.stack"),
            "error: No module named 'cwtrain.local'; cwtrain.local is part of cwtrain-local; install it from a "
            "cwtrain checkout: pip install ./packages/cwtrain-local",
        ),
        (
            ModuleNotFoundError("No module named 'ray'", name="ray"),
            "error: No module named 'ray'; cwtrain's Ray plug-in runs inside Ray any version "
            '(pip install "ray>=2.30"; the framework images ship it); install the plug-in from a cwtrain '
            "checkout: pip install ./packages/cwtrain-slime",
        ),
        (ImportError("x is not importable: pip install ./packages/cwtrain-gym"), None),
        (ModuleNotFoundError("No module named 'nosuch'", name="nosuch"), "internal error"),
    ],
)
def test_a_missing_optional_dependency_is_one_line_with_its_install(error: ImportError, line: str | None) -> None:
    """Issue 27: a missing torch (or other optional module) says what to install, not a bare ModuleNotFoundError."""
    import io

    from cwtrain.cli.errors import fail

    stream = io.StringIO()
    assert fail(error, debug=False, stream=stream) == 1
    text = stream.getvalue().rstrip("\n")
    if line is None:
        assert text == f"error: {error}"
    elif line == "internal error":
        assert "this is a bug" in text
    else:
        assert text == line

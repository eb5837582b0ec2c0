"""Answers that say what happened, through the CLI (and the library) on the local stack.

An unknown deployment, a hot-load named by its identity, an object store that does not
answer, a mistyped option, and what a library publish shows without logging set up: each
is the exit code and the exact line a user reads.
"""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cwtrain.cli import build_parser, main
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient, s3_client
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import write_base_checkpoint

POLL = ("--poll-interval", "0.1")


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("cli-answers", replicas=1) as local:
        yield local


@pytest.fixture(scope="module")
def deployment(stack: LocalStack) -> str:
    return str(stack.deploy(name="answers", replicas=1).deployment_id)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("answers") / "base"
    write_base_checkpoint(path, seed=0)
    return path


@pytest.fixture
def env(stack: LocalStack, deployment: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {**stack.env(), "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": deployment}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err.strip().splitlines()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unknown_deployment_is_named_by_list_as_by_get(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "hotload", "list", "--deployment", "1234")
    assert (code, out, err) == (1, None, ["error: not_found: deployment 1234 not found"])
    assert _run(capsys, "deployment", "get", "1234")[2] == err  # the same words as deployment get
    code, listed, _ = _run(capsys, "hotload", "list")  # the known one still lists (from the environment)
    assert code == 0 and isinstance(listed, list)


def test_status_and_wait_take_an_identity(
    env: dict[str, str],
    deployment: str,
    checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    publish = ("hotload", "publish", "--checkpoint", str(checkpoint), *POLL)
    code, first, _ = _run(capsys, *publish, "--identity", "ans-v000001")
    assert code == 0 and first["status"]["state"] == "COMPLETED"
    assert _run(capsys, *publish, "--identity", "ans-v000002")[0] == 0
    code, again, _ = _run(capsys, "hotload", "rollback", "--identity", "ans-v000001", *POLL)
    assert code == 0 and again["spec"]["id"] != first["spec"]["id"]  # a second hot-load of ans-v000001

    caplog.clear()
    code, status, _ = _run(capsys, "hotload", "status", "ans-v000001")
    assert code == 0 and status["hot_load"]["spec"]["id"] == again["spec"]["id"]  # the newest of the two
    found = f"identity ans-v000001: hot-load {again['spec']['id']} (the newest of 2) on deployment {deployment}"
    assert [r.getMessage() for r in caplog.records if r.name == "cwtrain.cli"] == [found]  # stderr in a shell
    assert [r["current_snapshot_identity"] for r in status["replicas"]] == ["ans-v000001"]
    code, waited, _ = _run(capsys, "hotload", "wait", "ans-v000002", *POLL)
    assert code == 0 and waited["spec"]["identity"] == "ans-v000002" and waited["status"]["state"] == "COMPLETED"
    code, by_id, _ = _run(capsys, "hotload", "status", first["spec"]["id"])  # an id still works as it did
    assert code == 0 and by_id["hot_load"]["spec"]["id"] == first["spec"]["id"]

    code, _, err = _run(capsys, "hotload", "status", "ans-v000009")
    assert (code, err) == (
        1,
        [
            f"error: not_found: no hot-load ans-v000009: it is neither a hot-load id nor an identity hot-loaded on "
            f"deployment {deployment}; 'cwtrain hotload list --deployment {deployment}' shows the hot-load ids and "
            "their identities"
        ],
    )
    code, _, err = _run(capsys, "hotload", "wait", "ans-v000001", "--deployment", "1234")
    assert (code, err) == (1, ["error: not_found: deployment 1234 not found"])


def test_without_a_deployment_the_line_says_how_to_find_the_id(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID")
    code, _, err = _run(capsys, "hotload", "status", "ans-v000001")
    assert (code, err) == (
        1,
        [
            "error: not_found: hot-load ans-v000001 not found; if ans-v000001 is an identity, pass --deployment ID "
            "(or set CWTRAIN_HOTLOAD_DEPLOYMENT_ID) to look it up; 'cwtrain hotload list --deployment ID' shows "
            "the hot-load ids"
        ],
    )


def test_help_says_both_forms(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("status", "wait"):
        assert main(["hotload", command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert f"usage: cwtrain hotload {command} [-h] [--deployment ID]" in text and " HOTLOAD" in text
        assert "HOTLOAD is a hot-load id, or a snapshot identity (e.g. run1-v000003)" in text


def test_an_object_store_that_does_not_answer_is_one_line_naming_the_variable(
    env: dict[str, str], checkpoint: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = env["CWTRAIN_LOCAL_BUCKET"]
    closed = f"http://127.0.0.1:{_free_port()}"
    publish = ("hotload", "publish", "--checkpoint", str(checkpoint), "--identity", "s3-v000001")
    monkeypatch.setenv("CW_S3_ENDPOINT", closed)
    code, _, err = _run(capsys, *publish)
    assert (code, err) == (
        1,
        [
            f"error: cannot reach the object store at CW_S3_ENDPOINT={closed} (ListObjectsV2: could not connect to "
            f"{closed}/{bucket}: Failed to establish a new connection: [Errno 111] Connection refused); check that "
            "CW_S3_ENDPOINT names a running S3-compatible endpoint"
        ],
    )
    # unset: the line says so and which default was used (a closed port stands in for https://cwobject.com)
    monkeypatch.delenv("CW_S3_ENDPOINT")
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setattr("cwtrain.infra.s3.DEFAULT_S3_ENDPOINT", closed)
    code, _, err = _run(capsys, *publish)
    assert (code, err) == (
        1,
        [
            f"error: cannot reach the object store at {closed}: CW_S3_ENDPOINT is not set, so cwtrain used the "
            f"default {closed} (ListObjectsV2: could not connect to {closed}/{bucket}: Failed to establish a new "
            "connection: [Errno 111] Connection refused); set CW_S3_ENDPOINT to the object store's endpoint (for "
            'the local stack: eval "$(cwtrain local env)")'
        ],
    )
    # nothing was stored: the identity publishes once the endpoint is right
    monkeypatch.setenv("CW_S3_ENDPOINT", env["CW_S3_ENDPOINT"])
    code, done, _ = _run(capsys, *publish, *POLL)
    assert code == 0 and done["status"]["state"] == "COMPLETED"


def test_credentials_the_object_store_refuses_are_one_line_naming_the_variable(
    env: dict[str, str], checkpoint: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    publish = ("hotload", "publish", "--checkpoint", str(checkpoint), "--identity", "keys-v000001")
    endpoint, bucket = env["CW_S3_ENDPOINT"], env["CWTRAIN_LOCAL_BUCKET"]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    code, _, err = _run(capsys, *publish)
    assert (code, err) == (
        1,
        [
            f"error: the object store at {endpoint} refused the credentials (SignatureDoesNotMatch on ListObjectsV2: "
            "The request signature we calculated does not match the signature you provided. Check your key and "
            "signing method.); check AWS_SECRET_ACCESS_KEY: it must be the secret key of AWS_ACCESS_KEY_ID"
        ],
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env["AWS_SECRET_ACCESS_KEY"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    code, _, err = _run(capsys, *publish)
    assert (code, err) == (
        1,
        [
            f"error: the object store at {endpoint} refused the credentials (InvalidAccessKeyId on ListObjectsV2: "
            "The AWS Access Key Id you provided does not exist in our records.); check AWS_ACCESS_KEY_ID: the store "
            "knows no such access key"
        ],
    )
    # nothing was stored under the identity: it publishes once the keys are right
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", env["AWS_ACCESS_KEY_ID"])
    stored = s3_client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert not [item["Key"] for item in stored if "keys-v000001" in item["Key"]]
    code, done, _ = _run(capsys, *publish, *POLL)
    assert code == 0 and done["status"]["state"] == "COMPLETED"


def test_an_unknown_option_is_named_first(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        ("hotload", "publish", "--checkpiont", "x"): "cwtrain hotload publish: error: unrecognized argument "
        "--checkpiont (did you mean --checkpoint?)",
        ("hotload", "list", "--limt", "3", "--zzz-top"): "cwtrain hotload list: error: unrecognized arguments "
        "--limt (did you mean --limit?), --zzz-top",
        ("--bse-url", "http://x", "hotload", "list"): "cwtrain: error: unrecognized argument --bse-url "
        "(did you mean --base-url?)",
        ("hotload", "status", "--deployment=d", "--verbos", "x"): "cwtrain hotload status: error: unrecognized "
        "argument --verbos",
    }
    for argv, line in cases.items():
        assert main(list(argv)) == 2, argv
        assert capsys.readouterr().err.strip().splitlines()[-1] == line
    # what argparse accepts is still accepted: an abbreviation, --opt=value, a negative number as a value
    args = build_parser().parse_args(["hotload", "list", "--lim", "3", "--deployment=d"])
    assert (args.limit, args.deployment) == (3, "d")
    assert main(["hotload", "wait", "x", "--timeout", "-1"]) == 2
    assert "must be a finite number > 0" in capsys.readouterr().err


def _leaf_parsers(parser: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    commands = [action for action in parser._actions if action.nargs == "A..."]  # argparse.PARSER
    if not commands:
        yield path, parser
    for action in commands:
        for name, sub in action.choices.items():
            yield from _leaf_parsers(sub, (*path, name))


def test_every_command_names_an_unknown_option(capsys: pytest.CaptureFixture[str]) -> None:
    leaves = [(path, p) for path, p in _leaf_parsers(build_parser()) if "-" in p.prefix_chars]
    assert len(leaves) > 20
    for path, _ in leaves:
        assert main([*path, "--no-such-option"]) == 2, path
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == f"cwtrain {' '.join(path)}: error: unrecognized argument --no-such-option", path


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_library_publish_shows_the_upload_and_logs_each_stage(
    stack: LocalStack,
    deployment: str,
    checkpoint: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        loader = HotLoader(api, deployment, s3=stack.s3_client(), timeout=120, poll_interval=0.1)
        with caplog.at_level(logging.INFO, logger="cwtrain"):
            loader.publish(checkpoint, "lib-v000001")
        lines = [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("cwtrain")]
        names = [name for name, _ in lines]
        assert names.count("cwtrain.progress") == 1  # one line per stage, not one per object
        upload = next(text for name, text in lines if name == "cwtrain.progress")
        assert upload.startswith("uploading lib-v000001: ") and "(100%)" in upload and " in " in upload
        assert any(n == "cwtrain.infra.client" and "hot-load" in t and "'lib-v000001'" in t for n, t in lines)
        assert any(n == "cwtrain.hotload.follow" and "lib-v000001" in t and "completed" in t for n, t in lines)
        # on a terminal, the upload is drawn as the CLI draws it, with no logging set up
        terminal = _Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        loader.publish(checkpoint, "lib-v000002")
        drawn = terminal.getvalue()
        assert drawn.startswith("\r\x1b[Kuploading lib-v000002: ") and drawn.endswith("\n") and "(100%)" in drawn

"""Secrets never appear in logs, errors or JSON output.

The CLI (in-process, ``-v``) and the library (``HotLoader`` publish, the rollout sampler) run
against the local stack with a distinctive API token, S3 keys, an extra API header and a
rollout API key set. Every log record of every logger at DEBUG, stdout, stderr and the text
of the errors raised on purpose (a bad request, a failing hot-load, unauthenticated calls) are
searched for each secret value.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _recording import run_cli

from cwtrain.errors import CWTrainError, HotLoadFailedError
from cwtrain.hotload.loader import HotLoader
from cwtrain.infra import InferenceClient
from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig, SamplingParams
from cwtrain.local import LocalStack

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("secrets"), pytest.mark.e2e]

API_TOKEN = "cwtok-SECRET-api-" + uuid.uuid4().hex
WRONG_TOKEN = "cwtok-SECRET-wrong-" + uuid.uuid4().hex
S3_KEY_ID = "AKSECRETS3KEYID" + uuid.uuid4().hex[:8].upper()
S3_SECRET = "s3-SECRET-access-" + uuid.uuid4().hex
S3_SESSION = "s3-SECRET-session-" + uuid.uuid4().hex
HEADER_SECRET = "hdr-SECRET-" + uuid.uuid4().hex
ROLLOUT_KEY = "rollout-SECRET-key-" + uuid.uuid4().hex
SECRETS = {
    "API token": API_TOKEN,
    "wrong API token": WRONG_TOKEN,
    "S3 access key id": S3_KEY_ID,
    "S3 secret key": S3_SECRET,
    "S3 session token": S3_SESSION,
    "API header": HEADER_SECRET,
    "rollout API key": ROLLOUT_KEY,
}
LOUD = ("", "cwtrain", "httpx", "httpcore", "botocore", "boto3", "s3transfer", "urllib3")
POLL = "0.1"


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    # A stack of its own, not the session's: its admin token is one of the secrets searched for.
    # Its object store accepts only the secret S3 keys, so every S3 call is signed with them.
    with (
        LocalStack(replicas=1, token=API_TOKEN, s3_keys=(S3_KEY_ID, S3_SECRET)) as local,
        pytest.MonkeyPatch.context() as patch,
    ):
        env = {
            **local.env(),
            "AWS_SESSION_TOKEN": S3_SESSION,
            "CWTRAIN_API_HEADERS": json.dumps({"X-Org-Secret": HEADER_SECRET}),
            "CWTRAIN_ROLLOUT_API_KEY": ROLLOUT_KEY,
        }
        for key, value in env.items():
            patch.setenv(key, value)
        patch.delenv("CWTRAIN_DEBUG", raising=False)
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="secrets")


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every logger at DEBUG, captured (the CLI's ``-v`` sets the same levels)."""
    for name in LOUD:
        caplog.set_level(logging.DEBUG, logger=name or None)
    return caplog


def _assert_clean(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    """None of the secret values in the captured records (message, arguments, exception) or texts."""
    assert caplog.records, "nothing was logged: the capture is not working"
    captured = [("the formatted log", caplog.text)]
    for record in caplog.records:
        where = f"a log record of {record.name}"
        captured += [(where, record.getMessage()), (where, repr(record.args))]
        if record.exc_info and record.exc_info[1] is not None:
            captured.append((where, repr(record.exc_info[1])))
    captured += [("output or error text", text) for text in texts]
    leaks = [
        f"the {what} in {where}: ...{text[max(0, text.find(secret) - 150) :][:300]}..."
        for what, secret in SECRETS.items()
        for where, text in captured
        if secret in text
    ]
    assert not leaks, "\n".join(dict.fromkeys(leaks))


def _cli(*argv: str) -> tuple[int, str, str]:
    return run_cli(["-v", *argv])


# -------------------------------------------------------------------------- CLI


def test_cli_success_paths(
    stack: LocalStack, target: Any, debug_logs: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from cwtrain.local.engine.model import write_base_checkpoint

    write_base_checkpoint(tmp_path / "ckpt", seed=3)
    outputs: list[str] = []
    for argv in (
        ["deployment", "get", target.deployment_id],
        ["hotload", "check", "--deployment", target.deployment_id],
        [
            "hotload", "publish", "--deployment", target.deployment_id, "--checkpoint", str(tmp_path / "ckpt"),
            "--identity", "secrets-cli-v000001", "--timeout", "120", "--poll-interval", POLL,
        ],
        ["hotload", "list", "--deployment", target.deployment_id],
    ):  # fmt: skip
        code, out, err = _cli(*argv)
        assert code == 0, err
        json.loads(out)
        outputs += [out, err]
    hot_load = json.loads(outputs[4])
    assert hot_load["spec"]["identity"] == "secrets-cli-v000001" and hot_load["status"]["state"] == "COMPLETED"
    code, out, err = _cli("hotload", "status", hot_load["spec"]["id"])
    assert code == 0, err
    assert any(r.name == "botocore.endpoint" for r in debug_logs.records), "no request log of the store captured"
    _assert_clean(debug_logs, *outputs, out, err)


def test_cli_error_paths(stack: LocalStack, target: Any, debug_logs: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "secrets-bad", "gatewayIds": [], "model": {"name": "x"}}))
    texts: list[str] = []
    for argv in (
        ["deployment", "create", "-f", str(bad)],  # the API refuses it
        ["--token", WRONG_TOKEN, "deployment", "get", target.deployment_id],  # unauthenticated
        ["deployment", "get", "no-such-deployment"],
        [
            "hotload", "trigger", "--deployment", target.deployment_id, "--identity", "secrets-missing-v000001",
            "--timeout", "120", "--poll-interval", POLL,
        ],  # nothing uploaded: the hot-load fails
    ):  # fmt: skip
        code, out, err = _cli(*argv)
        assert code == 1, (argv, out, err)
        assert "error:" in err
        texts += [out, err]
    _assert_clean(debug_logs, *texts)


def test_cli_unauthenticated_with_the_token_in_the_environment_only(
    stack: LocalStack, target: Any, debug_logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COREWEAVE_API_TOKEN", WRONG_TOKEN)
    code, out, err = _cli("hotload", "list", "--deployment", target.deployment_id)
    assert code == 1 and "unauthenticated" in err.lower(), err
    _assert_clean(debug_logs, out, err)


# ---------------------------------------------------------------------- library


def test_library_publish_and_failing_hot_load(
    stack: LocalStack, target: Any, debug_logs: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from cwtrain.hotload.files.write import write_full_snapshot
    from cwtrain.local.engine.model import init_weights, write_base_checkpoint

    texts: list[str] = []
    with InferenceClient(timeout=10) as api:
        loader = HotLoader(api, target.deployment_id, timeout=120, poll_interval=float(POLL))
        hot_load = loader.publish(init_weights(seed=5), "secrets-lib-v000001", extra_files={"config.json": b"{}"})
        texts += [repr(hot_load), json.dumps(hot_load.to_json()), repr(api), repr(loader)]
        with pytest.raises(CWTrainError) as refused:  # the service refuses an unknown predecessor
            loader.publish(init_weights(seed=6), "secrets-lib-v000002", previous_identity="secrets-nothing-v000000",
                           base=init_weights(seed=5))  # fmt: skip
        texts += [str(refused.value), repr(refused.value)]
        # a corrupt FULL snapshot: the engine refuses it and the hot-load fails
        write_base_checkpoint(tmp_path / "src", seed=7)
        info = loader.upload(write_full_snapshot(tmp_path / "src", tmp_path / "full"), "secrets-lib-v000003")
        stack.faults.flip_byte(target.bucket, f"{target.path_prefix}/secrets-lib-v000003/model.safetensors", offset=-3)
        corrupt = loader.trigger("secrets-lib-v000003", info)
        with pytest.raises(HotLoadFailedError) as failed:
            loader.wait(corrupt.id)
        texts += [str(failed.value), repr(failed.value), json.dumps(failed.value.hot_load.to_json())]
        code, out, err = _cli("hotload", "wait", corrupt.id, "--timeout", "60", "--poll-interval", POLL)
        assert code == 1 and json.loads(out)["status"]["state"] == "FAILED", err
        texts += [out, err]
    with InferenceClient(WRONG_TOKEN) as wrong:
        with pytest.raises(CWTrainError) as refused:
            wrong.get_deployment(target.deployment_id)
        texts += [str(refused.value), repr(refused.value), repr(wrong)]
    _assert_clean(debug_logs, *texts)


def test_rollout_sampler(stack: LocalStack, target: Any, debug_logs: pytest.LogCaptureFixture) -> None:
    config = RolloutConfig.from_env(
        {"CWTRAIN_ROLLOUT_BASE_URL": target.base_url, "CWTRAIN_ROLLOUT_MODEL": target.model}, api_key=API_TOKEN
    )
    params = SamplingParams(max_tokens=4)
    with CompletionSampler(config) as sampler:
        batch = sampler.sample_groups_sync([[1, 2, 3]], 2, params)
        assert len(batch.groups[0]) == 2
        texts = [repr(config), repr(sampler), repr(batch.groups[0][0]), json.dumps(batch.metrics, default=str)]
    unauthenticated = RolloutConfig.from_env(
        {"CWTRAIN_ROLLOUT_BASE_URL": target.base_url, "CWTRAIN_ROLLOUT_MODEL": target.model,
         "CWTRAIN_ROLLOUT_API_KEY": ROLLOUT_KEY, "CWTRAIN_ROLLOUT_MAX_ATTEMPTS": "1"}
    )  # fmt: skip
    assert unauthenticated.api_key == ROLLOUT_KEY
    with CompletionSampler(unauthenticated) as sampler, pytest.raises(CWTrainError) as refused:
        sampler.sample_groups_sync([[1, 2, 3]], 2, params)
    texts += [str(refused.value), repr(refused.value), repr(unauthenticated)]
    _assert_clean(debug_logs, *texts)


def test_store_request_logs_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    """botocore's request log line, as it is written, comes out with its signing material masked."""
    import cwtrain.infra.s3  # noqa: F401  (installs the filter)

    caplog.set_level(logging.DEBUG, logger="botocore")
    headers = {
        "X-Amz-Date": b"20261129T094911Z",
        "Authorization": f"AWS4-HMAC-SHA256 Credential={S3_KEY_ID}/20261129/US-EAST-04A/s3/aws4_request, "
        "SignedHeaders=host, Signature=683cc858".encode(),
        "X-Amz-Security-Token": S3_SESSION.encode(),
    }
    logging.getLogger("botocore.endpoint").debug("Sending http request: <AWSPreparedRequest headers=%s>", headers)
    logging.getLogger("botocore.auth").debug("CanonicalRequest:\nGET\n/\n\nx-amz-security-token:%s\n", S3_SESSION)
    logging.getLogger("botocore.endpoint").debug(
        "GET https://s3/?X-Amz-Credential=%s%%2F20261129&X-Amz-Security-Token=%s", S3_KEY_ID, S3_SESSION
    )
    assert len(caplog.records) == 3
    assert all("***" in r.getMessage() for r in caplog.records)
    assert "X-Amz-Date" in caplog.records[0].getMessage()  # the rest of the line is kept
    _assert_clean(caplog)

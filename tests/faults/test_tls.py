"""TLS verification: on by default for the API, the object store and the rollout endpoint.

Turning it off takes an explicit option (``verify=False``, ``CWTRAIN_API_INSECURE=1``) and
logs a warning. Checked on the clients' real configuration (the SSL context httpx built,
botocore's ``verify`` setting); nothing is sent.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cwtrain.infra import InferenceClient
from cwtrain.infra.s3 import s3_client
from cwtrain.integrations.rollout import CompletionSampler, RolloutConfig

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("tls")]

ORIGIN = "https://api.example.invalid"
TOKEN = "t0k3n-tls-check"


def _ssl_context(client: Any) -> ssl.SSLContext:
    """The SSL context of an httpx client's connection pool (what a handshake would use)."""
    context = client._transport._pool._ssl_context
    assert isinstance(context, ssl.SSLContext)
    return context


def _verifies(context: ssl.SSLContext) -> bool:
    return context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("CWTRAIN_API_INSECURE", "CWTRAIN_API_HEADERS", "AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "US-EAST-04A")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "tls-check")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tls-check")
    yield monkeypatch


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- API


@pytest.mark.parametrize("insecure", [None, "", "0", "false", "off"])
def test_api_client_verifies_by_default(
    insecure: str | None, clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if insecure is not None:
        clean_env.setenv("CWTRAIN_API_INSECURE", insecure)
    caplog.set_level(logging.DEBUG)
    with InferenceClient(TOKEN, base_url=ORIGIN) as client:
        assert _verifies(_ssl_context(client._http))
    assert not any("TLS" in w for w in _warnings(caplog))


def test_api_client_with_a_ca_bundle_still_verifies(clean_env: pytest.MonkeyPatch) -> None:
    bundle = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    if not Path(bundle).is_file():
        pytest.skip("no system CA bundle file")
    with InferenceClient(TOKEN, base_url=ORIGIN, verify=bundle) as client:
        assert _verifies(_ssl_context(client._http))


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_api_insecure_variable_turns_verification_off_and_warns(
    value: str, clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("CWTRAIN_API_INSECURE", value)
    with InferenceClient(TOKEN, base_url=ORIGIN) as client:
        context = _ssl_context(client._http)
        assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    assert any("CWTRAIN_API_INSECURE" in w and "not verified" in w for w in _warnings(caplog))


def test_api_verify_false_turns_verification_off_and_warns(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with InferenceClient(TOKEN, base_url=ORIGIN, verify=False) as client:
        context = _ssl_context(client._http)
        assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    warnings = _warnings(caplog)
    assert any("verify=False" in w and "not verified" in w for w in warnings), warnings
    assert not any(TOKEN in w for w in warnings)


# ------------------------------------------------------------------------ store


def test_store_client_verifies_by_default(clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = s3_client("https://cwobject.example.invalid")
    verify = client._endpoint.http_session._verify
    # botocore: a CA bundle path (or True) verifies; only False turns it off.
    assert verify is True or (isinstance(verify, str) and Path(verify).is_file()), verify
    assert not any("TLS" in w for w in _warnings(caplog))


def test_store_verify_false_turns_verification_off_and_warns(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = s3_client("https://cwobject.example.invalid", verify=False)
    assert client._endpoint.http_session._verify is False
    assert any("TLS verification" in w and "OFF" in w for w in _warnings(caplog))


def test_store_ca_bundle_is_used_for_verification(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    client = s3_client("https://cwobject.example.invalid", verify=str(bundle))
    assert client._endpoint.http_session._verify == str(bundle)


# ---------------------------------------------------------------------- rollout


def test_rollout_sampler_verifies(clean_env: pytest.MonkeyPatch) -> None:
    sampler = CompletionSampler(RolloutConfig("https://gw.example.invalid/v1", "tiny", api_key=TOKEN))
    try:
        assert _verifies(_ssl_context(sampler._http()))
    finally:
        sampler.close()

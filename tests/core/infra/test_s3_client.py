"""s3_client: endpoint order, addressing style, region, pool, checksums, TLS verification."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config

from cwtrain.errors import ConfigError
from cwtrain.infra.s3 import DEFAULT_S3_ENDPOINT, addressing_style, resolve_endpoint, s3_client

_AWS_VARS = (
    "CW_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "CW_S3_MAX_POOL",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in _AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "US-EAST-04A")
    return monkeypatch


def test_endpoint_order(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert s3_client().meta.endpoint_url == DEFAULT_S3_ENDPOINT
    (tmp_path / "config").write_text(
        "[default]\nservices = store\n[services store]\ns3 =\n  endpoint_url = http://profile-s3.example:9000\n"
    )
    assert s3_client().meta.endpoint_url == "http://profile-s3.example:9000"
    clean_env.setenv("AWS_ENDPOINT_URL", "http://global.example")
    assert s3_client().meta.endpoint_url == "http://global.example"
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://service.example/")
    assert s3_client().meta.endpoint_url == "http://service.example"
    clean_env.setenv("CW_S3_ENDPOINT", "http://cwlota.com")
    assert s3_client().meta.endpoint_url == "http://cwlota.com"
    assert s3_client("https://explicit.example").meta.endpoint_url == "https://explicit.example"
    clean_env.delenv("CW_S3_ENDPOINT")
    clean_env.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert s3_client().meta.endpoint_url == DEFAULT_S3_ENDPOINT


def test_bad_endpoint_is_a_config_error(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CW_S3_ENDPOINT", "cwobject.com")
    with pytest.raises(ConfigError, match="CW_S3_ENDPOINT"):
        resolve_endpoint()


@pytest.mark.parametrize(
    ("endpoint", "style"),
    [
        ("https://cwobject.com", "virtual"),
        ("http://cwlota.com", "virtual"),
        ("http://127.0.0.1:9000", "path"),
        ("http://[::1]:9000", "path"),
        ("http://10.0.0.7", "path"),
        ("http://localhost:4566", "path"),
        ("http://minio:9000", "path"),
    ],
)
def test_addressing_style(endpoint: str, style: str) -> None:
    assert addressing_style(endpoint) == style


def test_virtual_hosted_urls_for_coreweave(clean_env: pytest.MonkeyPatch) -> None:
    client = s3_client()
    url = client.generate_presigned_url("get_object", Params={"Bucket": "weights", "Key": "p/x"})
    assert url.startswith("https://weights.cwobject.com/p/x?")
    client = s3_client("http://127.0.0.1:9000")
    url = client.generate_presigned_url("get_object", Params={"Bucket": "weights", "Key": "p/x"})
    assert url.startswith("http://127.0.0.1:9000/weights/p/x?")


def test_region_is_required_and_named(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.delenv("AWS_REGION")
    with pytest.raises(ConfigError, match="AWS_REGION"):
        s3_client()
    clean_env.setenv("AWS_DEFAULT_REGION", "US-WEST-01A")
    assert s3_client().meta.region_name == "US-WEST-01A"
    clean_env.delenv("AWS_DEFAULT_REGION")
    (tmp_path / "config").write_text("[default]\nregion = US-CENTRAL-02A\n")
    assert s3_client().meta.region_name == "US-CENTRAL-02A"
    clean_env.setenv("AWS_REGION", "US-EAST-04A")
    assert s3_client().meta.region_name == "US-EAST-04A"
    assert s3_client(region_name="EU-1A").meta.region_name == "EU-1A"


def test_client_settings(clean_env: pytest.MonkeyPatch) -> None:
    config = s3_client().meta.config
    assert config.signature_version == "s3v4"
    assert config.retries == {"mode": "adaptive", "total_max_attempts": 6}  # 5 retries after the first try
    assert config.max_pool_connections == 128
    assert config.request_checksum_calculation == "when_required"
    assert config.s3["addressing_style"] == "virtual"


@pytest.mark.parametrize(("value", "pool", "warns"), [("300", 300, False), ("3", 10, False), ("lots", 128, True)])
def test_pool_size(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str, pool: int, warns: bool
) -> None:
    clean_env.setenv("CW_S3_MAX_POOL", value)
    caplog.set_level(logging.WARNING, logger="cwtrain.infra.s3")
    assert s3_client().meta.config.max_pool_connections == pool
    assert any("CW_S3_MAX_POOL" in r.getMessage() for r in caplog.records) is warns


def test_user_config_is_merged(clean_env: pytest.MonkeyPatch) -> None:
    config = s3_client(config=Config(s3={"payload_signing_enabled": True}, connect_timeout=3)).meta.config
    assert config.s3 == {"addressing_style": "virtual", "payload_signing_enabled": True}
    assert config.connect_timeout == 3 and config.request_checksum_calculation == "when_required"


def test_tls_verification_off_warns(clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cwtrain.infra.s3")
    s3_client()
    assert not caplog.records
    s3_client(verify=False)
    assert any("TLS verification" in r.getMessage() for r in caplog.records)


def test_requests_carry_no_sdk_checksum_headers(s3_bucket: tuple[Any, str], s3_env: dict[str, str]) -> None:
    """when_required: S3-compatible stores get plain requests; unsigned payloads hash nothing twice."""
    _, bucket = s3_bucket
    client = s3_client()
    sent: list[dict[str, str]] = []
    client.meta.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers)))
    client.put_object(Bucket=bucket, Key="k", Body=b"data")
    headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in sent[0].items()}
    assert not [h for h in headers if h.startswith("x-amz-checksum") or h == "x-amz-sdk-checksum-algorithm"]
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"

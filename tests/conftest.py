"""Shared fixtures: a moto S3 server on loopback, started once per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = bool(torch.cuda.is_available())
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Any]:
    """moto's S3 server in a child process on 127.0.0.1 (cwtrain.local.objectstore)."""
    from cwtrain.local.objectstore import MotoS3Server

    with MotoS3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: Any) -> tuple[Any, str]:
    """A fresh, empty bucket on the session's S3 server: ``(client, bucket_name)``."""
    from cwtrain.local.objectstore import DEFAULT_REGION

    client = s3_server.client()
    name = f"test-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": DEFAULT_REGION})
    return client, name


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment variables pointing boto3 and cwtrain at the session's S3 server."""
    for key, value in s3_server.credentials.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return dict(os.environ)

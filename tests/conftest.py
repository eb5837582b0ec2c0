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


# ------------------------------------------------ fault matrix (docs/reliability.md)
# Each test marked ``fault_row("<id>")`` is counted per row and outcome; with
# CWTRAIN_FAULT_RESULTS=path the counts are written there as JSON at the end of the session
# ({"<row>": {"passed": n, "failed": m, ...}}), which scripts/reliability_table.py reads.
# Deselected items are remembered so that tests/faults/test_reliability_doc.py can count
# every test of a row also when ``-m``/``-k`` left some out.

_FAULT_RESULTS: dict[tuple[str, str], int] = {}
DESELECTED = pytest.StashKey[list[pytest.Item]]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash.setdefault(DESELECTED, []).extend(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    marker = item.get_closest_marker("fault_row")
    if marker is not None:
        outcome.get_result().fault_row = marker.args[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = getattr(report, "fault_row", None)
    if row and (report.when == "call" or report.outcome != "passed"):
        key = (row, report.outcome)
        _FAULT_RESULTS[key] = _FAULT_RESULTS.get(key, 0) + 1


_SESSION_START: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    import time

    _SESSION_START.append(time.monotonic())


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("CWTRAIN_FAULT_RESULTS")
    if target and _FAULT_RESULTS:
        import json
        import time
        from pathlib import Path

        rows: dict[str, Any] = {}
        for (row, outcome), count in sorted(_FAULT_RESULTS.items()):
            rows.setdefault(row, {})[outcome] = count
        if _SESSION_START:  # not a row: the session's wall time
            rows["_session"] = {"seconds": round(time.monotonic() - _SESSION_START[0], 1)}
        Path(target).write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")

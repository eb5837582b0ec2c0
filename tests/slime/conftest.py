"""Fixtures of the slime tests: the slime stand-in on sys.path, a clean hook, a recording loader."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "stubs"
sys.path.insert(0, str(Path(__file__).parent))

from recording_loader import RecordingLoader  # noqa: E402


def _drop(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def slime_stubs() -> Iterator[Path]:
    """``import slime`` resolves to the stand-in of tests/slime/stubs for this test."""
    _drop("slime")
    sys.path.insert(0, str(STUBS))
    try:
        yield STUBS
    finally:
        sys.path.remove(str(STUBS))
        _drop("slime")


@pytest.fixture(autouse=True)
def clean_hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh process-level publisher for every test, and no stray CWTRAIN_* variables."""
    import os

    from cwtrain.integrations.slime import reset

    for key in list(os.environ):
        if key.startswith("CWTRAIN_") or key == "RANK":
            monkeypatch.delenv(key)
    reset()
    yield
    reset()


@pytest.fixture
def recording_loader(s3_bucket: tuple[object, str]) -> RecordingLoader:
    """A real ``HotLoader`` on the API stand-in and a fresh bucket of the session's S3 server."""
    return RecordingLoader(*s3_bucket)

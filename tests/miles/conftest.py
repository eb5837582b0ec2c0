"""Fixtures of the miles tests: the miles stand-in on sys.path, a clean hook."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "stubs"
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "slime"))  # the slime test helpers (driver, fakes)


def _drop(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture
def miles_stubs() -> Iterator[Path]:
    """``import miles`` resolves to the stand-in of tests/miles/stubs for this test."""
    _drop("miles")
    sys.path.insert(0, str(STUBS))
    try:
        yield STUBS
    finally:
        sys.path.remove(str(STUBS))
        _drop("miles")


@pytest.fixture(autouse=True)
def clean_hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from cwtrain.integrations.miles import reset as reset_miles  # the post-save publisher, CoreWeaveRolloutFn
    from cwtrain.integrations.slime import reset

    for key in list(os.environ):
        if key.startswith("CWTRAIN_") or key == "RANK":
            monkeypatch.delenv(key)
    reset()
    reset_miles()
    yield
    reset()
    reset_miles()

"""Fixtures of the real-code contract suite: the framework's tree, a local stack, a fake endpoint.

Every test here skips, saying why, unless the real framework is importable from the tree a
variable names (``CWTRAIN_SLIME_SRC``, ``CWTRAIN_MILES_SRC``); ``scripts/contracts.sh`` runs
the suite with everything in place. CI runs the stand-in tests of tests/slime, tests/miles
and tests/recipes instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for helper in (HERE, HERE.parent / "slime"):  # real_frameworks, updater_ranks; fake_openai
    if str(helper) not in sys.path:
        sys.path.insert(0, str(helper))

from real_frameworks import framework_src  # noqa: E402


@pytest.fixture(scope="session")
def slime_src() -> Path:
    """The real slime tree (``CWTRAIN_SLIME_SRC``), importable in this process; else skip."""
    return framework_src("slime")


@pytest.fixture(scope="session")
def miles_src() -> Path:
    """The real miles tree (``CWTRAIN_MILES_SRC``), importable in this process; else skip."""
    return framework_src("miles")


@pytest.fixture(autouse=True)
def clean_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No stray CWTRAIN_* variables; a fresh plug-in runtime per test."""
    import os

    for key in list(os.environ):
        if key.startswith("CWTRAIN_") and key not in ("CWTRAIN_SLIME_SRC", "CWTRAIN_MILES_SRC"):
            monkeypatch.delenv(key)
    from cwtrain.integrations.slime import reset

    reset()
    yield
    reset()


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    """cwtrain-local: S3, control plane, gateway and two replicas of the tiny model."""
    from cwtrain.local import LocalStack

    with LocalStack(replicas=2) as local:
        yield local, local.deploy()


@pytest.fixture
def stack_env(stack: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The variables a trainer on the local stack needs (the spawned ranks inherit them)."""
    local, target = stack
    for key, value in local.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", target.deployment_id)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "120")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_FULL_EVERY", "0")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MIRROR", "0")
    return target

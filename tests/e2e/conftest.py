"""The end-to-end tests' shared run of ``cwtrain demo`` (one per session: it takes a while)."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One short run through ``cwtrain demo``: its exit code, JSON stdout, stderr and report."""
    from cwtrain.cli import main

    report = tmp_path_factory.mktemp("demo") / "report.html"
    capture = pytest.MonkeyPatch()
    out, err = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", out)
    capture.setattr(sys, "stderr", err)
    try:
        argv = ["demo", "--steps", "3", "--full-every", "2", "--no-check", "--replicas", "2", "--report", str(report)]
        code = main(argv)
    finally:
        capture.undo()
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "report": report}

"""The end-to-end tests' shared run of ``cwtrain demo`` (one per session: it takes a while)."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One short run through ``cwtrain demo --json --json-file``: exit code, JSON stdout, stderr, report, JSON file."""
    from cwtrain.cli import main

    where = tmp_path_factory.mktemp("demo")
    report, figures = where / "report.html", where / "figures" / "run.json"
    capture = pytest.MonkeyPatch()
    out, err = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", out)
    capture.setattr(sys, "stderr", err)
    try:
        argv = ["demo", "--steps", "3", "--full-every", "2", "--no-check", "--replicas", "2", "--report", str(report),
                "--json", "--json-file", str(figures)]  # fmt: skip
        code = main(argv)
    finally:
        capture.undo()
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "report": report, "json_file": figures}

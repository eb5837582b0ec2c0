"""The fault suite: shared local stack, and a record of which fault rows held."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_RESULTS: Counter[tuple[str, str]] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    row = getattr(report, "fault_row", None)
    if row and (report.when == "call" or report.outcome != "passed"):
        _RESULTS[(row, report.outcome)] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    marker = item.get_closest_marker("fault_row")
    if marker is not None:
        outcome.get_result().fault_row = marker.args[0]


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("CWTRAIN_FAULT_RESULTS")
    if target and _RESULTS:
        rows: dict[str, dict[str, int]] = {}
        for (row, outcome), count in _RESULTS.items():
            rows.setdefault(row, {})[outcome] = count
        Path(target).write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")

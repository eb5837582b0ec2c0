"""docs/reliability.md lists every fault row with the suite's current test count.

The counts come from the items of this session (selected plus deselected), so a full run
costs nothing extra; a run that collected only part of the suite (some row has no test in
the session) counts by collecting the suite in a subprocess instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _fault_rows import ROWS

pytestmark = [pytest.mark.faults]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
LINE = re.compile(r"^\|(?P<fault>.*)\(`(?P<row>[a-z0-9-]+)`\)\s*\|(?P<how>.*?)\|\s*(?P<count>\d+)\s*\|(?P<rest>.*)\|$")


def _deselected(config: pytest.Config) -> list[pytest.Item]:
    """The items ``-m``/``-k`` left out (kept by tests/conftest.py under its ``DESELECTED`` key)."""
    for plugin in config.pluginmanager.get_plugins():
        key = getattr(plugin, "DESELECTED", None)
        if isinstance(key, pytest.StashKey):
            return list(config.stash.get(key, []))
    return []


def _session_counts(session: pytest.Session) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in [*session.items, *_deselected(session.config)]:
        marker = item.get_closest_marker("fault_row")
        if marker is not None and item.get_closest_marker("faults") is not None:
            counts[marker.args[0]] = counts.get(marker.args[0], 0) + 1
    return counts


def _suite_counts(session: pytest.Session) -> dict[str, int]:
    counts = _session_counts(session)
    if all(counts.get(row) for row in ROWS):
        return counts
    script = ROOT / "scripts" / "reliability_table.py"
    done = subprocess.run(
        [sys.executable, str(script), "--counts"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_every_test_names_a_known_row(request: pytest.FixtureRequest) -> None:
    assert set(_session_counts(request.session)) <= set(ROWS)


def test_doc_lists_every_row_with_its_current_count(request: pytest.FixtureRequest) -> None:
    assert DOC.is_file(), "docs/reliability.md is missing: run scripts/reliability_table.py"
    table = {}
    for line in DOC.read_text().splitlines():
        match = LINE.match(line)
        if match:
            table[match["row"]] = (int(match["count"]), match["rest"])
    assert list(table) == list(ROWS), "the doc's rows differ from tests/faults/_fault_rows.py"
    counts = _suite_counts(request.session)
    stale = {row: (table[row][0], counts.get(row, 0)) for row in ROWS if table[row][0] != counts.get(row, 0)}
    assert not stale, f"(doc, suite) test counts differ: {stale}; regenerate with scripts/reliability_table.py"
    for row, (count, rest) in table.items():
        assert count > 0, f"row {row} has no test"
        assert ROWS[row][2].split(";")[0][:30] in rest.replace("\\|", "|"), f"row {row}: 'what must hold' differs"

"""The demo report page without a browser: the lag it plots, and what the file holds."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from cwtrain.local.demo.page import identity_lag, render_report, write_report


def _step(k: int, identity: str, served: list[str], kind: str = "INCREMENTAL") -> dict[str, Any]:
    return {
        "step": k,
        "identity": identity,
        "snapshot_type": kind,
        "mean_reward": None if k == 0 else 0.25 * k,
        "snapshot_bytes": 0 if kind == "SKIPPED" else 100 * (k + 1),
        "publish_seconds": 0.01 * k,
        "hot_load_seconds": 0.02 * k,
        "served_identities": served,
    }


STEPS = [
    _step(0, "run-v000000", [], "FULL"),
    _step(1, "run-v000001", ["run-v000000"]),
    _step(2, "run-v000001", ["run-v000001"], "SKIPPED"),  # nothing changed: still v1
    _step(3, "run-v000003", ["run-v000001"]),  # sampled from v1, the newest: lag 0
    _step(4, "run-v000004", ["run-v000003", "run-v000001"]),  # one sample two versions behind
]


def test_identity_lag_counts_versions_behind_the_newest_published() -> None:
    assert identity_lag(STEPS) == [None, 0, 0, 0, 2]
    assert identity_lag([_step(0, "a", []), _step(1, "b", ["initial"])]) == [None, None]


def test_the_page_carries_the_run_and_fetches_nothing(tmp_path: Path) -> None:
    steps = [*STEPS[:4], _step(4, "run-v000004", ["</script><b>x"])]
    summary = {"config": {"steps": 4, "seed": 3, "replicas": 2}, "deployment_id": "d<1>", "steps": steps}
    path = write_report(summary, tmp_path / "sub" / "report.html")
    page = path.read_text(encoding="utf-8")
    assert page == render_report(summary)
    assert not re.search(r"<(link|img|iframe)\b|\b(src|href)\s*=|@import|url\(", page, re.I)
    assert "deployment d&lt;1&gt;" in page and "<title>cwtrain demo: 4 steps, seed 3</title>" in page
    payload = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert payload is not None  # the served identity's "</script>" did not end the block
    data = json.loads(payload[1])
    assert [s["lag"] for s in data["steps"]] == [None, 0, 0, 0, None]
    assert data["steps"][4]["served"] == ["</script><b>x"]
    assert [s["type"] for s in data["steps"]] == ["FULL", "INCREMENTAL", "SKIPPED", "INCREMENTAL", "INCREMENTAL"]
    for plot in ("reward", "latency", "bytes", "time", "replay"):
        assert f'<figure id="{plot}">' in page
    assert '<figure id="lag">' not in page  # always 0 in the demo: a figure of the time plot's caption now


def test_the_page_states_the_task_pass_rule_and_settings() -> None:
    """Issue 27: the report says what the demo trains and when it passes (a configuration table)."""
    from cwtrain.local.demo.report import PASS_RULE, TASK

    config = {"steps": 4, "seed": 3, "replicas": 2, "full_every": 10, "group_size": 8, "lr": 0.003, "check": True}
    page = render_report({"config": config, "steps": STEPS})
    table = re.search(r'<table id="config">(.*?)</table>', page, re.S)
    assert table is not None
    rows = re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table[1])
    assert [k for k, _ in rows] == ["task", "pass rule", "configuration"]
    assert rows[0][1] == html.escape(TASK) and rows[1][1] == html.escape(PASS_RULE)
    assert rows[2][1] == "steps 4, seed 3, replicas 2, FULL every 10, group size 8, learning rate 0.003"
    data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)[1])
    assert data["task"] == TASK and data["pass_rule"] == PASS_RULE
    assert "grid-template-columns: repeat(auto-fit" in page and "640px" not in page  # no fixed-width grid


def test_the_page_carries_each_fulls_reason_and_the_replay_per_version() -> None:
    """Issue 25: the report marks why each FULL was cut and plots what a cold replica replays."""
    steps = [
        {**STEPS[0], "cut_reason": "first", "replay_bytes": 100},
        {**STEPS[1], "replay_bytes": 300},
        {**STEPS[2], "replay_bytes": 300},  # skipped: the served chain is unchanged
        {**STEPS[3], "snapshot_type": "FULL", "cut_reason": "replay", "replay_bytes": 400},
    ]
    page = render_report({"config": {"steps": 3, "full_every": "auto"}, "steps": steps, "replay_budget_bytes": 300})
    data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)[1])
    assert [(s["type"], s["reason"], s["replay"]) for s in data["steps"]] == [
        ("FULL", "first", 100), ("INCREMENTAL", "none", 300), ("SKIPPED", "none", 300), ("FULL", "replay", 400),
    ]  # fmt: skip
    assert data["replay_budget"] == 300 and "FULL every auto" in page
    assert 'class: "reason"' in page and "largest cold-start replay" in page  # drawn by the page's script
    old = render_report({"config": {"steps": 1}, "steps": [STEPS[0]]})  # a summary from before issue 25
    old_data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', old, re.S)[1])
    assert old_data["steps"][0]["reason"] == "none" and old_data["replay_budget"] is None


def test_every_full_reason_the_cadence_gives_has_a_line_and_the_page_shows_the_runs_own() -> None:
    """Issue 33: each FULL reason is explained on the page; the lines cover every reason core can give."""
    from cwtrain.hotload import CutReason
    from cwtrain.local.demo.page import STEP_COLUMNS, full_reasons

    summary: dict[str, Any] = {"config": {"full_every": "auto"}, "full_share": 0.8, "replay_budget": 1.5}
    lines = full_reasons(summary)
    assert set(lines) == {r.label for r in CutReason} - {"none"}
    assert "80%" in lines["share"] and "1.5 FULLs" in lines["replay"] and "19 deltas" in lines["count"]
    steps = [
        {**STEPS[0], "cut_reason": "first"},
        {**STEPS[1], "snapshot_type": "FULL", "cut_reason": "replay", "rollout_retries": 2},
        {**STEPS[3], "snapshot_type": "FULL", "cut_reason": "replay"},
    ]
    page = render_report({**summary, "steps": steps})
    key = re.search(r'<ul class="reasons" id="full-reasons">(.*?)</ul>', page, re.S)
    assert key is not None
    assert re.findall(r'<li data-reason="(\w+)"><b>\w+</b>: (.*?)</li>', key[1]) == [
        ("first", html.escape(lines["first"])), ("replay", html.escape(lines["replay"])),
    ]  # fmt: skip
    # the table: one row per step; canary gaps and log-probs absent, so those columns are left out and named once
    table = re.search(r'<details id="steps">(.*?)</details>', page, re.S)
    assert table is not None
    columns = re.findall(r'<th data-column="(\w+)"', table[1])
    assert columns == [k for k, _, _ in STEP_COLUMNS if k not in ("canary", "logprob")]
    assert re.findall(r'<tr data-step="(\d+)">', table[1]) == ["0", "1", "3"]
    assert "None in this run: canary gaps (canary off), rollout log-probs.</p>" in table[1]
    assert render_report({"steps": [STEPS[1]]}).count("No FULL snapshot in this run.") == 1

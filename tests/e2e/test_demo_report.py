"""``cwtrain demo --report``: the page opens in headless Chromium and shows five plots of the run.

The run is :mod:`test_demo`'s ``cli_run`` (3 steps, FULL every 2, two replicas). Chromium
(Debian's ``chromium`` package; CI installs it) loads the file with no network, once to
dump the DOM after the page's script ran and once for a screenshot. The DOM must hold the
configuration table (task, pass rule, settings) and the five plots with the run's own
figures as text (each FULL bar labelled with its reason, the replay bytes per version); the screenshot must show ink, and each series' colour, inside every
plot's rectangle. In a narrow window the grid is one column and every plot fits it.
``CWTRAIN_REPORT_SCREENSHOT=path`` keeps a copy of the screenshot.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
from decimal import ROUND_HALF_UP, Decimal
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _png import read_png

from cwtrain.local.demo.page import identity_lag

pytestmark = pytest.mark.e2e

WINDOW = (1360, 1400)
NARROW = (560, 2400)
SERIES_COLORS = {
    "reward": ["#1f77b4"],
    "latency": ["#ff7f0e", "#2ca02c"],
    "bytes": ["#d62728", "#9467bd"],
    "time": ["#17becf", "#e377c2", "#ff7f0e", "#2ca02c"],
    "fleet": ["#bcbd22"],
    "replay": ["#8c564b"],
}


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("needs Debian's chromium package (apt-get install -y chromium; .ci/run installs it)")
    return found


def _chromium(
    profile: Path, *args: str, url: str, window: tuple[int, int] = WINDOW
) -> subprocess.CompletedProcess[str]:
    command = [
        _browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing resolves: the page must need no network
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={window[0]},{window[1]}",
        *args,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


class _Page(HTMLParser):
    """The drawn page: each plot's data-rect, its text and its marks."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, Any]] = {}
        self.body: dict[str, str | None] = {}
        self.config: list[str] = []
        self._plot: str | None = None
        self._text = False
        self._config = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "table" and a.get("id") == "config":
            self._config = True
        if tag == "svg" and a.get("data-plot"):
            self._plot = str(a["data-plot"])
            self.plots[self._plot] = {"rect": a.get("data-rect"), "texts": [], "marks": []}
        elif self._plot is not None and a.get("data-step") is not None:
            self.plots[self._plot]["marks"].append((tag, a.get("data-series"), int(str(a["data-step"]))))
        self._text = tag == "text"

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._plot = None
        if tag == "table":
            self._config = False
        self._text = False

    def handle_data(self, data: str) -> None:
        if self._text and self._plot is not None:
            self.plots[self._plot]["texts"].append(data)
        if self._config and data.strip():
            self.config.append(data.strip())


def _fixed(value: float, digits: int) -> str:
    """``Number.prototype.toFixed``: the exact binary value, ties away from zero."""
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _ms(seconds: float) -> str:
    return f"{_fixed(seconds * 1000, 0)} ms"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{_fixed(n, 0)} B" if unit == "B" else f"{_fixed(n, 1)} {unit}"
        n /= 1024
    return f"{_fixed(n, 1)} TiB"


def _expected_captions(summary: dict[str, Any]) -> dict[str, str]:
    steps = summary["steps"]
    published = [s for s in steps if s["snapshot_type"] != "SKIPPED"]
    lags = [lag for lag in identity_lag(steps) if lag is not None]
    sampled = steps[1:]
    return {
        "reward": f"mean reward: first {_fixed(summary['first_reward'], 3)}, "
        f"final {_fixed(summary['final_reward'], 3)}",
        "latency": f"median publish {_ms(summary['median_publish_seconds'])}, "
        f"median hot-load {_ms(summary['median_hot_load_seconds'])}, "
        f"max hot-load {_ms(max(s['hot_load_seconds'] for s in published))}",
        "bytes": f"FULL: {summary['full_snapshots']}, median {_size(summary['median_full_bytes'])}; "
        f"delta: {summary['delta_snapshots']}, median {_size(summary['median_delta_bytes'])}",
        "time": f"median rollout {_ms(statistics.median(r['rollout_seconds'] for r in sampled))}, "
        f"train {_ms(statistics.median(r['train_seconds'] for r in sampled))}; "
        f"{lags.count(0)}/{len(lags)} steps on the newest weights",
        "fleet": f"canary gap after each hot-load: max "
        f"{_fixed(max(s['canary_gap'] for s in published), 4)} nats (bound 0.05); served-version spread: "
        f"{sum(1 for lag in lags if lag > 0)} of {len(lags)} steps sampled older weights",
        "replay": f"largest cold-start replay {_size(summary['max_replay_bytes'])} at step {summary['max_replay_step']}"
        + (f"; budget {_size(summary['replay_budget_bytes'])}" if summary.get("replay_budget_bytes") else ""),
    }


def test_report_is_one_self_contained_file(cli_run: dict[str, Any]) -> None:
    page = cli_run["report"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\b(src|href)\s*=|@import|url\(", page, re.I)
    data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)[1])
    summary = json.loads(cli_run["out"])
    assert [s["reward"] for s in data["steps"]] == [s["mean_reward"] for s in summary["steps"]]
    assert [s["bytes"] for s in data["steps"]] == [s["snapshot_bytes"] for s in summary["steps"]]


def test_report_opens_in_headless_chromium_with_five_plots_of_the_run(cli_run: dict[str, Any], tmp_path: Path) -> None:
    summary = json.loads(cli_run["out"])
    url = cli_run["report"].resolve().as_uri()
    dom = _chromium(tmp_path / "profile-dom", "--dump-dom", url=url).stdout
    page = _Page()
    page.feed(dom)
    assert page.body.get("data-drawn") == "6", "the page's script did not finish"
    assert list(page.plots) == ["reward", "latency", "bytes", "time", "fleet", "replay"]
    # the configuration rows: what was trained, when it passes, with which settings
    assert page.config[:2] == ["task", summary["task"]] and page.config[2:4] == ["pass rule", summary["pass_rule"]]
    assert page.config[4] == "configuration" and page.config[5].startswith("steps 3, seed 0, replicas 2, FULL every 2")

    # the run's own figures, as text in each plot
    for plot, caption in _expected_captions(summary).items():
        assert caption in page.plots[plot]["texts"], (plot, page.plots[plot]["texts"][:3])
    final = _fixed(summary["final_reward"], 3)
    assert page.plots["reward"]["texts"].count(final) == 1  # the last point's label
    # one mark per step and series
    steps = summary["steps"]
    published = [s["step"] for s in steps if s["snapshot_type"] != "SKIPPED"]
    marks = {name: plot["marks"] for name, plot in page.plots.items()}
    assert [m[2] for m in marks["reward"]] == [s["step"] for s in steps if s["mean_reward"] is not None]
    assert sorted(m[2] for m in marks["latency"]) == sorted(published * 2)
    assert [(m[1], m[2]) for m in marks["bytes"]] == [
        (s["snapshot_type"], s["step"]) for s in steps if s["snapshot_type"] != "SKIPPED"
    ]
    # time per step: one stacked segment per stage that took time (step 0 only publishes)
    stages = ("rollout_seconds", "train_seconds", "publish_seconds", "hot_load_seconds")
    expected = [(key.removesuffix("_seconds"), s["step"]) for s in steps for key in stages if s[key] > 0]
    assert [(m[1], m[2]) for m in marks["time"]] == expected
    assert {m[1] for m in marks["time"] if m[2] == 0} == {"publish", "hot_load"}
    # fleet truth: the canary after every hot-load (issue 24), no step sampled older weights
    assert [(m[1], m[2]) for m in marks["fleet"]] == [("canary", s) for s in published]
    assert all(s["canary_gap"] is not None and s["canary_gap"] < 0.05 for s in steps)
    # each FULL bar names why the chain was cut; one replay bar per version
    fulls = [s["cut_reason"] for s in steps if s["snapshot_type"] == "FULL"]
    assert fulls == ["first", "count"] and [t for t in page.plots["bytes"]["texts"] if t in fulls] == fulls
    assert [(m[1], m[2]) for m in marks["replay"]] == [("replay", s["step"]) for s in steps]

    # the screenshot: ink and each series' colour inside every plot
    shot = tmp_path / "report.png"
    _chromium(tmp_path / "profile-shot", f"--screenshot={shot}", url=url)
    keep = os.environ.get("CWTRAIN_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
    pixels = read_png(shot)[:, :, :3].astype(np.int16)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    rects = {name: [int(v) for v in str(plot["rect"]).split(",")] for name, plot in page.plots.items()}
    assert rects["reward"][1] == rects["latency"][1] < rects["bytes"][1] == rects["time"][1] < rects["fleet"][1]
    assert rects["fleet"][1] == rects["replay"][1]
    for name, plot in page.plots.items():
        x, y, w, h = (int(v) for v in str(plot["rect"]).split(","))
        assert w >= 600 and h >= 300 and x + w <= WINDOW[0] and y + h <= WINDOW[1], (name, plot["rect"])
        region = pixels[y + 2 : y + h - 2, x + 2 : x + w - 2]
        background = np.array([0xFB, 0xFC, 0xFE])
        ink = np.any(np.abs(region - background) > 24, axis=2).mean()
        assert 0.01 < ink < 0.6, (name, ink)
        for color in SERIES_COLORS[name]:
            rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
            hits = int(np.all(np.abs(region - rgb) <= 12, axis=2).sum())
            assert hits >= 20, (name, color, hits)


def test_report_grid_is_one_column_in_a_narrow_window(cli_run: dict[str, Any], tmp_path: Path) -> None:
    """The grid used to be two fixed 640 px columns; in a 560 px window each plot now fits the window."""
    url = cli_run["report"].resolve().as_uri()
    page = _Page()
    page.feed(_chromium(tmp_path / "profile-narrow", "--dump-dom", url=url, window=NARROW).stdout)
    assert page.body.get("data-drawn") == "6"
    rects = [tuple(int(v) for v in str(plot["rect"]).split(",")) for plot in page.plots.values()]
    for x, _, w, h in rects:
        assert x >= 0 and x + w <= NARROW[0] and w >= NARROW[0] * 0.8, rects
        assert abs(h / w - 340 / 640) < 0.02, rects  # scaled, not cropped
    tops = [y for _, y, _, _ in rects]
    assert tops == sorted(tops) and len(set(tops)) == len(rects)  # one column: one plot under the other

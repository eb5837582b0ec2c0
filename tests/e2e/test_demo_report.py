"""``cwtrain demo --report``: the page opens in headless Chromium and shows six plots of the run.

The run is the e2e conftest's ``cli_run`` (3 steps, FULL every 2, two replicas). Chromium
(Debian's ``chromium`` package; CI installs it) loads the file with no network, to dump the
DOM after the page's script ran and for a screenshot. The DOM must hold the configuration
table (task, pass rule, settings) and the six plots with the run's own figures as text
(each FULL bar labelled with its reason, the replay bytes per version); every legend names
what its plot drew and nothing else; each FULL reason of the run is explained in one line;
a collapsed table holds one row per step. The screenshot must show ink, and each series'
colour, inside every plot's rectangle. At 1280 and 1920 px nothing is clipped: a script the
test adds to a copy of the page measures every element against the window and every SVG
text against its plot (and against the other texts). In a narrow window the grid is one
column and every plot fits it. ``CWTRAIN_REPORT_SCREENSHOT=path`` keeps a copy of the
screenshot.
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

from cwtrain.local.demo.page import full_reasons, identity_lag

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
    """The drawn page: each plot's data-rect, texts, caption, marks, series and legend; the reasons; the step table."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, Any]] = {}
        self.body: dict[str, str | None] = {}
        self.config: list[str] = []
        self.reasons: dict[str, str] = {}
        self.details: dict[str, str | None] | None = None
        self.columns: list[str] = []
        self.rows: list[list[tuple[str, str | None]]] = []
        self._plot: str | None = None
        self._text: str | None = None  # the class of the SVG text being read ("" for none)
        self._legend: str | None = None
        self._config = False
        self._reason: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "table" and a.get("id") == "config":
            self._config = True
        if tag == "details" and a.get("id") == "steps":
            self.details = a
        if tag == "li" and a.get("data-reason"):
            self._reason = str(a["data-reason"])
            self.reasons[self._reason] = ""
        if tag == "th" and a.get("data-column"):
            self.columns.append(str(a["data-column"]))
        if tag == "tr" and a.get("data-step") is not None and self._plot is None:
            self.rows.append([])
        if tag == "td" and self.rows:
            self.rows[-1].append(("", a.get("title")))
            self._cell = []
        if tag == "svg" and a.get("data-plot"):
            self._plot = str(a["data-plot"])
            self.plots[self._plot] = {
                "rect": a.get("data-rect"), "texts": [], "caption": [], "marks": [], "series": set(), "legend": {}
            }  # fmt: skip
        elif self._plot is not None:
            plot = self.plots[self._plot]
            if a.get("data-step") is not None:
                plot["marks"].append((tag, a.get("data-series"), int(str(a["data-step"]))))
            if a.get("data-series") is not None:
                plot["series"].add(a["data-series"])
            if tag == "g" and a.get("data-legend"):
                self._legend = str(a["data-legend"])
                plot["legend"][self._legend] = ""
        self._text = (a.get("class") or "") if tag == "text" else None

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._plot = None
        if tag == "table":
            self._config = False
        if tag == "g":
            self._legend = None
        if tag == "li":
            self._reason = None
        if tag == "td" and self._cell is not None:
            self.rows[-1][-1] = ("".join(self._cell), self.rows[-1][-1][1])
            self._cell = None
        self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None and self._plot is not None:
            plot = self.plots[self._plot]
            plot["texts"].append(data)
            if self._text == "caption":
                plot["caption"].append(data)
            if self._legend is not None:
                plot["legend"][self._legend] += data
        if self._config and data.strip():
            self.config.append(data.strip())
        if self._reason is not None:
            self.reasons[self._reason] += data
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def drawn(cli_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> _Page:
    """The report's DOM once its script ran (one Chromium run for the tests that only read it)."""
    url = cli_run["report"].resolve().as_uri()
    page = _Page()
    page.feed(_chromium(tmp_path_factory.mktemp("profile-dom"), "--dump-dom", url=url).stdout)
    assert page.body.get("data-drawn") == "6", "the page's script did not finish"
    return page


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
    behind = sum(1 for lag in lags if lag > 0)
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
        "fleet": f"canary gap after each hot-load: max {_fixed(max(s['canary_gap'] for s in published), 4)} nats "
        "(bound 0.05); "
        + (f"{behind} of {len(lags)} steps sampled older weights" if behind else "no step sampled older weights"),
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


def test_report_opens_in_headless_chromium_with_six_plots_of_the_run(
    cli_run: dict[str, Any], drawn: _Page, tmp_path: Path
) -> None:
    summary = json.loads(cli_run["out"])
    url = cli_run["report"].resolve().as_uri()
    page = drawn
    assert list(page.plots) == ["reward", "latency", "bytes", "time", "fleet", "replay"]
    # the configuration rows: what was trained, when it passes, with which settings
    assert page.config[:2] == ["task", summary["task"]] and page.config[2:4] == ["pass rule", summary["pass_rule"]]
    assert page.config[4] == "configuration" and page.config[5].startswith("steps 3, seed 0, replicas 2, FULL every 2")

    # the run's own figures, as text in each plot
    for plot, caption in _expected_captions(summary).items():  # wrapped to the plot's width: lines joined by spaces
        assert " ".join(page.plots[plot]["caption"]) == caption, (plot, page.plots[plot]["caption"])
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


#: What each plot of this run draws (``data-series``), and so what its legend names: no more, no less.
DRAWN = {
    "reward": {"reward"},
    "latency": {"publish", "hot_load"},
    "bytes": {"FULL", "INCREMENTAL"},
    "time": {"rollout", "train", "publish", "hot_load"},
    "fleet": {"canary", "bound"},  # no step sampled older weights: no "lag" mark, so no "lag" in the legend
    "replay": {"replay"},  # FULL every 2: no auto budget line
}


def test_report_legends_name_every_drawn_series_and_nothing_else(cli_run: dict[str, Any], drawn: _Page) -> None:
    summary = json.loads(cli_run["out"])
    assert all(lag in (None, 0) for lag in identity_lag(summary["steps"]))  # the run this table describes
    for name, plot in drawn.plots.items():
        assert plot["series"] == DRAWN[name], (name, plot["series"])
        assert set(plot["legend"]) == plot["series"], (name, plot["legend"])
        assert all(label.strip() for label in plot["legend"].values()), (name, plot["legend"])
    assert drawn.plots["fleet"]["legend"]["bound"] == "bound 0.05 nats"  # the dashed line is named
    # the series that carries nothing is said once in plain words, not announced in the legend
    caption = " ".join(drawn.plots["fleet"]["caption"])
    assert caption.endswith("; no step sampled older weights") and "older" not in "".join(
        drawn.plots["fleet"]["legend"].values()
    )


def test_report_explains_each_full_reason_in_one_line(cli_run: dict[str, Any], drawn: _Page) -> None:
    summary = json.loads(cli_run["out"])
    lines = full_reasons(summary)
    present = [s["cut_reason"] for s in summary["steps"] if s["snapshot_type"] == "FULL"]
    assert present == ["first", "count"]
    assert drawn.reasons == {r: f"{r}: {lines[r]}" for r in present}
    assert lines["count"] == "--full-every 2: the version's number is a multiple of 2"
    assert all("\n" not in text for text in drawn.reasons.values())
    snapshot = drawn.columns.index("snapshot")  # the table's FULL cells carry the same line as their tooltip
    fulls = [row[snapshot] for row in drawn.rows if row[snapshot][0].startswith("FULL")]
    assert fulls == [(f"FULL ({r})", lines[r]) for r in present]


def test_report_has_a_collapsed_table_with_one_row_per_step(cli_run: dict[str, Any], drawn: _Page) -> None:
    summary = json.loads(cli_run["out"])
    steps = summary["steps"]
    assert drawn.details is not None and "open" not in drawn.details
    assert drawn.columns[:6] == ["step", "reward", "identity", "snapshot", "bytes", "tensors"]
    assert "canary" in drawn.columns and "retries" not in drawn.columns  # no retry in this run: said under the table
    assert len(drawn.rows) == len(steps) and all(len(row) == len(drawn.columns) for row in drawn.rows)
    cell = {key: i for i, key in enumerate(drawn.columns)}
    for row, s in zip(drawn.rows, steps, strict=True):
        text = [t for t, _ in row]
        assert text[cell["step"]] == str(s["step"])
        reward = s["mean_reward"]
        assert text[cell["reward"]] == ("—" if reward is None else f"{reward:.3f}")
        assert text[cell["identity"]] == s["identity"]
        assert text[cell["bytes"]] == f"{s['snapshot_bytes']:,}" and text[cell["replay"]] == f"{s['replay_bytes']:,}"
        assert text[cell["publish"]] == f"{s['publish_seconds'] * 1000:.1f}"
        assert text[cell["hot_load"]] == f"{s['hot_load_seconds'] * 1000:.1f}"
        assert text[cell["canary"]] == f"{s['canary_gap']:.4f}"
        assert text[cell["replicas"]] == str(s["replicas_serving"]) == "2"
        assert text[cell["sampled"]] == ("—" if s["step"] == 0 else "the newest")


#: Added to a copy of the page after its own script: what is clipped, and whether the table was collapsed.
_MEASURE = r"""
(() => {
  const problems = [], details = document.getElementById("steps");
  const collapsed = details !== null && !details.open;
  if (details) details.open = true;  // the table too must fit once opened
  const view = document.documentElement.clientWidth;
  const name = e => `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}: ${(e.textContent || "").trim().slice(0, 50)}`;
  if (document.documentElement.scrollWidth > view) problems.push("the page scrolls sideways");
  for (const e of document.body.querySelectorAll("*")) {
    if (e.closest("svg") && e.tagName.toLowerCase() !== "svg") continue;
    const r = e.getBoundingClientRect();
    if (r.width && r.right > view + 0.5) problems.push("past the window: " + name(e));
    if (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== "visible")
      problems.push("scrolls inside: " + name(e));
  }
  for (const svg of document.querySelectorAll("svg[data-plot]")) {
    const box = svg.getBoundingClientRect(), plot = svg.getAttribute("data-plot");
    const texts = [...svg.querySelectorAll("text")].map(t => [t.textContent, t.getBoundingClientRect()]);
    for (const [text, r] of texts)
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
        problems.push(`clipped in ${plot}: ${text}`);
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const [a, ra] = texts[i], [b, rb] = texts[j];
      const dx = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
      const dy = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
      if (dx > 1 && dy > 1) problems.push(`overlap in ${plot}: ${a} / ${b}`);
    }
  }
  const rows = details ? details.querySelectorAll("tbody tr").length : -1;
  document.body.setAttribute("data-measured", JSON.stringify({problems, collapsed, rows}));
})();
"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_report_clips_nothing_at_common_widths(cli_run: dict[str, Any], tmp_path: Path, width: int) -> None:
    """Issue 33: the fleet plot's caption ran past its plot; now every text fits its plot, every box the window."""
    copy = tmp_path / "measured.html"
    page = cli_run["report"].read_text(encoding="utf-8")
    copy.write_text(page.replace("</body>", f"<script>{_MEASURE}</script>\n</body>"), encoding="utf-8")
    dom = _chromium(tmp_path / "profile", "--dump-dom", url=copy.resolve().as_uri(), window=(width, 1400)).stdout
    body = _Page()
    body.feed(dom)
    assert body.body.get("data-drawn") == "6" and body.body.get("data-measured"), "a script did not finish"
    measured = json.loads(str(body.body["data-measured"]))
    assert measured["problems"] == [], measured["problems"][:10]
    assert measured["collapsed"] is True and measured["rows"] == len(json.loads(cli_run["out"])["steps"])

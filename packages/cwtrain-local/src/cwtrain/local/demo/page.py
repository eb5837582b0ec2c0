"""``cwtrain demo --report PATH``: the run as one self-contained HTML page with six plots.

::

    summary = run_demo(config)                 # what `cwtrain demo` prints as JSON
    write_report(summary, "demo-report.html")  # open it in any browser, offline

Under the title, a configuration table (``<table id="config">``) says what the run
trained (the task), when it passes (the pass rule; :data:`~cwtrain.local.demo.report.TASK`,
:data:`~cwtrain.local.demo.report.PASS_RULE`) and with which settings. The page holds the
run's figures as JSON in a ``<script type="application/json">`` block and an inline script
that draws six SVG plots from them when the page opens, in a grid of as many columns of at
least 480 px as the window holds (two on a laptop, one on a phone; each plot scales to its
column):

1. **reward**: the mean reward of each step's rollouts (0 to 1);
2. **latency**: per published step, the publish time (encode + upload + create the
   hot-load) and the hot-load time (until every replica serves the identity), in ms;
3. **snapshot bytes**: the bytes stored per published step, FULL and delta in two colours;
   each FULL bar is labelled with why the chain was cut there (``first``, ``count``,
   ``share``, ``replay``, ``failed``, ...: :class:`~cwtrain.hotload.CutReason`);
4. **time per step**: where each step's wall time went, stacked: sampling the rollouts,
   the training step, the publish and the hot-load. Its caption also says on how many steps
   every rollout came from the newest weights (:func:`identity_lag` 0);
5. **fleet truth**: the canary's gap after each hot-load (the deployment's and the trainer's
   log-probs of a fixed probe) against its bound (dashed), and a mark on each step that
   sampled older weights than the newest published (the caption says "no step sampled older
   weights" when none did);
6. **cold-start replay**: per version, the bytes a replica starting cold would read to serve
   it (the chain's FULL and every delta since, ``hotload/replay_bytes``); with
   ``--full-every auto`` a dashed line marks the budget (the FULL and two FULLs of deltas).

The fourth plot used to be the served identity lag per step; the demo waits for every
hot-load before sampling, so that lag is 0 on every step of every run and drew a flat
line: it is a figure of the caption now.

Each plot has a caption with its figures (first and final reward, median and maximum
latencies, median sizes, median time per stage, the largest replay and where), wrapped to
the plot's width, and a legend that names every series, bound and marker it drew, in the
shape it is drawn with, and nothing it did not draw: a series with no mark on the plot is
not announced. Under the snapshot-bytes plot, one line explains each FULL reason the run
has (:func:`full_reasons` has a line for every reason the cadence can give). Under the
plots, ``<details id="steps">`` (collapsed; ``#steps`` at the end of the address opens it)
holds a table with one row per step (:data:`STEP_COLUMNS`); a column no step has a value
for is left out and named once under the table. Nothing is fetched: no stylesheet,
script, font or image comes from anywhere else, so the file opens without a network. Once
drawn, each plot's ``<svg>`` carries ``data-rect="x,y,width,height"`` (its place on the
page, in CSS pixels), which the tests use to look at each plot in a screenshot.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cwtrain.local.demo.report import PASS_RULE, TASK

__all__ = ["PLOTS", "STEP_COLUMNS", "full_reasons", "identity_lag", "render_report", "write_report"]

#: The plots, in page order: id and title.
PLOTS = (
    ("reward", "Reward per step"),
    ("latency", "Publish and hot-load latency per step"),
    ("bytes", "Snapshot bytes per step (FULL vs delta)"),
    ("time", "Time per step, by stage"),
    ("fleet", "Fleet truth: the canary after each hot-load, samples from older weights"),
    ("replay", "Cold-start replay bytes per version"),
)
#: The settings the configuration table shows, in order, and their labels.
_SETTINGS = (
    ("steps", "steps"),
    ("seed", "seed"),
    ("replicas", "replicas"),
    ("full_every", "FULL every"),
    ("group_size", "group size"),
    ("prompts_per_step", "prompts per step"),
    ("max_tokens", "max tokens"),
    ("lr", "learning rate"),
    ("temperature", "temperature"),
    ("ahead", "one step ahead"),
    ("slow_hot_load", "hot-loads slowed by (s)"),
)

#: The per-step table's columns, in order: key, heading and what the column holds (the heading's tooltip).
STEP_COLUMNS = (
    ("step", "step", "the training step; step 0 publishes the starting weights"),
    ("reward", "mean reward", "the mean reward of the step's rollouts (0 to 1)"),
    ("identity", "identity published", "the identity the step published, or the one still served when it skipped"),
    ("snapshot", "snapshot", "FULL (with why the chain was cut), delta, or skipped when no weight changed"),
    ("bytes", "stored bytes", "the bytes the step's snapshot stored in the bucket"),
    ("tensors", "tensors changed", "tensors whose bytes differ from what the replicas served"),
    ("publish", "publish ms", "encode, upload and create the hot-load"),
    ("hot_load", "hot-load ms", "until every replica serves the identity"),
    (
        "trainer_wait",
        "loop waited ms",
        "how long the training loop was blocked by this version: all of its publish, or one step ahead the wait "
        "for it at the next step",
    ),
    ("rollout", "rollout ms", "sampling the step's rollouts from the deployment"),
    ("train", "train ms", "the GRPO update"),
    ("replicas", "replicas serving", "replicas verified on the identity after the hot-load"),
    ("canary", "canary gap (nats)", "the deployment's and the trainer's log-probs of a fixed probe after the hot-load"),
    ("logprob", "log-prob gap (nats)", "mean |rollout log-prob - trainer log-prob| over the step's sampled tokens"),
    (
        "replay",
        "cold-start replay bytes",
        "what a replica starting cold at this version reads: the FULL and deltas since",
    ),
    ("sampled", "rollouts sampled from", "how far the identities that served the rollouts lag the newest published"),
    ("retries", "rollout retries", "rollout requests retried"),
)
#: Columns left out when no step has a value for them, and how the note under the table names them.
_OPTIONAL = {"canary": "canary gaps (canary off)", "logprob": "rollout log-probs", "retries": "rollout retries"}

_VERSION = re.compile(r"-v(\d+)$")


def full_reasons(summary: Mapping[str, Any]) -> dict[str, str]:
    """One line per reason a FULL snapshot can have (:class:`cwtrain.hotload.CutReason`'s labels but ``none``).

    The page shows the line of each reason its run has, under the snapshot-bytes plot; the
    numbers come from the run (``--full-every``, the cadence's ``full_share`` and
    ``replay_budget``), with the cadence's defaults for a summary that lacks them.
    """
    config = summary.get("config") or {}
    every = config.get("full_every", "auto")
    share = summary.get("full_share", 0.9)
    budget = summary.get("replay_budget", 2.0)
    if isinstance(every, int) and not isinstance(every, bool) and every > 0:
        count = (
            "--full-every 1: every version is FULL"
            if every == 1
            else f"--full-every {every}: the version's number is a multiple of {every}"
        )
    else:
        count = "the chain already held 19 deltas after its FULL, the most auto lets it hold (as --full-every 20)"
    return {
        "first": "the run's first version: nothing of it is served yet, so there is nothing to send a delta against",
        "requested": "the publisher asked for a FULL snapshot (slime's full mode)",
        "failed": "the publish before failed and the replicas kept what they served, so the next version is FULL",
        "count": count,
        "chain_limit": "one more delta would pass the 63 deltas a replica starting cold may replay",
        "share": f"auto: the delta would have been at least {share:.0%} of a FULL snapshot's bytes; a FULL costs "
        "about the same upload, spares every replica the apply and starts a new chain",
        "replay": f"auto: with this delta, a replica starting cold would read more than the chain's FULL and "
        f"{budget:g} FULLs' worth of deltas (the dashed budget of the cold-start replay plot), so a new chain starts",
    }


def _version(identity: str) -> int | None:
    match = _VERSION.search(identity)
    return int(match.group(1)) if match else None


def identity_lag(steps: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Per step: versions between the newest published identity and the oldest that served its rollouts.

    Step ``k``'s rollouts run after step ``k - 1`` published (or skipped) its weights, so
    the newest identity is step ``k - 1``'s ``identity``; the lag is its version number
    minus that of the oldest identity in ``served_identities``. ``None`` for step 0 (no
    rollouts) and where an identity carries no ``-v<N>`` version.
    """
    lags: list[int | None] = [None] * len(steps)
    for k in range(1, len(steps)):
        newest = _version(str(steps[k - 1].get("identity", "")))
        served = [_version(str(s)) for s in steps[k].get("served_identities") or ()]
        if newest is None or not served or any(v is None for v in served):
            continue
        lags[k] = newest - min(v for v in served if v is not None)
    return lags


def _page_data(summary: Mapping[str, Any]) -> dict[str, Any]:
    steps = list(summary.get("steps") or [])
    lags = identity_lag(steps)
    config = summary.get("config") or {}
    return {
        "title": f"cwtrain demo: {config.get('steps', len(steps) - 1)} steps, seed {config.get('seed', 0)}",
        "config": {k: config[k] for k, _ in _SETTINGS if k in config},
        "task": summary.get("task") or TASK,
        "pass_rule": summary.get("pass_rule") or PASS_RULE,
        "deployment_id": summary.get("deployment_id", ""),
        "final_identity": summary.get("final_identity", ""),
        "total_seconds": summary.get("total_seconds"),
        "reward_goal_met": bool(summary.get("reward_goal_met")),
        "replay_budget": summary.get("replay_budget_bytes"),
        "steps": [
            {
                "step": r.get("step", i),
                "identity": r.get("identity", ""),
                "type": r.get("snapshot_type", ""),
                "reward": r.get("mean_reward"),
                "bytes": r.get("snapshot_bytes", 0),
                "publish": r.get("publish_seconds", 0.0),
                "hot_load": r.get("hot_load_seconds", 0.0),
                "rollout": r.get("rollout_seconds", 0.0),
                "train": r.get("train_seconds", 0.0),
                "served": list(r.get("served_identities") or []),
                "lag": lags[i],
                "canary": r.get("canary_gap"),
                "reason": r.get("cut_reason", "none"),
                "replay": r.get("replay_bytes", 0),
            }
            for i, r in enumerate(steps)
        ],
    }


def _reasons_html(summary: Mapping[str, Any]) -> str:
    """The key under the snapshot-bytes plot: one line per FULL reason of the run, in order of first use."""
    lines = full_reasons(summary)
    seen: list[str] = []
    for r in summary.get("steps") or []:
        reason = str(r.get("cut_reason", "none"))
        if r.get("snapshot_type") == "FULL" and reason not in seen:
            seen.append(reason)
    if not seen:
        return '<p class="reasons">No FULL snapshot in this run.</p>'
    items = "\n".join(
        f'<li data-reason="{html.escape(reason)}"><b>{html.escape(reason)}</b>: '
        f"{html.escape(lines.get(reason, 'a reason this page does not know (see cwtrain.hotload.CutReason)'))}</li>"
        for reason in seen
    )
    return f'<ul class="reasons" id="full-reasons">\n{items}\n</ul>'


def _cell(key: str, r: Mapping[str, Any], lag: int | None, reasons: Mapping[str, str]) -> tuple[str, str]:
    """One cell of the per-step table: its text and its ``title`` (empty for none)."""

    def ms(value: Any) -> str:
        return f"{float(value) * 1000:.1f}"

    def nats(value: Any) -> str:
        return "—" if value is None else f"{float(value):.4f}"

    kind = r.get("snapshot_type", "")
    if key == "step":
        return str(r.get("step", "")), ""
    if key == "reward":
        reward = r.get("mean_reward")
        return ("—" if reward is None else f"{float(reward):.3f}"), ""
    if key == "identity":
        return str(r.get("identity", "")), ""
    if key == "snapshot":
        if kind == "FULL":
            reason = str(r.get("cut_reason", "none"))
            return f"FULL ({reason})", reasons.get(reason, "")
        return {"INCREMENTAL": "delta", "SKIPPED": "skipped: unchanged"}.get(kind, str(kind)), ""
    if key in ("bytes", "replay"):
        return f"{int(r.get('snapshot_bytes' if key == 'bytes' else 'replay_bytes', 0)):,}", ""
    if key == "tensors":
        return str(r.get("tensors_changed", "—")), ""
    if key in ("publish", "hot_load", "trainer_wait", "rollout", "train"):
        if key in ("rollout", "train") and r.get("step") == 0:
            return "—", "step 0 publishes the starting weights: no rollouts, no training"
        return ms(r.get(f"{key}_seconds", 0.0)), ""
    if key == "replicas":
        return str(r.get("replicas_serving", "—")), ""
    if key == "canary":
        return nats(r.get("canary_gap")), ""
    if key == "logprob":
        return nats(r.get("logprob_gap")), ""
    if key == "sampled":
        served = ", ".join(str(i) for i in r.get("served_identities") or ())
        if lag is None:
            return (served or "—"), ""
        return ("the newest" if lag == 0 else f"{lag} version{'s' if lag > 1 else ''} behind"), served
    if key == "retries":
        return str(r.get("rollout_retries", 0)), ""
    raise KeyError(key)


def _steps_html(summary: Mapping[str, Any]) -> str:
    """The per-step table, collapsed: one row per step with the numbers the plots draw."""
    steps = list(summary.get("steps") or [])
    lags = identity_lag(steps)
    reasons = full_reasons(summary)
    empty = {
        "canary": all(r.get("canary_gap") is None for r in steps),
        "logprob": all(r.get("logprob_gap") is None for r in steps),
        "retries": not any(r.get("rollout_retries") for r in steps),
    }
    columns = [(key, name, about) for key, name, about in STEP_COLUMNS if not empty.get(key, False)]
    head = "".join(
        f'<th data-column="{key}" title="{html.escape(about)}">{html.escape(name)}</th>' for key, name, about in columns
    )
    rows = []
    for r, lag in zip(steps, lags, strict=True):
        cells = []
        for key, _, _ in columns:
            text, title = _cell(key, r, lag, reasons)
            attr = f' title="{html.escape(title)}"' if title else ""
            cells.append(f"<td{attr}>{html.escape(text)}</td>")
        rows.append(f'<tr data-step="{html.escape(str(r.get("step", "")))}">{"".join(cells)}</tr>')
    left_out = [_OPTIONAL[key] for key, is_empty in empty.items() if is_empty]
    note = f'<p class="note">None in this run: {html.escape(", ".join(left_out))}.</p>\n' if left_out else ""
    body = "\n".join(rows)
    return (
        f'<details id="steps"><summary>Every step in numbers ({len(steps)} rows; step 0 publishes the '
        "starting weights)</summary>\n"
        f'<div class="scroll"><table id="step-table">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n'
        f"</tbody></table></div>\n{note}</details>"
    )


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #1d2330; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.meta { margin: 0 0 12px; color: #4a5263; }
table#config { border-collapse: collapse; margin: 0 0 12px; max-width: 1320px; }
table#config th { text-align: left; padding: 2px 12px 2px 0; vertical-align: top; white-space: nowrap; color: #4a5263; }
table#config td { padding: 2px 0; }
main { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 480px), 1fr)); gap: 16px 24px;
       max-width: 1320px; }
figure { margin: 0; min-width: 0; }
figcaption { font-weight: 600; margin-bottom: 2px; }
svg { display: block; width: 100%; height: auto; box-sizing: border-box; background: #fbfcfe;
      border: 1px solid #d8dde8; }
svg text { font: 12px system-ui, sans-serif; fill: #1d2330; }
svg text.caption { font-size: 13px; font-weight: 600; }
svg .grid { stroke: #e3e7ef; }
svg .axis { stroke: #7a8396; }
svg text.reason { font-size: 11px; fill: #8a1c1c; }
svg .budget { stroke: #7f7f7f; stroke-width: 2; stroke-dasharray: 6 4; }
svg .bound { stroke: #bcbd22; stroke-width: 1.5; stroke-dasharray: 4 3; }
ul.reasons { margin: 6px 0 0; padding-left: 18px; font-size: 13px; color: #4a5263; }
ul.reasons b { color: #8a1c1c; font-weight: 600; }
p.reasons, p.note { margin: 6px 0 0; font-size: 13px; color: #4a5263; }
details#steps { margin: 20px 0 0; max-width: 1320px; }
details#steps summary { font-weight: 600; cursor: pointer; }
div.scroll { overflow-x: auto; }
table#step-table { border-collapse: collapse; margin-top: 8px; font-size: 12px; font-variant-numeric: tabular-nums; }
table#step-table th { text-align: right; vertical-align: bottom; padding: 2px 6px; color: #4a5263;
                      border-bottom: 1px solid #d8dde8; }
table#step-table td { text-align: right; padding: 1px 6px; white-space: nowrap; }
table#step-table tbody tr:nth-child(even) { background: #f3f5f9; }
"""

_SCRIPT = r"""
"use strict";
const data = JSON.parse(document.getElementById("run-data").textContent);
const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 340, M = {left: 80, right: 16, bottom: 40};
const LINE = 16;  // the distance between two header lines (caption lines, the legend), in viewBox units
const COLORS = {reward: "#1f77b4", publish: "#ff7f0e", hot_load: "#2ca02c",
                FULL: "#d62728", INCREMENTAL: "#9467bd", rollout: "#17becf", train: "#e377c2", canary: "#bcbd22",
                replay: "#8c564b", budget: "#7f7f7f", lag: "#d62728"};

function el(parent, name, attrs, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  parent.appendChild(node);
  return node;
}
function titled(node, text) {
  node.appendChild(document.createElementNS(NS, "title")).textContent = text;
  return node;
}
function median(xs) {
  const s = [...xs].sort((a, b) => a - b), n = s.length;
  if (!n) return null;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? Math.round(n) + " B" : n.toFixed(1) + " " + units[i];
}
function fmtMs(seconds) { return seconds === null ? "—" : Math.round(seconds * 1000) + " ms"; }
function niceMax(v) {  // the top of an axis with four round steps: 301 -> 400 (ticks 0, 100, ... 400)
  if (!(v > 0)) return 4;
  const step = v / 4, p = Math.pow(10, Math.floor(Math.log10(step))), m = step / p;
  return 4 * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10) * p;
}
function niceBytes(v) {  // the same in binary units: 400 KiB, not 390.6 KiB
  let unit = 1;
  while (v >= 1024 * unit && unit < Math.pow(1024, 4)) unit *= 1024;
  return niceMax(v / unit) * unit;
}
function tickBytes(v) { return fmtBytes(v).replace(".0 ", " "); }

// Text is measured in a hidden plot of the same viewBox, so a width is in the plots' own units.
const ruler = el(document.body, "svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H,
                                        style: "position:absolute; left:-9999px; visibility:hidden"});
function textWidth(text, cls) {
  const node = el(ruler, "text", cls ? {class: cls} : {}, text);
  const width = node.getComputedTextLength();
  node.remove();
  return width;
}
// A caption as the lines that fit `width`: whole clauses (split after "; ") where they fit, else words.
function wrap(text, width) {
  const fits = s => textWidth(s, "caption") <= width;
  const lines = [];
  let current = "";
  for (const clause of text.split(/(?<=;) /)) {
    const joined = current ? current + " " + clause : clause;
    if (fits(joined)) { current = joined; continue; }
    if (current) { lines.push(current); current = ""; }
    for (const word of clause.split(" ")) {
      const longer = current ? current + " " + word : word;
      if (!current || fits(longer)) current = longer;
      else { lines.push(current); current = word; }
    }
  }
  if (current) lines.push(current);
  return lines;
}
// A legend swatch in the shape the series is drawn with: a bar, a line with its points, a dashed line, a dot.
function swatch(svg, x, y, entry) {
  if (entry.mark === "line") {
    el(svg, "line", {x1: x, x2: x + 18, y1: y, y2: y, stroke: entry.color, "stroke-width": 2.5});
    el(svg, "circle", {cx: x + 9, cy: y, r: 3, fill: entry.color});
    return 18;
  }
  if (entry.mark === "dash") {
    el(svg, "line", {x1: x, x2: x + 22, y1: y, y2: y, class: entry.dashClass});
    return 22;
  }
  if (entry.mark === "dot") { el(svg, "circle", {cx: x + 5, cy: y, r: 5, fill: entry.color}); return 10; }
  el(svg, "rect", {x: x, y: y - 5, width: 10, height: 10, fill: entry.color});
  return 10;
}

// One plot: caption, axes, ticks, the marks `draw(svg, x, y, bar)` adds, then the legend of what it drew.
function plot(id, spec, captionLines) {
  const figure = document.getElementById(id);
  const svg = document.createElementNS(NS, "svg");
  for (const [k, v] of Object.entries({viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "xMidYMid meet",
                                       "data-plot": id})) svg.setAttribute(k, v);
  figure.insertBefore(svg, figure.querySelector("figcaption").nextSibling);
  const lines = wrap(spec.caption, W - M.left - M.right);
  lines.forEach((text, i) => el(svg, "text", {x: M.left, y: 20 + LINE * i, class: "caption"}, text));
  const legendY = 20 + LINE * captionLines;  // every plot of the page keeps the same header height
  const top = legendY + 14;
  const steps = data.steps.length ? data.steps[data.steps.length - 1].step : 1;
  const bar = Math.max(3, (W - M.left - M.right) / (steps + 1) * 0.6), pad = bar / 2 + 4;
  const x = s => M.left + pad + (W - M.left - M.right - 2 * pad) * (steps ? s / steps : 0.5);
  const y = v => H - M.bottom - (H - top - M.bottom) * (v - spec.ymin) / (spec.ymax - spec.ymin);
  for (let i = 0; i <= 4; i++) {
    const v = spec.ymin + (spec.ymax - spec.ymin) * i / 4;
    el(svg, "line", {x1: M.left, x2: W - M.right, y1: y(v), y2: y(v), class: "grid"});
    el(svg, "text", {x: M.left - 6, y: y(v) + 4, "text-anchor": "end"}, spec.tick(v));
  }
  const every = Math.max(1, Math.ceil(steps / 10));
  for (let s = 0; s <= steps; s += every) {
    el(svg, "text", {x: x(s), y: H - M.bottom + 16, "text-anchor": "middle"}, String(s));
  }
  el(svg, "line", {x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom, class: "axis"});
  el(svg, "line", {x1: M.left, x2: M.left, y1: top, y2: H - M.bottom, class: "axis"});
  el(svg, "text", {x: (M.left + W - M.right) / 2, y: H - 6, "text-anchor": "middle"}, "step");
  el(svg, "text", {x: 14, y: (top + H - M.bottom) / 2, "text-anchor": "middle",
                   transform: `rotate(-90 14 ${(top + H - M.bottom) / 2})`}, spec.unit);
  spec.draw(svg, x, y, bar, top);
  // the legend names what was drawn, and only that: a series with no mark on the plot is not announced
  const drawn = spec.legend.filter(e => svg.querySelector(`[data-series="${e.series}"]`));
  let lx = W - M.right;
  for (const entry of [...drawn].reverse()) {
    const g = el(svg, "g", {"data-legend": entry.series});
    el(g, "text", {x: lx, y: legendY + 4, "text-anchor": "end"}, entry.name);
    lx -= textWidth(entry.name) + 5;
    const size = entry.mark === "line" ? 18 : entry.mark === "dash" ? 22 : 10;
    swatch(g, lx - size, legendY, entry);
    lx -= size + 14;
  }
  return svg;
}
function line(svg, points, color, name) {
  if (!points.length) return;
  el(svg, "polyline", {points: points.map(([px, py]) => `${px},${py}`).join(" "),
                       fill: "none", stroke: color, "stroke-width": 2.5, "data-series": name});
  for (const [px, py, step, label] of points) {
    titled(el(svg, "circle", {cx: px, cy: py, r: 3.5, fill: color, "data-series": name, "data-step": step}), label);
  }
}

const steps = data.steps;
const published = steps.filter(s => s.type !== "SKIPPED");
const specs = [];

// 1. reward per step
const rewards = steps.filter(s => s.reward !== null);
specs.push(["reward", {
  caption: rewards.length
    ? `mean reward: first ${rewards[0].reward.toFixed(3)}, final ${rewards[rewards.length - 1].reward.toFixed(3)}`
    : "mean reward: no rollouts",
  unit: "mean reward", ymin: 0, ymax: 1, tick: v => v.toFixed(2),
  legend: [{series: "reward", name: "mean reward", mark: "line", color: COLORS.reward}],
  draw(svg, x, y, bar, top) {
    line(svg, rewards.map(s => [x(s.step), y(s.reward), s.step, `step ${s.step}: ${s.reward.toFixed(3)}`]),
         COLORS.reward, "reward");
    const last = rewards[rewards.length - 1];
    if (last) {  // above the last point, or under it where the point is at the top of the plot
      const above = y(last.reward) - 8;
      el(svg, "text", {x: x(last.step) - 6, y: above - 12 < top ? y(last.reward) + 18 : above, "text-anchor": "end"},
         last.reward.toFixed(3));
    }
  },
}]);

// 2. publish and hot-load latency per published step
const latencyMax = Math.max(0, ...published.map(s => Math.max(s.publish, s.hot_load))) * 1000;
specs.push(["latency", {
  caption: `median publish ${fmtMs(median(published.map(s => s.publish)))}, ` +
           `median hot-load ${fmtMs(median(published.map(s => s.hot_load)))}, ` +
           `max hot-load ${fmtMs(published.length ? Math.max(...published.map(s => s.hot_load)) : null)}`,
  unit: "ms", ymin: 0, ymax: niceMax(latencyMax), tick: v => String(+v.toFixed(1)),
  legend: [{series: "publish", name: "publish", mark: "line", color: COLORS.publish},
           {series: "hot_load", name: "hot-load", mark: "line", color: COLORS.hot_load}],
  draw(svg, x, y) {
    line(svg, published.map(s => [x(s.step), y(s.publish * 1000), s.step, `step ${s.step}: publish ${fmtMs(s.publish)}`]),
         COLORS.publish, "publish");
    line(svg, published.map(s => [x(s.step), y(s.hot_load * 1000), s.step, `step ${s.step}: hot-load ${fmtMs(s.hot_load)}`]),
         COLORS.hot_load, "hot_load");
  },
}]);

// 3. snapshot bytes per published step, FULL vs delta; each FULL bar says why the chain was cut
const fulls = published.filter(s => s.type === "FULL"), deltas = published.filter(s => s.type === "INCREMENTAL");
const byteMax = niceBytes(1.12 * Math.max(0, ...published.map(s => s.bytes)));  // room for the reasons above the bars
specs.push(["bytes", {
  caption: `FULL: ${fulls.length}, median ${fulls.length ? fmtBytes(median(fulls.map(s => s.bytes))) : "—"}; ` +
           `delta: ${deltas.length}, median ${deltas.length ? fmtBytes(median(deltas.map(s => s.bytes))) : "—"}`,
  unit: "bytes stored", ymin: 0, ymax: byteMax, tick: tickBytes,
  legend: [{series: "FULL", name: "FULL (why, above the bar)", mark: "bar", color: COLORS.FULL},
           {series: "INCREMENTAL", name: "delta", mark: "bar", color: COLORS.INCREMENTAL}],
  draw(svg, x, y, bar) {
    let lastRight = -Infinity;
    for (const s of published) {
      const why = s.type === "FULL" ? ` (${s.reason})` : "";
      titled(el(svg, "rect", {x: x(s.step) - bar / 2, y: y(s.bytes), width: bar, height: y(0) - y(s.bytes),
                              fill: COLORS[s.type] || "#888", "data-series": s.type, "data-step": s.step}),
             `step ${s.step}: ${s.type}${why} ${fmtBytes(s.bytes)}`);
      if (s.type !== "FULL") continue;
      // the reason over its bar, kept inside the plot; one that would cover its neighbour's is left to the table
      const width = textWidth(s.reason, "reason");
      const cx = Math.min(Math.max(x(s.step), M.left + width / 2 + 2), W - M.right - width / 2);
      if (cx - width / 2 < lastRight + 4) continue;
      const under = published.filter(o => Math.abs(x(o.step) - cx) <= width / 2 + bar / 2);  // the bars it spans
      el(svg, "text", {x: cx, y: y(Math.max(s.bytes, ...under.map(o => o.bytes))) - 4, "text-anchor": "middle",
                       class: "reason", "data-reason": s.reason}, s.reason);
      lastRight = cx + width / 2;
    }
  },
}]);

// 4. time per step, by stage (stacked): rollouts, training, publish, hot-load
const STAGES = [["rollout", "rollout"], ["train", "train"], ["publish", "publish"], ["hot_load", "hot-load"]];
const totals = steps.map(s => STAGES.reduce((sum, [key]) => sum + (s[key] || 0), 0));
const lagged = steps.filter(s => s.lag !== null);
const newest = lagged.filter(s => s.lag === 0).length;
const sampled = steps.filter(s => s.step > 0);
specs.push(["time", {
  caption: `median rollout ${fmtMs(median(sampled.map(s => s.rollout)))}, ` +
           `train ${fmtMs(median(sampled.map(s => s.train)))}; ` +
           `${newest}/${lagged.length} steps on the newest weights`,
  unit: "ms", ymin: 0, ymax: niceMax(Math.max(0, ...totals) * 1000), tick: v => String(+v.toFixed(1)),
  legend: STAGES.map(([key, name]) => ({series: key, name, mark: "bar", color: COLORS[key]})),
  draw(svg, x, y, bar) {
    for (const s of steps) {
      let below = 0;
      for (const [key, name] of STAGES) {
        const ms = (s[key] || 0) * 1000;
        if (!(ms > 0)) continue;
        const top = y(below + ms), bottom = y(below);
        titled(el(svg, "rect", {x: x(s.step) - bar / 2, y: top, width: bar, height: Math.max(bottom - top, 0.5),
                                fill: COLORS[key], "data-series": key, "data-step": s.step}),
               `step ${s.step}: ${name} ${fmtMs(ms / 1000)}`);
        below += ms;
      }
    }
  },
}]);

// 5. fleet truth: the canary's gap after each hot-load against its bound, and steps sampled from older weights
const BOUND = 0.05;
const checked = steps.filter(s => s.canary !== null && s.canary !== undefined);
const behind = lagged.filter(s => s.lag > 0);
const gapMax = Math.max(0, ...checked.map(s => s.canary));
const spread = behind.length ? `${behind.length} of ${lagged.length} steps sampled older weights`
                             : "no step sampled older weights";
specs.push(["fleet", {
  caption: (checked.length ? `canary gap after each hot-load: max ${gapMax.toFixed(4)} nats (bound ${BOUND})`
                           : "canary off") + `; ${spread}`,
  unit: "nats", ymin: 0, ymax: niceMax(Math.max(gapMax, BOUND)), tick: v => v.toFixed(3),
  legend: [{series: "canary", name: "canary gap", mark: "line", color: COLORS.canary},
           {series: "bound", name: `bound ${BOUND} nats`, mark: "dash", dashClass: "bound"},
           {series: "lag", name: "sampled older weights", mark: "dot", color: COLORS.lag}],
  draw(svg, x, y) {
    if (checked.length)  // the bound only where there are gaps to hold against it
      el(svg, "line", {x1: x(0), x2: x(steps.length ? steps[steps.length - 1].step : 1), y1: y(BOUND), y2: y(BOUND),
                       class: "bound", "data-series": "bound"});
    line(svg, checked.map(s => [x(s.step), y(s.canary), s.step, `step ${s.step}: canary gap ${s.canary.toFixed(4)}`]),
         COLORS.canary, "canary");
    for (const s of behind) {
      titled(el(svg, "circle", {cx: x(s.step), cy: y(0), r: 5, fill: COLORS.lag, "data-series": "lag",
                                "data-step": s.step}), `step ${s.step}: sampled ${s.lag} version(s) behind`);
    }
  },
}]);

// 6. what a replica starting cold would read at each version: the chain's FULL and every delta since
const worst = steps.reduce((a, s) => (a === null || s.replay > a.replay ? s : a), null);
const budget = data.replay_budget;
specs.push(["replay", {
  caption: worst ? `largest cold-start replay ${fmtBytes(worst.replay)} at step ${worst.step}` +
                   (budget ? `; budget ${fmtBytes(budget)}` : "")
                 : "no versions",
  unit: "bytes replayed", ymin: 0, ymax: niceBytes(Math.max(0, budget || 0, ...steps.map(s => s.replay))),
  tick: tickBytes,
  legend: [{series: "replay", name: "replay", mark: "bar", color: COLORS.replay},
           {series: "budget", name: "budget", mark: "dash", dashClass: "budget"}],
  draw(svg, x, y, bar) {
    for (const s of steps) {
      titled(el(svg, "rect", {x: x(s.step) - bar / 2, y: y(s.replay), width: bar,
                              height: Math.max(y(0) - y(s.replay), 0.5), fill: COLORS.replay, "data-series": "replay",
                              "data-step": s.step}),
             `step ${s.step}: a cold replica reads ${fmtBytes(s.replay)}` + (s.type === "FULL" ? ` (FULL: ${s.reason})` : ""));
    }
    if (budget) el(svg, "line", {x1: M.left, x2: W - M.right, y1: y(budget), y2: y(budget), class: "budget",
                                 "data-series": "budget"});
  },
}]);

const captionLines = Math.max(1, ...specs.map(([, spec]) => wrap(spec.caption, W - M.left - M.right).length));
for (const [id, spec] of specs) plot(id, spec, captionLines);
ruler.remove();
if (location.hash === "#steps") document.getElementById("steps").open = true;

for (const svg of document.querySelectorAll("svg[data-plot]")) {
  const r = svg.getBoundingClientRect();
  svg.setAttribute("data-rect", [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height]
    .map(v => Math.round(v)).join(","));
}
document.body.setAttribute("data-drawn", String(document.querySelectorAll("svg[data-plot]").length));
"""


def render_report(summary: Mapping[str, Any]) -> str:
    """The report page of a run (``summary`` as :func:`cwtrain.local.demo.run.run_demo` returns it)."""
    data = _page_data(summary)
    payload = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    seconds = data["total_seconds"]
    meta = (
        f"deployment {data['deployment_id']} · final identity {data['final_identity']} · "
        + (f"{seconds:.1f} s · " if isinstance(seconds, (int, float)) else "")
        + ("reward goal met" if data["reward_goal_met"] else "reward goal NOT met")
    )
    labels = dict(_SETTINGS)
    settings = ", ".join(f"{labels[k]} {v}" for k, v in data["config"].items())
    rows = (("task", data["task"]), ("pass rule", data["pass_rule"]), ("configuration", settings))
    config = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    figures = "\n".join(
        f'<figure id="{key}"><figcaption>{html.escape(title)}</figcaption>'
        + (_reasons_html(summary) if key == "bytes" else "")
        + "</figure>"
        for key, title in PLOTS
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>{html.escape(data['title'])}</title>\n"
        f"<style>{_STYLE}</style></head>\n"
        f"<body>\n<h1>{html.escape(data['title'])}</h1>\n"
        f'<p class="meta">{html.escape(meta)}</p>\n'
        f'<table id="config">\n{config}\n</table>\n'
        f"<main>\n{figures}\n</main>\n"
        f"{_steps_html(summary)}\n"
        f'<script type="application/json" id="run-data">{payload}</script>\n'
        f"<script>{_SCRIPT}</script>\n"
        "</body></html>\n"
    )


def write_report(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write :func:`render_report` of ``summary`` to ``path`` (parents created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_report(summary), encoding="utf-8")
    return target

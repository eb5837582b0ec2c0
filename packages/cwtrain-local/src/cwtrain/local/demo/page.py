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
   log-probs of a fixed probe, bound dashed), and a mark on each step that sampled older
   weights than the newest published;
6. **cold-start replay**: per version, the bytes a replica starting cold would read to serve
   it (the chain's FULL and every delta since, ``hotload/replay_bytes``); with
   ``--full-every auto`` a dashed line marks the budget (the FULL and two FULLs of deltas).

The fourth plot used to be the served identity lag per step; the demo waits for every
hot-load before sampling, so that lag is 0 on every step of every run and drew a flat
line: it is a figure of the caption now.

Each plot has a caption with its figures (first and final reward, median and maximum
latencies, median sizes, median time per stage, the largest replay and where). Nothing is fetched: no stylesheet,
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

__all__ = ["PLOTS", "identity_lag", "render_report", "write_report"]

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
)

_VERSION = re.compile(r"-v(\d+)$")


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
"""

_SCRIPT = r"""
"use strict";
const data = JSON.parse(document.getElementById("run-data").textContent);
const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 340, M = {left: 80, right: 16, top: 48, bottom: 40};
const COLORS = {reward: "#1f77b4", publish: "#ff7f0e", hot_load: "#2ca02c",
                FULL: "#d62728", INCREMENTAL: "#9467bd", rollout: "#17becf", train: "#e377c2", canary: "#bcbd22",
                replay: "#8c564b", budget: "#7f7f7f"};

function el(parent, name, attrs, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  parent.appendChild(node);
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

// One plot: axes, ticks, then marks drawn by `draw(svg, x, y)`.
function plot(id, spec) {
  const svg = el(document.getElementById(id), "svg",
                 {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "xMidYMid meet", "data-plot": id});
  const steps = data.steps.length ? data.steps[data.steps.length - 1].step : 1;
  const bar = Math.max(3, (W - M.left - M.right) / (steps + 1) * 0.6), pad = bar / 2 + 4;
  const x = s => M.left + pad + (W - M.left - M.right - 2 * pad) * (steps ? s / steps : 0.5);
  const y = v => H - M.bottom - (H - M.top - M.bottom) * (v - spec.ymin) / (spec.ymax - spec.ymin);
  el(svg, "text", {x: M.left, y: 20, class: "caption"}, spec.caption);
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
  el(svg, "line", {x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom, class: "axis"});
  el(svg, "text", {x: (M.left + W - M.right) / 2, y: H - 6, "text-anchor": "middle"}, "step");
  el(svg, "text", {x: 14, y: (M.top + H - M.bottom) / 2, "text-anchor": "middle",
                   transform: `rotate(-90 14 ${(M.top + H - M.bottom) / 2})`}, spec.unit);
  spec.draw(svg, x, y, bar);
  let lx = W - M.right - 6;
  for (const [name, color] of [...spec.legend].reverse()) {
    el(svg, "text", {x: lx, y: 38, "text-anchor": "end"}, name);
    lx -= name.length * 6.5 + 6;
    el(svg, "rect", {x: lx - 10, y: 29, width: 10, height: 10, fill: color});
    lx -= 22;
  }
  return svg;
}
function line(svg, points, color, name) {
  if (!points.length) return;
  el(svg, "polyline", {points: points.map(([px, py]) => `${px},${py}`).join(" "),
                       fill: "none", stroke: color, "stroke-width": 2.5});
  for (const [px, py, step, label] of points) {
    el(svg, "circle", {cx: px, cy: py, r: 3.5, fill: color, "data-series": name, "data-step": step},
       undefined).appendChild(document.createElementNS(NS, "title")).textContent = label;
  }
}

const steps = data.steps;
const published = steps.filter(s => s.type !== "SKIPPED");

// 1. reward per step
const rewards = steps.filter(s => s.reward !== null);
plot("reward", {
  caption: rewards.length
    ? `mean reward: first ${rewards[0].reward.toFixed(3)}, final ${rewards[rewards.length - 1].reward.toFixed(3)}`
    : "mean reward: no rollouts",
  unit: "mean reward", ymin: 0, ymax: 1, tick: v => v.toFixed(2), legend: [["reward", COLORS.reward]],
  draw(svg, x, y) {
    line(svg, rewards.map(s => [x(s.step), y(s.reward), s.step, `step ${s.step}: ${s.reward.toFixed(3)}`]),
         COLORS.reward, "reward");
    const last = rewards[rewards.length - 1];
    if (last) el(svg, "text", {x: x(last.step) - 6, y: y(last.reward) - 8, "text-anchor": "end"},
                 last.reward.toFixed(3));
  },
});

// 2. publish and hot-load latency per published step
const latencyMax = Math.max(0, ...published.map(s => Math.max(s.publish, s.hot_load))) * 1000;
plot("latency", {
  caption: `median publish ${fmtMs(median(published.map(s => s.publish)))}, ` +
           `median hot-load ${fmtMs(median(published.map(s => s.hot_load)))}, ` +
           `max hot-load ${fmtMs(published.length ? Math.max(...published.map(s => s.hot_load)) : null)}`,
  unit: "ms", ymin: 0, ymax: niceMax(latencyMax), tick: v => String(+v.toFixed(1)),
  legend: [["publish", COLORS.publish], ["hot-load", COLORS.hot_load]],
  draw(svg, x, y) {
    line(svg, published.map(s => [x(s.step), y(s.publish * 1000), s.step, `step ${s.step}: publish ${fmtMs(s.publish)}`]),
         COLORS.publish, "publish");
    line(svg, published.map(s => [x(s.step), y(s.hot_load * 1000), s.step, `step ${s.step}: hot-load ${fmtMs(s.hot_load)}`]),
         COLORS.hot_load, "hot_load");
  },
});

// 3. snapshot bytes per published step, FULL vs delta
const fulls = published.filter(s => s.type === "FULL"), deltas = published.filter(s => s.type === "INCREMENTAL");
const byteMax = niceBytes(Math.max(0, ...published.map(s => s.bytes)));
plot("bytes", {
  caption: `FULL: ${fulls.length}, median ${fulls.length ? fmtBytes(median(fulls.map(s => s.bytes))) : "—"}; ` +
           `delta: ${deltas.length}, median ${deltas.length ? fmtBytes(median(deltas.map(s => s.bytes))) : "—"}`,
  unit: "bytes stored", ymin: 0, ymax: byteMax, tick: tickBytes,
  legend: [["FULL", COLORS.FULL], ["delta", COLORS.INCREMENTAL]],
  draw(svg, x, y, bar) {
    for (const s of published) {
      const why = s.type === "FULL" ? ` (${s.reason})` : "";
      el(svg, "rect", {x: x(s.step) - bar / 2, y: y(s.bytes), width: bar, height: y(0) - y(s.bytes),
                       fill: COLORS[s.type] || "#888", "data-series": s.type, "data-step": s.step})
        .appendChild(document.createElementNS(NS, "title")).textContent = `step ${s.step}: ${s.type}${why} ${fmtBytes(s.bytes)}`;
      if (s.type === "FULL")  // why the chain was cut here
        el(svg, "text", {x: x(s.step), y: y(s.bytes) - 4, "text-anchor": "middle", class: "reason",
                         "data-reason": s.reason}, s.reason);
    }
  },
});

// 4. time per step, by stage (stacked): rollouts, training, publish, hot-load
const STAGES = [["rollout", "rollout"], ["train", "train"], ["publish", "publish"], ["hot_load", "hot-load"]];
const totals = steps.map(s => STAGES.reduce((sum, [key]) => sum + (s[key] || 0), 0));
const lagged = steps.filter(s => s.lag !== null);
const newest = lagged.filter(s => s.lag === 0).length;
const sampled = steps.filter(s => s.step > 0);
plot("time", {
  caption: `median rollout ${fmtMs(median(sampled.map(s => s.rollout)))}, ` +
           `train ${fmtMs(median(sampled.map(s => s.train)))}; ` +
           `${newest}/${lagged.length} steps on the newest weights`,
  unit: "ms", ymin: 0, ymax: niceMax(Math.max(0, ...totals) * 1000), tick: v => String(+v.toFixed(1)),
  legend: STAGES.map(([key, name]) => [name, COLORS[key]]),
  draw(svg, x, y, bar) {
    for (const s of steps) {
      let below = 0;
      for (const [key, name] of STAGES) {
        const ms = (s[key] || 0) * 1000;
        if (!(ms > 0)) continue;
        const top = y(below + ms), bottom = y(below);
        el(svg, "rect", {x: x(s.step) - bar / 2, y: top, width: bar, height: Math.max(bottom - top, 0.5),
                         fill: COLORS[key], "data-series": key, "data-step": s.step})
          .appendChild(document.createElementNS(NS, "title")).textContent = `step ${s.step}: ${name} ${fmtMs(ms / 1000)}`;
        below += ms;
      }
    }
  },
});

// 5. fleet truth: the canary's gap after each hot-load, and steps sampled from older weights
const checked = steps.filter(s => s.canary !== null && s.canary !== undefined);
const behind = lagged.filter(s => s.lag > 0);
const gapMax = Math.max(0, ...checked.map(s => s.canary));
plot("fleet", {
  caption: checked.length
    ? `canary gap after each hot-load: max ${gapMax.toFixed(4)} nats (bound 0.05); ` +
      `served-version spread: ${behind.length} of ${lagged.length} steps sampled older weights`
    : `canary off; served-version spread: ${behind.length} of ${lagged.length} steps sampled older weights`,
  unit: "nats", ymin: 0, ymax: niceMax(Math.max(gapMax, 0.05)), tick: v => v.toFixed(3),
  legend: [["canary gap", COLORS.canary], ["older weights", COLORS.FULL]],
  draw(svg, x, y) {
    el(svg, "line", {x1: x(0), x2: x(steps.length ? steps[steps.length - 1].step : 1), y1: y(0.05), y2: y(0.05),
                     stroke: COLORS.canary, "stroke-dasharray": "4 3"});
    line(svg, checked.map(s => [x(s.step), y(s.canary), s.step, `step ${s.step}: canary gap ${s.canary.toFixed(4)}`]),
         COLORS.canary, "canary");
    for (const s of behind) {
      el(svg, "circle", {cx: x(s.step), cy: y(0), r: 5, fill: COLORS.FULL, "data-series": "lag", "data-step": s.step})
        .appendChild(document.createElementNS(NS, "title")).textContent = `step ${s.step}: sampled ${s.lag} version(s) behind`;
    }
  },
});

// 6. what a replica starting cold would read at each version: the chain's FULL and every delta since
const worst = steps.reduce((a, s) => (a === null || s.replay > a.replay ? s : a), null);
const budget = data.replay_budget;
plot("replay", {
  caption: worst ? `largest cold-start replay ${fmtBytes(worst.replay)} at step ${worst.step}` +
                   (budget ? `; budget ${fmtBytes(budget)}` : "")
                 : "no versions",
  unit: "bytes replayed", ymin: 0, ymax: niceBytes(Math.max(0, budget || 0, ...steps.map(s => s.replay))),
  tick: tickBytes,
  legend: budget ? [["replay", COLORS.replay], ["budget", COLORS.budget]] : [["replay", COLORS.replay]],
  draw(svg, x, y, bar) {
    for (const s of steps) {
      el(svg, "rect", {x: x(s.step) - bar / 2, y: y(s.replay), width: bar, height: Math.max(y(0) - y(s.replay), 0.5),
                       fill: COLORS.replay, "data-series": "replay", "data-step": s.step})
        .appendChild(document.createElementNS(NS, "title")).textContent =
          `step ${s.step}: a cold replica reads ${fmtBytes(s.replay)}` + (s.type === "FULL" ? ` (FULL: ${s.reason})` : "");
    }
    if (budget) el(svg, "line", {x1: M.left, x2: W - M.right, y1: y(budget), y2: y(budget), class: "budget"});
  },
});

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
        f'<figure id="{key}"><figcaption>{html.escape(title)}</figcaption></figure>' for key, title in PLOTS
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

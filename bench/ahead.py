"""Synchronous against one step ahead: the demo's GRPO loop with hot-loads as slow as a step (issue 32).

Runs ``cwtrain demo``'s loop (:func:`cwtrain.local.demo.run.run_demo`: the local stack, a
two-replica deployment, rollouts through the sampler, a torch GRPO step, every version
published through core's session) twice in one process with the same seed and settings:
synchronously (each step waits until every replica serves the version it published) and one
step ahead (``--ahead``: the next step trains while the last version hot-loads; rollouts at
most one version behind the trainer's weights). Every hot-load is slowed by ``--slow-hot-load``
seconds on every replica (default 0.3 s: the hot-load then takes most of one of the loop's steps here,
as on a large model whose hot-load takes about a step).

For each mode: the trainer's wait per step (``hotload/trainer_wait_seconds``: seconds the loop
was blocked by publishing and hot-loading; median and 90th percentile), steps per minute of the
loop, the staleness of the samples trained on (versions behind the trainer's weights, worst),
and the first and final mean reward; then the ratios ahead / sync of the same run and the
acceptance of issue 32: ahead's median wait at most 0.2x sync's, its reward meets the demo's
pass rule, and no sample trained on is older than the allowed staleness (1). Exit 0 when all
hold::

    .venv-3.12/bin/python bench/ahead.py                                  # 40 steps each, table
    .venv-3.12/bin/python bench/ahead.py --json > bench/results/ahead.json   # the doc's run
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import statistics
import sys
from typing import Any

from cwtrain.hotload import AHEAD_MAX_STALENESS
from cwtrain.local.demo.run import DemoConfig, run_demo

#: Acceptance: ahead's median trainer wait per step at most this share of sync's (same run).
WAIT_RATIO = 0.2


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def run_mode(config: DemoConfig) -> dict[str, Any]:
    """One demo run (its lines kept, not printed) and the figures this bench reports."""
    lines = io.StringIO()
    summary = run_demo(config, stream=lines)
    steps = summary["steps"][1:]  # the baseline is published before the loop
    waits = [s["trainer_wait_seconds"] for s in steps]
    return {
        "mode": "ahead" if config.ahead else "sync",
        "steps": len(steps),
        "median_trainer_wait_seconds": statistics.median(waits),
        "p90_trainer_wait_seconds": _percentile(waits, 0.9),
        "mean_trainer_wait_seconds": statistics.fmean(waits),
        "median_hot_load_seconds": summary["median_hot_load_seconds"],
        "median_publish_seconds": summary["median_publish_seconds"],
        "median_rollout_seconds": summary["median_rollout_seconds"],
        "median_train_seconds": summary["median_train_seconds"],
        "steps_per_minute": summary["steps_per_minute"],
        "max_sample_staleness": summary["max_sample_staleness"],
        "first_reward": summary["first_reward"],
        "final_reward": summary["final_reward"],
        "reward_goal_met": summary["reward_goal_met"],
        "every_replica_served_every_version": summary["every_replica_served_every_version"],
        "trainer_wait_per_step": waits,
    }


def acceptance(sync: dict[str, Any], ahead: dict[str, Any]) -> dict[str, Any]:
    """Issue 32's rule on one run of both modes."""
    ratio = ahead["median_trainer_wait_seconds"] / max(sync["median_trainer_wait_seconds"], 1e-9)
    staleness = ahead["max_sample_staleness"]
    return {
        "wait_ratio": ratio,
        "wait_ratio_max": WAIT_RATIO,
        "wait_ok": ratio <= WAIT_RATIO,
        "reward_ok": bool(ahead["reward_goal_met"]),
        "staleness_allowed": AHEAD_MAX_STALENESS,
        "staleness_ok": staleness is None or staleness <= AHEAD_MAX_STALENESS,
        "steps_per_minute_ratio": ahead["steps_per_minute"] / max(sync["steps_per_minute"], 1e-9),
    }


def render(doc: dict[str, Any]) -> str:
    """The table of both modes and the acceptance lines."""
    rows = [
        ("trainer wait per step, median", "median_trainer_wait_seconds", "{:.3f} s"),
        ("trainer wait per step, p90", "p90_trainer_wait_seconds", "{:.3f} s"),
        ("hot-load (all replicas), median", "median_hot_load_seconds", "{:.3f} s"),
        ("rollout per step, median", "median_rollout_seconds", "{:.3f} s"),
        ("train per step, median", "median_train_seconds", "{:.3f} s"),
        ("steps per minute", "steps_per_minute", "{:.1f}"),
        ("samples' staleness, worst (versions)", "max_sample_staleness", "{}"),
        ("first mean reward", "first_reward", "{:.3f}"),
        ("final mean reward", "final_reward", "{:.3f}"),
    ]
    sync, ahead, rule = doc["sync"], doc["ahead"], doc["acceptance"]
    width = max(len(label) for label, _, _ in rows)
    out = [f"{'':{width}}  {'sync':>10}  {'ahead':>10}", f"{'-' * width}  {'-' * 10}  {'-' * 10}"]
    for label, key, form in rows:
        out.append(f"{label:{width}}  {form.format(sync[key]):>10}  {form.format(ahead[key]):>10}")
    out.append("")
    out.append(
        f"ahead / sync median wait: {rule['wait_ratio']:.3f} (at most {rule['wait_ratio_max']}): "
        f"{'ok' if rule['wait_ok'] else 'FAILED'}"
    )
    out.append(f"ahead / sync steps per minute: {rule['steps_per_minute_ratio']:.2f}")
    out.append(f"ahead's reward meets the demo's pass rule: {'ok' if rule['reward_ok'] else 'FAILED'}")
    out.append(
        f"no sample trained on more than {rule['staleness_allowed']} version behind: "
        f"{'ok' if rule['staleness_ok'] else 'FAILED'} (worst {ahead['max_sample_staleness']})"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps per mode (default 40, the demo's)")
    parser.add_argument("--seed", type=int, default=0, help="the demo's seed (default 0)")
    parser.add_argument(
        "--slow-hot-load",
        type=float,
        default=0.3,
        metavar="S",
        help="seconds every hot-load lasts more on every replica (default 0.3: a hot-load then takes most of one of "
        "the loop's steps here)",
    )
    parser.add_argument(
        "--prompts-per-step",
        type=int,
        default=8,
        help="GRPO groups per step (default 8: a step of about a second here)",
    )
    parser.add_argument("--no-canary", dest="canary", action="store_false", help="skip the demo's canary")
    parser.add_argument("--json", action="store_true", help="print the whole document as JSON on stdout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    base = DemoConfig(
        steps=args.steps,
        seed=args.seed,
        slow_hot_load=args.slow_hot_load,
        canary=args.canary,
        prompts_per_step=args.prompts_per_step,
    )
    runs = {}
    for ahead in (False, True):
        mode = "ahead" if ahead else "sync"
        print(
            f"bench/ahead.py: {mode}, {args.steps} steps, hot-loads {args.slow_hot_load} s slower ...", file=sys.stderr
        )
        runs[mode] = run_mode(DemoConfig(**{**base.__dict__, "ahead": ahead}))
    doc = {
        "bench": "ahead",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "config": {
            "steps": args.steps,
            "seed": args.seed,
            "slow_hot_load": args.slow_hot_load,
            "prompts_per_step": args.prompts_per_step,
            "canary": args.canary,
        },
        **runs,
    }
    doc["acceptance"] = acceptance(runs["sync"], runs["ahead"])
    print(render(doc), file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
    rule = doc["acceptance"]
    return 0 if rule["wait_ok"] and rule["reward_ok"] and rule["staleness_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

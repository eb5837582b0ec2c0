"""What ``cwtrain demo`` shows: one line per step while it runs, then the summary.

:func:`cwtrain.local.demo.run.run_demo` records one :class:`StepRecord` per step and hands
each to a :class:`LiveDisplay` (stderr); at the end :func:`summarize` turns the records
into the JSON document (``cwtrain demo --json`` prints it on stdout, ``--json-file`` writes
it), and :func:`print_summary` prints its table and verdict on stderr, last::

    display = LiveDisplay(sys.stderr, total=40)
    display.row(record)                               # step   3/40  reward  0.250 █████···  FULL/share ...
    summary = summarize(asdict(config), records, seconds, teardown, deployment_id)
    print_summary(summary, sys.stderr)                # summary  value / -------  ----- / ...

The reward goal (``reward_goal_met``): the final mean reward is at least 0.5 and at least
twice the first. The same summary drawn as an HTML page (``cwtrain demo --report PATH``) is
:mod:`cwtrain.local.demo.page`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = ["PASS_RULE", "TASK", "LiveDisplay", "StepRecord", "print_summary", "summarize"]

#: What the demo trains, in one sentence (``--help``, the summary, the report).
TASK = (
    'parity digits: each prompt is "even: " or "odd: "; a completion\'s reward is the fraction of its '
    "--max-tokens slots holding a digit of that parity (0 to 1; a fresh model scores about 0.07)"
)
#: When ``cwtrain demo`` exits 0.
PASS_RULE = (
    "exit 0 when the final step's mean reward is at least 0.5 and at least twice the first step's "
    "(always, with --no-check, once the run finishes); 1 otherwise"
)


@dataclass
class StepRecord:
    """One row of the live display and the summary.

    ``cut_reason`` is why a FULL snapshot was published (``first``, ``count``, ``share``,
    ``replay``, ...; ``none`` for a delta or nothing), ``replay_bytes`` what a replica starting
    cold at this version would read (the chain's FULL and every delta since),
    ``trainer_wait_seconds`` how long the training loop was blocked by this version's publish
    (all of it synchronously; with ``--ahead`` the wait for it at the next step's hand-over),
    ``sample_staleness`` how many versions the samples this step trained on were behind the
    trainer's weights at most (``None`` at the baseline).
    """

    step: int
    identity: str
    snapshot_type: str
    mean_reward: float | None
    snapshot_bytes: int
    tensors_changed: int
    publish_seconds: float
    hot_load_seconds: float
    replicas_serving: int
    served_identities: list[str] = field(default_factory=list)
    logprob_gap: float | None = None
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    rollout_retries: int = 0
    canary_gap: float | None = None
    cut_reason: str = "none"
    replay_bytes: int = 0
    trainer_wait_seconds: float = 0.0
    sample_staleness: int | None = None

    @property
    def kind(self) -> str:
        """``FULL/share``, ``INCREMENTAL``, ``SKIPPED``: the snapshot type, with a FULL's reason."""
        return f"FULL/{self.cut_reason}" if self.snapshot_type == "FULL" else self.snapshot_type


def _bar(value: float, width: int = 20) -> str:
    filled = round(max(0.0, min(1.0, value)) * width)
    return "█" * filled + "·" * (width - filled)


def _kib(n: int) -> str:
    return f"{n / 1024:7.1f} KiB"


class LiveDisplay:
    """The live lines on a stream (stderr).

    Args:
        stream: where the lines go.
        total: the number of training steps (shown as ``step k/total``).
    """

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = total

    def say(self, text: str) -> None:
        """One line, flushed."""
        print(text, file=self.stream, flush=True)

    def row(self, rec: StepRecord) -> None:
        """The line of one step: reward, snapshot type and size, latencies, what is served."""
        reward = "   —  " if rec.mean_reward is None else f"{rec.mean_reward:6.3f}"
        bar = _bar(rec.mean_reward or 0.0)
        self.say(
            f"step {rec.step:>3}/{self.total}  reward {reward} {bar}  {rec.kind:<16} "
            f"{_kib(rec.snapshot_bytes)}  publish {rec.publish_seconds * 1000:6.0f} ms  "
            f"hot-load {rec.hot_load_seconds * 1000:5.0f} ms  waited {rec.trainer_wait_seconds * 1000:5.0f} ms  "
            f"rollout {rec.rollout_seconds * 1000:5.0f} ms  train {rec.train_seconds * 1000:4.0f} ms  "
            f"serving {rec.identity} on {rec.replicas_serving}"
        )


def summarize(
    config: Mapping[str, Any], records: list[StepRecord], seconds: float, teardown: float, deployment_id: str
) -> dict[str, Any]:
    """The summary document of a run.

    Args:
        config: the run's settings as JSON (with ``replicas``).
        records: one record per step, step 0 (the baseline) first.
        seconds: the whole run's wall time.
        teardown: the seconds spent deleting the deployment and gateway.
        deployment_id: the deployment the run published to.
    """
    rewards = [r.mean_reward for r in records if r.mean_reward is not None]
    published = [r for r in records if r.snapshot_type != "SKIPPED"]
    deltas = [r for r in published if r.snapshot_type == "INCREMENTAL"]
    fulls = [r for r in published if r.snapshot_type == "FULL"]
    reasons: dict[str, int] = {}
    for r in fulls:
        reasons[r.cut_reason] = reasons.get(r.cut_reason, 0) + 1
    worst = max(records, key=lambda r: r.replay_bytes, default=None)
    first = rewards[0] if rewards else 0.0
    final = rewards[-1] if rewards else 0.0
    met = final >= 0.5 and final >= 2 * first
    ahead = bool(config.get("ahead"))
    staleness = [r.sample_staleness for r in records if r.sample_staleness is not None]
    return {
        "config": dict(config),
        "deployment_id": deployment_id,
        "first_reward": first,
        "final_reward": final,
        "reward_goal_met": met,
        "rewards": rewards,
        "published": len(published),
        "full_snapshots": len(fulls),
        "full_reasons": reasons,
        "max_replay_bytes": worst.replay_bytes if worst is not None else 0,
        "max_replay_step": worst.step if worst is not None else None,
        "delta_snapshots": len(deltas),
        "median_delta_bytes": statistics.median(r.snapshot_bytes for r in deltas) if deltas else None,
        "median_full_bytes": statistics.median(r.snapshot_bytes for r in fulls) if fulls else None,
        "median_publish_seconds": statistics.median(r.publish_seconds for r in published) if published else None,
        "median_hot_load_seconds": statistics.median(r.hot_load_seconds for r in published) if published else None,
        "max_hot_load_seconds": max((r.hot_load_seconds for r in published), default=None),
        "median_rollout_seconds": statistics.median(r.rollout_seconds for r in records[1:])
        if len(records) > 1
        else None,
        "median_train_seconds": statistics.median(r.train_seconds for r in records[1:]) if len(records) > 1 else None,
        "final_identity": published[-1].identity if published else "initial",
        "every_replica_served_every_version": all(r.replicas_serving == config["replicas"] for r in published),
        "rollouts_served_by_latest": all(
            r.served_identities == [records[i - 1].identity] for i, r in enumerate(records) if i > 0
        ),
        "median_trainer_wait_seconds": statistics.median(r.trainer_wait_seconds for r in records[1:])
        if len(records) > 1
        else None,
        "max_sample_staleness": max(staleness, default=None),
        "max_staleness_allowed": 1 if ahead else 0,
        "rollout_retries": sum(r.rollout_retries for r in records),
        "max_canary_gap": max((r.canary_gap for r in records if r.canary_gap is not None), default=None),
        "teardown_seconds": teardown,
        "total_seconds": seconds,
        "steps": [asdict(r) for r in records],
    }


def _staleness_row(summary: Mapping[str, Any]) -> tuple[str, str]:
    """Synchronously every rollout comes from the version just served; one step ahead, at most one behind."""
    if not summary["config"].get("ahead"):
        return ("rollouts from the latest version", "yes" if summary["rollouts_served_by_latest"] else "NO")
    worst, allowed = summary["max_sample_staleness"], summary["max_staleness_allowed"]
    within = worst is None or worst <= allowed
    return (f"rollouts at most {allowed} version behind the trainer", ("yes" if within else "NO") + f" (worst {worst})")


def print_summary(summary: dict[str, Any], stream: TextIO) -> None:
    """The summary table and the verdict line."""

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.0f} ms"

    def size(value: float | None) -> str:
        return "—" if value is None else _kib(int(value)).strip()

    rows = [
        ("task", "parity digits (cwtrain demo --help)"),
        ("steps", str(summary["config"]["steps"])),
        ("first mean reward", f"{summary['first_reward']:.3f}"),
        ("final mean reward", f"{summary['final_reward']:.3f}"),
        ("snapshots (FULL / delta)", f"{summary['full_snapshots']} / {summary['delta_snapshots']}"),
        ("FULL snapshots by reason", ", ".join(f"{k} {v}" for k, v in sorted(summary["full_reasons"].items())) or "—"),
        (
            "largest cold-start replay",
            f"{size(summary['max_replay_bytes'])} (step {summary['max_replay_step']})"
            if summary["max_replay_step"] is not None
            else "—",
        ),
        ("median delta size", size(summary["median_delta_bytes"])),
        ("median FULL size", size(summary["median_full_bytes"])),
        ("median publish", ms(summary["median_publish_seconds"])),
        ("median hot-load (all replicas)", ms(summary["median_hot_load_seconds"])),
        (
            "median rollout / train per step",
            f"{ms(summary['median_rollout_seconds'])} / {ms(summary['median_train_seconds'])}",
        ),
        ("final identity", summary["final_identity"]),
        ("every replica on every version", "yes" if summary["every_replica_served_every_version"] else "NO"),
        (
            "median wait for publish + hot-load per step",
            f"{ms(summary['median_trainer_wait_seconds'])}"
            + (" (one step ahead)" if summary["config"].get("ahead") else ""),
        ),
        _staleness_row(summary),
        (
            "canary: largest gap after a hot-load",
            "off" if summary["max_canary_gap"] is None else f"{summary['max_canary_gap']:.4f} nats (bound 0.05)",
        ),
        ("total time", f"{summary['total_seconds']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print("", file=stream)
    print(f"{'summary'.ljust(width)}  value", file=stream)
    print(f"{'-' * width}  {'-' * 24}", file=stream)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}", file=stream)
    first, final = summary["first_reward"], summary["final_reward"]
    if summary["reward_goal_met"]:
        verdict = f"reward climbed: final {final:.3f} ≥ 0.5 and ≥ 2 × first {first:.3f}"
    else:
        verdict = f"reward did NOT reach the goal: final {final:.3f}, wanted ≥ 0.5 and ≥ 2 × first {first:.3f}"
    print(f"\n{verdict}; everything torn down.", file=stream, flush=True)

"""Scores of a NeMo Gym rollouts file.

Gym writes one JSON object per rollout: the verifier's ``reward`` (a number), the
``agent_ref`` (``{"name": ...}``) the row ran on, the ``response`` and the inputs. Next
to it, ``<stem>_aggregate_metrics.json`` holds what each agent server computed
(``agent_metrics``, ``key_metrics``, ...). :func:`read_scores` reads both: the count and
mean reward over all rollouts and per agent, computed here (so a run is scored even when
Gym's aggregation was skipped), plus Gym's own aggregate metrics, unchanged, when present.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cwtrain.errors import CWTrainError
from cwtrain.jsondoc import load_json

__all__ = ["AgentScore", "GymScores", "read_scores"]


@dataclass(frozen=True)
class AgentScore:
    """The rollouts of one agent: how many, how many had a reward, their mean reward."""

    rollouts: int
    scored: int
    mean_reward: float | None


@dataclass(frozen=True)
class GymScores:
    """Scores of one rollouts file.

    Attributes:
        rollouts: lines in the file.
        scored: rollouts with a finite numeric ``reward``.
        mean_reward: mean of those rewards (``None`` without any).
        by_agent: the same per ``agent_ref.name`` (``"<none>"`` for rows without one).
        aggregate_metrics: Gym's ``*_aggregate_metrics.json`` as written, or ``None``.
    """

    rollouts: int
    scored: int
    mean_reward: float | None
    by_agent: dict[str, AgentScore] = field(default_factory=dict)
    aggregate_metrics: Any = None


def _reason(exc: ValueError) -> str:
    """Why a line or file is not JSON: the parser's message without its position, or the depth refusal."""
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _reward(row: dict[str, Any]) -> float | None:
    value = row.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def read_scores(output_path: Path, aggregate_metrics_path: Path | None = None) -> GymScores:
    """Score a rollouts JSONL file (and read Gym's aggregate metrics beside it, if any).

    Raises:
        CWTrainError: the file is missing or a line is not a JSON object.
    """
    rewards: list[float] = []
    agents: dict[str, tuple[int, list[float]]] = {}
    rollouts = 0
    try:
        handle = output_path.open(encoding="utf-8")
    except FileNotFoundError:
        raise CWTrainError(f"the rollouts file {output_path} was not written; the collection step failed") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = load_json(line)
            except ValueError as exc:
                raise CWTrainError(f"{output_path}:{number} is not JSON ({_reason(exc)})") from None
            if not isinstance(row, dict):
                raise CWTrainError(f"{output_path}:{number} is not a JSON object")
            rollouts += 1
            ref = row.get("agent_ref")
            name = str(ref.get("name")) if isinstance(ref, dict) and ref.get("name") else "<none>"
            count, agent_rewards = agents.get(name, (0, []))
            reward = _reward(row)
            if reward is not None:
                rewards.append(reward)
                agent_rewards.append(reward)
            agents[name] = (count + 1, agent_rewards)
    metrics: Any = None
    if aggregate_metrics_path is not None and aggregate_metrics_path.exists():
        try:
            metrics = load_json(aggregate_metrics_path.read_bytes())
        except ValueError as exc:
            raise CWTrainError(f"{aggregate_metrics_path} is not JSON ({_reason(exc)})") from None
    return GymScores(
        rollouts=rollouts,
        scored=len(rewards),
        mean_reward=_mean(rewards),
        by_agent={
            name: AgentScore(rollouts=count, scored=len(values), mean_reward=_mean(values))
            for name, (count, values) in sorted(agents.items())
        },
        aggregate_metrics=metrics,
    )

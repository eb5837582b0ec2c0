"""Scoring a Gym rollouts file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cwtrain.errors import CWTrainError
from cwtrain.integrations.gym import read_scores


def write(path: Path, rows: list[object], blank_lines: bool = False) -> Path:
    text = "".join(json.dumps(r) + ("\n\n" if blank_lines else "\n") for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


def test_mean_reward_overall_and_per_agent(tmp_path: Path) -> None:
    rows = [
        {"reward": 1.0, "agent_ref": {"name": "math"}},
        {"reward": 0.0, "agent_ref": {"name": "math"}},
        {"reward": 1, "agent_ref": {"name": "math"}},
        {"reward": 0.25, "agent_ref": {"name": "code"}},
        {"reward": None, "agent_ref": {"name": "code"}},  # a rollout without a score
        {"reward": True},  # booleans are not scores
        {"reward": float("nan")},  # written by json.dumps as NaN
        {"reward": "1"},
    ]
    scores = read_scores(write(tmp_path / "r.jsonl", rows, blank_lines=True))
    assert scores.rollouts == 8
    assert scores.scored == 4
    assert scores.mean_reward == pytest.approx((1 + 0 + 1 + 0.25) / 4)
    assert scores.by_agent["math"].rollouts == 3
    assert scores.by_agent["math"].mean_reward == pytest.approx(2 / 3)
    assert (scores.by_agent["code"].rollouts, scores.by_agent["code"].scored) == (2, 1)
    assert scores.by_agent["code"].mean_reward == pytest.approx(0.25)
    assert scores.by_agent["<none>"].rollouts == 3
    assert scores.by_agent["<none>"].mean_reward is None
    assert scores.aggregate_metrics is None
    assert all(not math.isnan(a.mean_reward or 0.0) for a in scores.by_agent.values())


def test_empty_file_has_no_mean(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("", encoding="utf-8")
    scores = read_scores(path)
    assert (scores.rollouts, scores.scored, scores.mean_reward, scores.by_agent) == (0, 0, None, {})


def test_aggregate_metrics_are_read_unchanged(tmp_path: Path) -> None:
    metrics = [{"agent_ref": {"name": "math"}, "key_metrics": {"mean/reward": 0.5}}]
    aggregate = tmp_path / "r_aggregate_metrics.json"
    aggregate.write_text(json.dumps(metrics), encoding="utf-8")
    scores = read_scores(write(tmp_path / "r.jsonl", [{"reward": 0.5}]), aggregate)
    assert scores.aggregate_metrics == metrics
    assert read_scores(tmp_path / "r.jsonl", tmp_path / "absent.json").aggregate_metrics is None


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(CWTrainError, match="was not written"):
        read_scores(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reward": 1}\n{not json\n', encoding="utf-8")
    with pytest.raises(CWTrainError, match=r"bad.jsonl:2 is not JSON"):
        read_scores(bad)
    with pytest.raises(CWTrainError, match=r"list.jsonl:1 is not a JSON object"):
        read_scores(write(tmp_path / "list.jsonl", [[1, 2]]))
    broken = tmp_path / "m.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(CWTrainError, match=r"m\.json is not JSON"):
        read_scores(write(tmp_path / "ok.jsonl", [{"reward": 1}]), broken)

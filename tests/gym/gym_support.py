"""Helpers of the cwtrain-gym tests: the stand-in ``gym`` CLI's handle, a stub endpoint, input rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAKE_GYM = Path(__file__).resolve().parent / "fake_gym.py"


@dataclass
class FakeGym:
    """The fake ``gym`` installed on PATH for one test."""

    bin_dir: Path
    state_path: Path
    log_path: Path

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]

    def calls(self) -> list[list[str]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines()]


@dataclass
class StubEndpoint:
    """A stub OpenAI ``/v1/completions`` endpoint on loopback that checks the bearer key."""

    base_url: str
    api_key: str
    model: str
    requests: list[dict[str, Any]] = field(default_factory=list)


def write_rows(path: Path, rewards: list[float], agent: str | None = "math_agent") -> Path:
    """Gym input rows with a ``fake_reward`` each (the fake ``gym`` reports it as the score)."""
    lines = []
    for i, reward in enumerate(rewards):
        row: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": f"what is {i} + {i}?"}]},
            "fake_reward": reward,
        }
        if agent:
            row["agent_ref"] = {"name": agent}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

"""miles.rollout.base_types: the class-based rollout API's inputs and outputs."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RolloutFnConstructorInput:
    args: Namespace
    data_source: Any


@dataclass(frozen=True)
class RolloutFnBaseInput:
    rollout_id: int

    @property
    def evaluation(self):
        raise NotImplementedError


@dataclass(frozen=True)
class RolloutFnTrainInput(RolloutFnBaseInput):
    weight_version: int | None = None

    @property
    def evaluation(self):
        return False


@dataclass(frozen=True)
class RolloutFnEvalInput(RolloutFnBaseInput):
    generate_state: Any = None
    weight_version: str | None = None
    hf_dir: str | None = None

    @property
    def evaluation(self):
        return True


@dataclass
class RolloutFnTrainOutput:
    samples: list
    metrics: dict[str, Any] = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = None

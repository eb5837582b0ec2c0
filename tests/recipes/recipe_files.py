"""Shared constants and helpers of the recipe tests (paths, placeholders)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
RECIPES = ("miles", "slime", "nemo-rl", "nemo-gym")
TRAINING_RECIPES = ("miles", "slime", "nemo-rl")

#: The trainer (or evaluator) service account of each recipe.
SERVICE_ACCOUNTS = {
    "miles": "cwtrain-miles-trainer",
    "slime": "cwtrain-slime-trainer",
    "nemo-rl": "cwtrain-nemo-rl-trainer",
    "nemo-gym": "cwtrain-gym-evaluator",
}

PLACEHOLDER = re.compile(r"<([A-Za-z][^<>]*)>")


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def fill(value: Any, values: Mapping[str, str]) -> Any:
    """Replace every ``<name>`` in the strings of ``value`` with ``values[name]`` (KeyError if unknown)."""
    if isinstance(value, str):
        return PLACEHOLDER.sub(lambda m: values[m.group(1)], value)
    if isinstance(value, list):
        return [fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    return value


def placeholders_in(value: Any) -> set[str]:
    """The names of every ``<placeholder>`` in the strings of ``value``."""
    if isinstance(value, str):
        return set(PLACEHOLDER.findall(value))
    if isinstance(value, list):
        return set().union(*(placeholders_in(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(placeholders_in(v) for v in value.values())) if value else set()
    return set()

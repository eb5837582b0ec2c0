"""Fixtures of the recipe tests: each recipe folder in turn (helpers live in recipe_files.py)."""

from __future__ import annotations

import pytest
from recipe_files import RECIPES, TRAINING_RECIPES


@pytest.fixture(params=RECIPES)
def recipe(request: pytest.FixtureRequest) -> str:
    """Each recipe folder's name in turn."""
    return str(request.param)


@pytest.fixture(params=TRAINING_RECIPES)
def training_recipe(request: pytest.FixtureRequest) -> str:
    """Each training recipe's folder name in turn."""
    return str(request.param)

"""Every cwtrain name a recipe uses exists in the cwtrain packages.

The launchers pass dotted paths to the frameworks (``--custom-update-weight-post-write-path
cwtrain.integrations.slime.hook``, ``--rollout-function-path …``), run modules
(``python -m cwtrain.integrations.preflight``) and import classes in the NeMo-RL driver.
Integration modules need their framework to import, so a name is looked up in the module's
source when the framework is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from recipe_files import RECIPES, RECIPES_DIR

DOTTED = re.compile(r"\bcwtrain\.integrations(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FROM_IMPORT = re.compile(r"from (cwtrain\.integrations[\w.]*) import ([\w, ]+)")


def references(recipe: str) -> set[str]:
    found: set[str] = set()
    for path in (RECIPES_DIR / recipe).iterdir():
        if path.suffix in (".sh", ".py", ".yaml") and path.is_file():
            text = path.read_text(encoding="utf-8")
            found.update(DOTTED.findall(text))
            for module, names in FROM_IMPORT.findall(text):
                found.update(f"{module}.{name.strip()}" for name in names.split(","))
    return found


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module attribute (imported, or defined in its source)."""
    try:
        if importlib.util.find_spec(dotted) is not None:
            return True
    except ImportError:  # the parent is a module, or a package that needs its framework
        pass
    module_name, _, attr = dotted.rpartition(".")
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        return False
    try:
        return hasattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        assert "install" in str(exc), f"{module_name} fails to import without naming the install: {exc}"
    source = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
    files = sorted(source.rglob("*.py")) if source.is_dir() else [source]
    pattern = re.compile(
        rf"^(class|def) {re.escape(attr)}\b|^{re.escape(attr)}\s*[:=]|[\"']{re.escape(attr)}[\"']", re.M
    )
    return any(pattern.search(f.read_text(encoding="utf-8")) for f in files)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_names_exist(recipe: str) -> None:
    names = references(recipe)
    if recipe != "nemo-gym":
        assert "cwtrain.integrations.preflight" in names
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{recipe} uses names cwtrain does not define: {missing}"


def test_references_are_found() -> None:
    assert "cwtrain.integrations.slime.hook" in references("slime")
    assert "cwtrain.integrations.miles.CoreWeaveRolloutFn" in references("miles")
    assert "cwtrain.integrations.nemo_rl.install" in references("nemo-rl")
    assert not resolves("cwtrain.integrations.slime.no_such_hook")

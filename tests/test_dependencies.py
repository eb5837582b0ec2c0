"""Each package declares exactly the third-party distributions its code imports (issue 23, item 6).

The imports are the ones ``tests/test_imports.py`` reads with :mod:`ast` from
``packages/<dist>/src`` (top-level, lazy and ``TYPE_CHECKING`` imports alike); the
declarations are the package's ``pyproject.toml``: ``dependencies`` and every extra of
``optional-dependencies``.

* **Imported, so declared.** A module of a package that imports a third-party top-level
  module ``m`` needs the distribution that provides ``m`` among that package's own
  declarations. Another package's base dependencies do not count (core dropping one must
  not break a plug-in); an extra of ``cwtrain-core`` that the package asks for does
  (``cwtrain-core[torch]`` is the published way to get torch at core's pin). Not counted as
  imports: the standard library, cwtrain itself, and an import inside ``try:`` whose
  ``except ImportError``/``ModuleNotFoundError`` handler falls back instead of raising (an
  optional speed-up such as python-isal). The frameworks a plug-in runs inside bring
  their own modules: :data:`FRAMEWORK_PROVIDED`.
* **Declared, so imported.** Every third-party distribution a package declares is imported
  by some module of that package, unless :data:`RUNTIME_ONLY` says what needs it at run time
  without an import.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator

from test_imports import MODULES, ROOT, TREES, distribution_of

PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())

#: Import name → the distribution that provides it, where the two differ.
PROVIDED_BY = {
    "yaml": "pyyaml",
    # boto3 pins the exact botocore it runs on; declaring botocore beside it would only
    # repeat (or fight) that pin.
    "botocore": "boto3",
}

#: Modules a plug-in imports from the framework it runs inside (the framework's image or
#: environment ships them; the plug-in declares none of them, as no plug-in hard-requires
#: its framework: cwtrain.integrations.frameworks).
FRAMEWORK_PROVIDED: dict[str, set[str]] = {
    # the trainer's tokenizer is loaded with slime's transformers
    "cwtrain-slime": {"transformers"},
    # NeMo-RL's workers are Ray actors
    "cwtrain-nemo-rl": {"ray"},
    # the standalone model server (python -m cwtrain.integrations.gym.model_server) loads the trainer's
    # tokenizer with the transformers of the training environment it runs in (NeMo-RL's image)
    "cwtrain-gym": {"transformers"},
}

#: Declared distributions that no import shows, each with what needs it (none today: add a
#: line here, with its reason, before declaring such a dependency).
RUNTIME_ONLY: dict[str, dict[str, str]] = {}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(text: str) -> tuple[str, set[str]]:
    """``"moto[server]>=5.0"`` → ``("moto", {"server"})``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", text)
    assert match, text
    extras = {_normal(e) for e in (match.group(2) or "").split(",") if e.strip()}
    return _normal(match.group(1)), extras


def _project(package: str) -> dict[str, object]:
    return tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements(package: str) -> list[str]:
    project = _project(package)
    found = list(project.get("dependencies", []))  # type: ignore[call-overload]
    for extra in dict(project.get("optional-dependencies", {})).values():  # type: ignore[call-overload]
        found += extra
    return found


def declared(package: str) -> set[str]:
    """The third-party distributions ``package`` declares, with those of the core extras it asks for."""
    names: set[str] = set()
    for text in _requirements(package):
        name, extras = _requirement(text)
        if name == "cwtrain-core" and extras:
            core_extras = dict(_project("cwtrain-core")["optional-dependencies"])  # type: ignore[call-overload]
            names |= {_requirement(r)[0] for extra in extras for r in core_extras[extra]}
        elif not name.startswith("cwtrain"):
            names.add(name)
    return names


def _falls_back(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    catches = any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)
    return catches and not any(isinstance(n, ast.Raise) for n in ast.walk(handler))


def third_party_imports(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """``(top-level module, line)`` of every import of a module outside the standard library and cwtrain."""
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_falls_back(h) for h in node.handlers):
            optional |= {id(n) for statement in node.body for n in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top not in sys.stdlib_module_names and top not in ("cwtrain", "__future__"):
                yield top, node.lineno


def imported(package: str) -> dict[str, list[str]]:
    """Distribution (as :data:`PROVIDED_BY` maps it) → the ``module:line`` places of ``package`` importing it."""
    found: dict[str, list[str]] = {}
    for name in sorted(MODULES):
        if distribution_of(name) == package:
            for top, line in third_party_imports(TREES[name]):
                found.setdefault(_normal(PROVIDED_BY.get(top, top)), []).append(f"{name}:{line}")
    return found


def test_the_checks_themselves() -> None:
    assert _requirement("moto[server]>=5.0") == ("moto", {"server"})
    assert _requirement("PyYAML>=6") == ("pyyaml", set())
    assert _requirement("cwtrain-core[torch]==0.1.0") == ("cwtrain-core", {"torch"})
    source = """
import numpy as np
import os, json
from safetensors.torch import load
from . import sibling
from cwtrain.hotload import HotLoader
try:
    from isal.isal_zlib import adler32
except ImportError:
    from zlib import adler32
try:
    import torch
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError("install torch") from exc
def later():
    import yaml
"""
    assert sorted(top for top, _ in third_party_imports(ast.parse(source))) == ["numpy", "safetensors", "torch", "yaml"]
    assert "torch" in declared("cwtrain-local")  # through cwtrain-core[torch]
    assert "numpy" not in declared("cwtrain-gym")  # core's own dependencies do not count


def test_every_package_is_read() -> None:
    assert set(PACKAGES) == {distribution_of(name) for name in MODULES}
    assert set(FRAMEWORK_PROVIDED) <= set(PACKAGES) and set(RUNTIME_ONLY) <= set(PACKAGES)
    assert "zstandard" in imported("cwtrain-core") and "boto3" in imported("cwtrain-core")


def test_every_third_party_import_is_declared() -> None:
    missing = []
    for package in PACKAGES:
        allowed = declared(package) | FRAMEWORK_PROVIDED.get(package, set())
        for distribution, places in sorted(imported(package).items()):
            if distribution not in allowed:
                missing.append(f"{package}: imports {distribution} undeclared ({', '.join(places[:3])})")
    assert not missing, "\n".join(missing)


def test_every_declared_dependency_is_imported() -> None:
    unused = []
    for package in PACKAGES:
        used = set(imported(package)) | set(RUNTIME_ONLY.get(package, {}))
        unused += [f"{package}: declares {name}, never imported" for name in sorted(declared(package) - used)]
    assert not unused, "\n".join(unused)


def test_the_allow_lists_are_needed() -> None:
    """Each framework-provided module is still imported, and none is also declared (then it is not the framework's)."""
    for package, modules in FRAMEWORK_PROVIDED.items():
        found = imported(package)
        for module in sorted(modules):
            assert module in found, f"{package} no longer imports {module}: drop it from FRAMEWORK_PROVIDED"
            assert module not in declared(package), f"{package} declares {module}: drop it from FRAMEWORK_PROVIDED"
    for package, needs in RUNTIME_ONLY.items():
        assert set(needs) <= declared(package), package

"""Framework integrations: the rollout sampler, preflight, and one package per framework.

``cwtrain.integrations`` is shared by several distributions: each plug-in package adds its
own sub-package (``cwtrain-slime`` adds ``cwtrain.integrations.slime``, and so on). A plug-in
may also make names importable from here by declaring them in the ``cwtrain.integrations``
entry-point group of its ``pyproject.toml``::

    [project.entry-points."cwtrain.integrations"]
    hook = "cwtrain.integrations.slime:hook"

    from cwtrain.integrations import hook   # resolved on first use, then kept

Core itself names no framework: a name no installed plug-in declares is an
``AttributeError`` (an ``ImportError`` in ``from cwtrain.integrations import ...``).
"""

from __future__ import annotations

import pkgutil
from importlib.metadata import entry_points
from typing import Any

__path__ = pkgutil.extend_path(__path__, __name__)

ENTRY_POINT_GROUP = "cwtrain.integrations"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # import machinery probes (__file__, __wrapped__, ...): not plug-in names
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for entry_point in entry_points(group=ENTRY_POINT_GROUP, name=name):
        value = entry_point.load()
        globals()[name] = value
        return value
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r} (no installed cwtrain plug-in declares it in the "
        f"{ENTRY_POINT_GROUP!r} entry-point group)"
    )

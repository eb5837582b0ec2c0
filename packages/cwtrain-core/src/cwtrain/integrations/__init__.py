"""Framework integrations: the rollout sampler, preflight, and one package per framework.

``cwtrain.integrations`` is shared by several distributions: ``cwtrain-slime`` adds
``cwtrain.integrations.slime``, ``cwtrain-nemo-rl`` adds ``cwtrain.integrations.nemo_rl``,
and so on. ``HookConfig`` and ``hook`` (the slime/miles post-write hook) are importable
from here when ``cwtrain-slime`` is installed.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from typing import Any

__path__ = pkgutil.extend_path(__path__, __name__)

_LAZY = {"HookConfig": "cwtrain.integrations.slime", "hook": "cwtrain.integrations.slime"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cwtrain.integrations' has no attribute {name!r}")
    try:
        mod = import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name not in ("cwtrain.integrations.slime",):
            raise
        raise ImportError(
            f'cwtrain.integrations.{name} needs the slime integration: pip install "cwtrain[slime]"'
        ) from exc
    return getattr(mod, name)

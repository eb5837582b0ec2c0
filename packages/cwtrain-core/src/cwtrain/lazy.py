"""Names a package exports without importing them until first use (PEP 562).

Packages keep ``import cwtrain`` cheap (no torch, no ray, no boto3) by resolving their
exports on first access::

    _LAZY = {"HotLoader": "cwtrain.hotload.loader", "InferenceClient": "cwtrain.infra.client"}
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

A resolved name is stored in the package's namespace, so the lookup runs once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, str], exported: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__``.
        table: exported name → the module that defines it.
        exported: the package's ``__all__``.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exported))

    return __getattr__, __dir__

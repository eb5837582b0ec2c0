"""The framework cwtrain-miles runs inside, and the versions it supports.

Core's :mod:`cwtrain.integrations.frameworks` holds only the mechanism (``require``,
``install_line``); this record is the plug-in's own, found by core through the
``cwtrain.frameworks`` entry-point group of this package's ``pyproject.toml``.
"""

from __future__ import annotations

from cwtrain.integrations.frameworks import Framework

__all__ = ["MILES"]

#: miles: any version (the contract suite names the commit it last passed against).
MILES = Framework("miles", "miles", "cwtrain-miles", "the radixark/miles image ships it", ("miles",))

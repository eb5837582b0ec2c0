"""The framework cwtrain-gym drives, and the versions it supports.

Core's :mod:`cwtrain.integrations.frameworks` holds only the mechanism (``require``,
``install_line``); this record is the plug-in's own, found by core through the
``cwtrain.frameworks`` entry-point group of this package's ``pyproject.toml``.
"""

from __future__ import annotations

from cwtrain.integrations.frameworks import Framework

__all__ = ["GYM"]

#: NeMo Gym 0.6.0 or newer (its ``gym`` command; 0.4's ``ng_*`` scripts are driven too).
GYM = Framework("NeMo Gym", "nemo_gym", "cwtrain-gym", 'pip install "nemo-gym>=0.6.0"', ("nemo-gym",), "0.6.0")

"""The framework cwtrain-nemo-rl runs inside, and the versions it supports.

Core's :mod:`cwtrain.integrations.frameworks` holds only the mechanism (``require``,
``install_line``); this record is the plug-in's own, found by core through the
``cwtrain.frameworks`` entry-point group of this package's ``pyproject.toml``.
"""

from __future__ import annotations

from cwtrain.integrations.frameworks import Framework

__all__ = ["NEMO_RL"]

#: NeMo-RL 0.7.x: the worker and refit patches follow v0.7.0's code (``scripts/contracts-nemo.sh``).
NEMO_RL = Framework(
    "NeMo-RL", "nemo_rl", "cwtrain-nemo-rl", "the NeMo-RL v0.7.0 image ships it", ("nemo-rl", "nemo_rl"), "0.7.0", "0.8"
)

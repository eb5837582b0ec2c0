"""NeMo-RL's names, imported on first use with an error that says what to install."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

__all__ = ["INSTALL_HINT", "require"]

INSTALL_HINT = (
    "the coreweave backend runs inside NeMo-RL (v0.7.0): use the NeMo-RL image and "
    'pip install "cwtrain[nemo-rl]" (or ./packages/cwtrain-nemo-rl from a cwtrain checkout)'
)


def require(module: str) -> ModuleType:
    """Import a NeMo-RL module or raise ``ImportError`` naming the install."""
    try:
        return import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == "nemo_rl" or exc.name.startswith("nemo_rl.")):
            raise ImportError(f"{module} is not importable: {INSTALL_HINT}") from exc
        raise

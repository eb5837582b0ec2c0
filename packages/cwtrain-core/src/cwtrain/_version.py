"""The installed version of cwtrain-core (``0+unknown`` without package metadata)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("cwtrain-core")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

USER_AGENT = f"cwtrain/{__version__}"

"""Moved to :mod:`cwtrain.hotload.files.mirror`; this path (named by interface.md §3) re-exports it until 0.3."""

from cwtrain.hotload.files.mirror import DeltaReport, MirrorError, WeightMirror

__all__ = ["DeltaReport", "MirrorError", "WeightMirror"]

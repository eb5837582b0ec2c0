"""Moved to :mod:`cwtrain.hotload.files.write`; this path (named by interface.md §3) re-exports it until 0.3."""

from cwtrain.hotload.files.write import checkpoint_checksums, write_delta, write_full_snapshot

__all__ = ["checkpoint_checksums", "write_delta", "write_full_snapshot"]

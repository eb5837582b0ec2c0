"""Snapshots and checkpoints as directories on disk.

``checkpoint`` (the one directory opener: a checkpoint or snapshot directory, its index and its
tensors as file regions), ``write`` (delta and FULL directories: ``write_delta``,
``write_full_snapshot``, ``checkpoint_checksums``), ``validate`` (``inspect_snapshot``,
``SnapshotInfo``) and ``mirror`` (``WeightMirror``: the trainer's byte-exact copy of what is served).
"""

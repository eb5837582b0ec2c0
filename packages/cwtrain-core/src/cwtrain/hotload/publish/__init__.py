"""Snapshots to object storage, and the cycle of one published version.

``buffers`` and ``sources`` (files read, hashed and sent from the same reused buffers),
``object_writer`` (one object's create-once write), ``upload`` (``upload_snapshot``,
``SnapshotUpload``: index last, resumable, race-free), ``store`` (``SnapshotStore``: a
deployment's bucket and prefix), ``manifest``, ``access`` (the permission check), ``verify``
(stored objects checked against their records), ``distributed`` (every rank's share, one index)
and ``session`` (``PublishSession``: one version's whole cycle, which every integration drives).
"""

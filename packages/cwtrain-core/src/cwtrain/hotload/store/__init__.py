"""Object storage, by level; nothing here knows of hot-loads (snapshot-format.md sections 6-9).

* **One object** (``object_*``): ``object_buffers`` (reused read buffers), ``object_source``
  (the bytes of one object read once, hashed and sent from the same buffers), ``object_writer``
  (one object's create-only, resumable write with its SHA-256).
* **One snapshot's objects** (``snapshot_*``): ``snapshot_upload`` (every object of a snapshot,
  the index last), ``snapshot_verify`` (stored objects checked against the SHA-256 they were
  uploaded with, a FULL's tensors against their Adler-32s), ``snapshot_checks`` (what in-memory
  tensors are checked for before they are encoded).
* **The prefix** (``prefix*``): ``prefix`` (:class:`~cwtrain.hotload.store.prefix.SnapshotStore`:
  a deployment's bucket and path prefix, and what is stored there), ``prefix_access`` (the
  four-call permission check), ``prefix_manifests`` (``P/_manifests/<identity>.json``).

Imports run down these levels; the lifecycle (:mod:`cwtrain.hotload.lifecycle`) sits above.
"""

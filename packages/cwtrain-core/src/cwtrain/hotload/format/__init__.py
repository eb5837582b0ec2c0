"""The snapshot's bytes on the wire: no network, no torch (snapshot-format.md).

``safetensors`` (the container: the dtype table, headers), ``index`` (index JSON, shard names,
:class:`~cwtrain.hotload.format.index.SnapshotFile`), ``checksum`` (Adler-32 of bytes and of a
tensor), ``fileio`` (exact reads of open files with ``pread``), ``tensors``
(:class:`~cwtrain.hotload.format.tensors.TensorData`, file regions), ``identity`` (identities and
versions) and ``chain`` (chain rules: the 63-delta limit, a hot-load's type and predecessor).
"""

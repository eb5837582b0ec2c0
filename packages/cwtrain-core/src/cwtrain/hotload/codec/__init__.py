"""Tensors to frames and back: XOR + zstd + Adler-32 (snapshot-format.md sections 4-7).

``encode`` (:class:`~cwtrain.hotload.codec.encode.DeltaEncoder`: deltas and checksummed FULL
snapshots from numpy buffers or file regions), ``decode`` (apply, verify, FULL loads, chain
replay), ``frames`` (zstd frames checked before decoding, decoded within a memory budget),
``device`` (the same encoder on torch tensors where they live), ``stages`` (optional per-stage
timing) and ``common`` (what the encoder and decoder share: the memory budget, the parallel map,
uint8 views).
"""

"""How a local replica gets weights: base checkpoints, snapshot chains, peers.

A replica holds one :class:`ServedWeights` at a time (identity, model config, the raw
tensor bytes in the codec's ``TensorData`` form, and a :class:`~cwtrain.local.engine.model.TinyLM`
built from them). This module builds new ones without touching the served copy:

- :meth:`SnapshotSource.read_base` — the deployment's base checkpoint
  (``s3://<model bucket>/<model path>/``: ``config.json`` plus ``model.safetensors`` or an
  index and shards), served as identity ``initial``.
- :func:`plan_chain` — which snapshots of a resolved chain (oldest first, starting at a
  FULL) must be applied: only the deltas after the served identity when it is in the chain,
  else the last FULL and every delta after it (at most
  :data:`cwtrain.hotload.MAX_CHAIN_DELTAS`).
- :func:`apply_chain` — reads every index first and checks ``xor``/``zstd``/``adler32`` and
  the ``version``/``base_version`` links before anything is decoded, then applies FULL and
  deltas with the codec (:func:`cwtrain.hotload.load_full` and
  :func:`cwtrain.hotload.apply_delta`, which verify every Adler-32). Any error leaves
  the served weights untouched.

Every snapshot object (index and shards) is checked as it is read, as a strict engine
would: its SHA-256 must equal its ``cwtrain-sha256`` metadata, which cwtrain's uploader
writes on every snapshot object, so a flipped byte is caught even in a plain FULL snapshot
without Adler-32s; an object without the metadata is refused too. Base checkpoint objects
are checked where they carry it. Errors name the object (``s3://bucket/key``).
- :func:`weights_file` / :func:`served_from_weights_file` — the one-file safetensors form a
  cold replica copies from a peer (``__metadata__`` holds ``identity`` and ``config``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cwtrain.errors import SnapshotChecksumError, SnapshotError
from cwtrain.hotload import (
    INDEX_NAME,
    MAX_CHAIN_DELTAS,
    SHA256_METADATA,
    SINGLE_FILE_NAME,
    TensorData,
    apply_delta,
    check_delta_metadata,
    index_metadata,
    is_delta_index,
    load_full,
    parse_index,
    snapshot_prefix,
)
from cwtrain.jsondoc import load_json
from cwtrain.local.engine.model import (
    CONFIG_FILE,
    ModelConfig,
    TinyLM,
    from_tensor_data,
    to_tensor_data,
    weights_from_safetensors,
    weights_to_safetensors,
)

__all__ = [
    "ChainLink",
    "ServedWeights",
    "SnapshotSource",
    "apply_chain",
    "plan_chain",
    "served_from_weights_file",
    "weights_file",
]


@dataclass(frozen=True)
class ChainLink:
    """One snapshot of a resolved chain."""

    identity: str
    type: str  # "FULL" or "INCREMENTAL"


@dataclass(frozen=True)
class ServedWeights:
    """What a replica serves: identity, config, raw tensors and the loaded model."""

    identity: str
    config: ModelConfig
    tensors: Mapping[str, TensorData]
    lm: TinyLM

    @classmethod
    def build(cls, identity: str, config: ModelConfig, tensors: Mapping[str, TensorData]) -> ServedWeights:
        """Load ``tensors`` into a model (checks names and shapes against ``config``)."""
        try:
            lm = TinyLM(from_tensor_data(tensors), config)
        except ValueError as exc:
            raise SnapshotError(f"snapshot {identity!r} does not fit the served model: {exc}") from exc
        return cls(identity, config, dict(tensors), lm)


class SnapshotSource:
    """Reads snapshot objects from one bucket and path prefix (a boto3 S3 client)."""

    def __init__(self, s3: Any, bucket: str, path_prefix: str = "") -> None:
        self.s3 = s3
        self.bucket = bucket
        self.path_prefix = path_prefix.strip("/")

    def _key(self, identity: str, name: str) -> str:
        return f"{snapshot_prefix(self.path_prefix, identity)}/{name}"

    def _get(self, bucket: str, key: str, *, require_sha256: bool = False) -> bytes:
        """The object's bytes, checked against its ``cwtrain-sha256`` metadata (required or where present)."""
        try:
            response = self.s3.get_object(Bucket=bucket, Key=key)
            data = bytes(response["Body"].read())
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
            raise SnapshotError(f"cannot read s3://{bucket}/{key}: {code}") from exc
        recorded = {k.lower(): v for k, v in (response.get("Metadata") or {}).items()}.get(SHA256_METADATA)
        if recorded is None:
            if require_sha256:
                raise SnapshotChecksumError(
                    f"s3://{bucket}/{key} has no {SHA256_METADATA} metadata, so its bytes cannot be checked; "
                    "publish snapshots with cwtrain, which records the SHA-256 of every object it stores"
                )
            return data
        actual = hashlib.sha256(data).hexdigest()
        if actual != recorded.strip().lower():
            raise SnapshotChecksumError(
                f"s3://{bucket}/{key}: SHA-256 of the stored bytes is {actual}, but its {SHA256_METADATA} "
                f"metadata says {recorded[:64]}; the object changed after upload: publish the weights again"
            )
        return data

    def _exists(self, bucket: str, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=bucket, Key=key)
        except Exception:
            return False
        return True

    def read_snapshot(self, identity: str) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The index (parsed) and every shard it names, of snapshot ``identity``."""
        index = self.read_index(identity)
        return index, self.read_shards(identity, index)

    def read_index(self, identity: str) -> dict[str, Any]:
        """The parsed index (:data:`~cwtrain.hotload.INDEX_NAME`) of snapshot ``identity``."""
        raw = self._get(self.bucket, self._key(identity, INDEX_NAME), require_sha256=True)
        return parse_index(raw, source=f"index of snapshot {identity!r}")

    def read_shards(self, identity: str, index: Mapping[str, Any]) -> dict[str, bytes]:
        """The shards named by ``index`` of snapshot ``identity``."""
        names = sorted(set(index["weight_map"].values()))
        return {name: self._get(self.bucket, self._key(identity, name), require_sha256=True) for name in names}

    def read_base(self, bucket: str, path: str) -> ServedWeights:
        """The deployment's base checkpoint at ``s3://bucket/path/``, served as ``initial``."""
        path = path.strip("/")

        def key(name: str) -> str:
            return f"{path}/{name}" if path else name

        config = ModelConfig.from_json(load_json(self._get(bucket, key(CONFIG_FILE))))
        if self._exists(bucket, key(INDEX_NAME)):
            index = parse_index(self._get(bucket, key(INDEX_NAME)), source=f"s3://{bucket}/{key(INDEX_NAME)}")
            names = sorted(set(index["weight_map"].values()))
        else:
            names = [SINGLE_FILE_NAME]
        weights: dict[str, Any] = {}
        for name in names:
            try:
                weights.update(weights_from_safetensors(self._get(bucket, key(name)))[0])
            except (ValueError, OSError) as exc:
                raise SnapshotError(f"s3://{bucket}/{key(name)} is not a readable safetensors file: {exc}") from exc
        return ServedWeights.build("initial", config, to_tensor_data(weights))


def plan_chain(current: str | None, chain: Sequence[ChainLink]) -> tuple[ChainLink | None, list[ChainLink]]:
    """The FULL to load (``None`` = keep the served weights) and the deltas to apply after it.

    Raises:
        SnapshotError: The chain is empty, does not start at a FULL, or a cold replay would
            apply more than :data:`cwtrain.hotload.MAX_CHAIN_DELTAS` deltas.
    """
    if not chain:
        raise SnapshotError("the hot-load chain is empty")
    if chain[0].type != "FULL":
        raise SnapshotError(f"the hot-load chain starts at {chain[0].identity!r}, which is not a FULL snapshot")
    last_full = max(i for i, link in enumerate(chain) if link.type == "FULL")
    ids = [link.identity for link in chain]
    if current is not None and current in ids:
        pos = len(ids) - 1 - ids[::-1].index(current)
        if pos >= last_full:
            return None, list(chain[pos + 1 :])
    deltas = list(chain[last_full + 1 :])
    if len(deltas) > MAX_CHAIN_DELTAS:
        raise SnapshotError(
            f"replaying {chain[-1].identity!r} needs {len(deltas)} deltas after the FULL snapshot "
            f"{chain[last_full].identity!r}; a replica replays at most {MAX_CHAIN_DELTAS} (publish a FULL snapshot)"
        )
    return chain[last_full], deltas


def _check_delta_index(identity: str, previous: str, index: Mapping[str, Any]) -> None:
    if not is_delta_index(index):
        raise SnapshotError(f"snapshot {identity!r} is listed as INCREMENTAL but its index has no delta_encoding")
    meta = index_metadata(index)
    check_delta_metadata(meta, source=f"snapshot {identity!r}")
    if "version" in meta and meta["version"] != identity:
        raise SnapshotError(f"snapshot {identity!r} has index metadata version {meta['version']!r}")
    if "base_version" in meta and meta["base_version"] != previous:
        raise SnapshotError(
            f"snapshot {identity!r} is a delta over {meta['base_version']!r}, but the chain puts it after {previous!r}"
        )


def apply_chain(
    source: SnapshotSource,
    served: ServedWeights,
    chain: Sequence[ChainLink],
    *,
    on_step: Callable[[str], None] | None = None,
) -> ServedWeights:
    """New weights for the last identity of ``chain``; ``served`` is never modified.

    Every index is read and checked before any tensor is decoded; the codec verifies every
    Adler-32 of the result before it is returned.

    Raises:
        SnapshotError: A missing object, a bad index, a broken link or a checksum mismatch
            (:class:`~cwtrain.errors.SnapshotChecksumError`), naming the snapshot.
    """
    full, deltas = plan_chain(served.identity, chain)
    if full is None and not deltas:
        return served
    indexes: list[tuple[ChainLink, dict[str, Any]]] = []
    previous = served.identity if full is None else full.identity
    if full is not None:
        full_index = source.read_index(full.identity)
        if is_delta_index(full_index):
            raise SnapshotError(f"snapshot {full.identity!r} is listed as FULL but its index is a delta")
        indexes.append((full, full_index))
    for link in deltas:
        if link.type != "INCREMENTAL":
            raise SnapshotError(f"snapshot {link.identity!r} after the FULL root must be INCREMENTAL")
        index = source.read_index(link.identity)
        _check_delta_index(link.identity, previous, index)
        indexes.append((link, index))
        previous = link.identity
    tensors: Mapping[str, TensorData] = served.tensors
    for link, index in indexes:
        if on_step:
            on_step(link.identity)
        shards = source.read_shards(link.identity, index)
        if link.type == "FULL":
            loaded = load_full(index, shards, workers=1, source=f"snapshot {link.identity!r}")
            if set(loaded) != set(served.tensors):
                raise SnapshotError(f"FULL snapshot {link.identity!r} does not hold the served model's tensors")
            tensors = loaded
        else:
            tensors = apply_delta(tensors, index, shards, workers=1, source=f"snapshot {link.identity!r}")
    return ServedWeights.build(chain[-1].identity, served.config, tensors)


def weights_file(served: ServedWeights) -> bytes:
    """The served weights as one safetensors file (``__metadata__``: identity, config)."""
    metadata = {"identity": served.identity, "config": json.dumps(served.config.to_json(), sort_keys=True)}
    return weights_to_safetensors(served.lm.weights, metadata)


def served_from_weights_file(data: bytes) -> ServedWeights:
    """Weights copied from a peer's :func:`weights_file`."""
    weights, metadata = weights_from_safetensors(data)
    if "identity" not in metadata or "config" not in metadata:
        raise SnapshotError("the peer's weights file has no identity/config metadata")
    config = ModelConfig.from_json(load_json(metadata["config"]))
    return ServedWeights.build(metadata["identity"], config, to_tensor_data(weights))

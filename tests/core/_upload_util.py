"""Small real FULL snapshots (config, two safetensors shards, index) for upload tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

MIB = 1 << 20


def write_full_snapshot(root: Path, *, seed: int, big_bytes: int = 11 * MIB + 4096) -> Path:
    """A FULL snapshot directory: one shard larger than two 5 MiB parts, one small shard."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    big = rng.integers(0, 2**31, size=big_bytes // 4, dtype=np.int64).astype(np.float32)
    small = rng.standard_normal(256).astype(np.float32)
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({"model.embed.weight": big}, str(root / shard1))
    save_file({"lm_head.weight": small}, str(root / shard2))
    index = {
        "metadata": {"total_size": big.nbytes + small.nbytes},
        "weight_map": {"model.embed.weight": shard1, "lm_head.weight": shard2},
    }
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    return root


def stored(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[bytes, dict[str, str], str]]:
    """Every object under ``prefix/``: name -> (bytes, metadata, ETag)."""
    out = {}
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    for item in listing.get("Contents", []):
        obj = s3.get_object(Bucket=bucket, Key=item["Key"])
        out[item["Key"][len(prefix) + 1 :]] = (obj["Body"].read(), obj.get("Metadata", {}), obj["ETag"])
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def open_uploads(s3: Any, bucket: str) -> list[dict[str, Any]]:
    return list(s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []))

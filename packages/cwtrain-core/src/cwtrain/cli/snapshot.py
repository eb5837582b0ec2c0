"""The ``cwtrain snapshot`` command group: local delta and checksum tools (no network).

::

    cwtrain snapshot diff BASE NEW --out DIR --identity ID --previous-identity PREV [--workers N]
    cwtrain snapshot diff BASE NEW --out DIR --version V --base-version B [--workers N]
        write the XOR delta from checkpoint BASE to checkpoint NEW into DIR; the index's
        metadata.version / base_version are V and B, or the identities (then
        `hotload publish --checkpoint DIR --identity ID` finds PREV by itself)
        → {"path", "tensors", "tensors_changed", "bytes_total", "bytes_changed",
           "payload_bytes", "ratio", "shards", "empty", "seconds"}
    cwtrain snapshot apply BASE DELTA --out DIR [--base-version B]
        apply a delta to checkpoint BASE, verify every Adler-32, write the new weights
        as a FULL snapshot with checksums → {"path", "version", "base_version",
        "tensors_changed", "tensors_verified", "bytes_changed", "seconds"}
    cwtrain snapshot verify DIR [--base BASE]
        FULL: check every Adler-32 in the shards; delta: check its structure and every
        frame, and with --base every Adler-32 of the applied result
        → {"path", "type", "tensors", "verified", "unchecked", "result": "ok"}

Progress goes to stderr (on a terminal, or with ``--progress``; else one final line); a
failed check exits 1 with ``error: <what and where>``. ``hotload publish --checkpoint NEW
--base BASE --previous-identity PREV`` publishes the same delta without writing it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cwtrain.cli.options import positive_int, usage_error
from cwtrain.cli.output import emit
from cwtrain.progress import ByteProgress

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``snapshot`` group to the CLI."""
    group = subparsers.add_parser("snapshot", help="diff, apply and verify snapshots locally")
    commands = group.add_subparsers(dest="command", metavar="<command>")
    commands.required = True

    diff = commands.add_parser(
        "diff",
        help="write the XOR delta between two checkpoints",
        description=(
            "Write the XOR delta from checkpoint BASE to checkpoint NEW into --out. The delta's index records "
            "metadata.version (what the delta makes) and metadata.base_version (what it applies to): give them "
            "as --version/--base-version, or give the snapshot identities (--identity/--previous-identity) and "
            "they are used as both. 'hotload publish' and 'hotload inspect' take a delta's predecessor from "
            "base_version (all digits N -> weight_vNNNNNN, the slime/miles convention; anything else as is), so "
            "with identities the delta publishes without --previous-identity; the uploaded index always gets "
            "version = the identity it is published under and base_version = its predecessor. To publish without "
            "writing the delta: hotload publish --checkpoint NEW --base BASE --previous-identity PREV."
        ),
    )
    diff.add_argument("base", help="the checkpoint directory the delta applies to")
    diff.add_argument("new", help="the new checkpoint directory")
    diff.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    version = diff.add_mutually_exclusive_group()
    version.add_argument("--version", help="index metadata.version of the delta (e.g. 000007)")
    version.add_argument("--identity", help="the identity NEW will be published under: sets metadata.version")
    base_version = diff.add_mutually_exclusive_group()
    base_version.add_argument("--base-version", help="index metadata.base_version of the delta (e.g. 000006)")
    base_version.add_argument("--previous-identity", help="the identity BASE is served as: sets metadata.base_version")
    diff.add_argument("--workers", type=positive_int, default=None, help="threads (default: CPUs)")
    diff.add_argument("--progress", action="store_true", help="draw progress on stderr even when it is not a terminal")
    diff.set_defaults(func=_diff)

    apply = commands.add_parser("apply", help="apply a delta to a checkpoint and write the verified result")
    apply.add_argument("base", help="the checkpoint directory the delta was made against")
    apply.add_argument("delta", help="the delta directory")
    apply.add_argument("--out", required=True, help="output directory for the new FULL snapshot")
    apply.add_argument("--base-version", default=None, help="refuse a delta whose base_version differs")
    apply.add_argument("--workers", type=positive_int, default=None, help="threads (default: CPUs)")
    apply.set_defaults(func=_apply)

    verify = commands.add_parser("verify", help="check every checksum of a snapshot directory")
    verify.add_argument("dir", help="a FULL or delta snapshot directory")
    verify.add_argument("--base", default=None, help="for a delta: the checkpoint it applies to")
    verify.add_argument("--workers", type=positive_int, default=None, help="threads (default: CPUs)")
    verify.set_defaults(func=_verify)


def _diff(args: argparse.Namespace) -> int:
    from cwtrain.hotload.delta import open_checkpoint, write_delta
    from cwtrain.hotload.identity import validate_identity

    version = args.version if args.version is not None else args.identity
    base_version = args.base_version if args.base_version is not None else args.previous_identity
    if version is None or base_version is None:
        missing = [
            o
            for o, v in (("--version or --identity", version), ("--base-version or --previous-identity", base_version))
            if v is None
        ]
        return usage_error(f"snapshot diff needs {' and '.join(missing)}")
    if args.identity is not None:
        validate_identity(args.identity)
    if args.previous_identity is not None:
        validate_identity(
            args.previous_identity, what="previous identity", allow_reserved=args.previous_identity == "initial"
        )
    with open_checkpoint(args.new) as ckpt:
        total = sum(t.nbytes for t in ckpt.tensors.values())
    progress = ByteProgress("diff", total, live=True if args.progress else None)
    stats = write_delta(
        args.base,
        args.new,
        args.out,
        version=version,
        base_version=base_version,
        workers=args.workers,
        on_progress=progress.add,
    )
    progress.close()
    emit(stats.to_json())
    return 0


def _apply(args: argparse.Namespace) -> int:
    from cwtrain.hotload.decode import read_snapshot_dir
    from cwtrain.hotload.format import index_metadata
    from cwtrain.hotload.mirror import WeightMirror

    start = time.perf_counter()
    delta_version = index_metadata(read_snapshot_dir(args.delta).index).get("base_version")
    version = args.base_version if args.base_version is not None else str(delta_version or "0")
    mirror = WeightMirror.create(args.base, None, version=version, workers=args.workers)
    report = mirror.apply_delta(args.delta)
    out = mirror.write_full_snapshot(args.out)
    emit(
        {
            "path": str(out),
            "version": report.version,
            "base_version": report.base_version,
            "tensors_changed": report.tensors_changed,
            "tensors_verified": report.tensors_verified,
            "bytes_changed": report.bytes_changed,
            "seconds": round(time.perf_counter() - start, 3),
        }
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    import zstandard

    from cwtrain.errors import SnapshotError
    from cwtrain.hotload.decode import (
        as_uint8,
        decode_frame,
        load_full,
        load_full_dir,
        read_snapshot_dir,
        verify_delta,
        zstd_frame_size,
    )
    from cwtrain.hotload.format import is_delta_index
    from cwtrain.hotload.inspect import inspect_snapshot
    from cwtrain.hotload.safetensors import header_of_bytes

    snap = read_snapshot_dir(args.dir)
    if not is_delta_index(snap.index):
        tensors = load_full(snap.index, snap.shards, workers=args.workers, source=str(snap.path))
        unchecked = 0
        for shard in dict.fromkeys(snap.index["weight_map"].values()):
            header = header_of_bytes(snap.shards[shard], source=shard)
            unchecked += sum(1 for name in header.tensors if name not in (header.metadata or {}))
        emit(_verified(args.dir, "FULL", len(tensors), len(tensors) - unchecked, unchecked))
        return 0
    inspect_snapshot(args.dir, previous_identity="unchecked", allow_empty_delta=True)
    names = list(snap.index["weight_map"])
    if args.base is not None:
        verify_delta(
            load_full_dir(args.base, workers=args.workers),
            snap.index,
            snap.shards,
            workers=args.workers,
            source=str(snap.path),
        )
        emit(_verified(args.dir, "INCREMENTAL", len(names), len(names), 0))
        return 0
    for name, shard in snap.index["weight_map"].items():
        header = header_of_bytes(snap.shards[shard], source=shard)
        entry = header.tensors[name]
        payload = as_uint8(snap.shards[shard])[header.data_start + entry.begin : header.data_start + entry.end]
        where = f"{snap.path / shard}: tensor {name!r}"
        try:
            if zstd_frame_size(payload) != payload.size:
                raise ValueError("bytes after the zstd frame")
            size = zstandard.frame_content_size(memoryview(payload))
            if size < 0:
                raise ValueError("frame has no content size")
            decode_frame(payload, size)
        except ValueError as exc:
            raise SnapshotError(f"{where}: {exc}") from None
    emit(_verified(args.dir, "INCREMENTAL", len(names), 0, len(names)))
    return 0


def _verified(path: str, kind: str, tensors: int, verified: int, unchecked: int) -> dict[str, Any]:
    return {
        "path": path,
        "type": kind,
        "tensors": tensors,
        "verified": verified,
        "unchecked": unchecked,
        "result": "ok",
    }

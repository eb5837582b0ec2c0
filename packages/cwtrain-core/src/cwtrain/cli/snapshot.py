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

All three stream: memory stays within ``CWTRAIN_HOTLOAD_MEMORY_BUDGET`` (default 1 GiB)
plus a small constant, whatever the checkpoint size or what a frame declares; files
are read with ``pread``, never memory-mapped. Progress goes to stderr (on a terminal, or
with ``--progress``; else one final line); a failed check exits 1 with ``error: <what
and where>``. ``verify`` says ``ok`` only when it checked at least one Adler-32: a FULL
snapshot without checksums, a delta without ``--base`` and an empty delta print
``"result": "unverified"`` and exit 1 with the reason. ``hotload publish --checkpoint NEW
--base BASE --previous-identity PREV`` publishes the same delta without writing it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cwtrain.cli.options import positive_int, usage_error
from cwtrain.cli.output import emit
from cwtrain.errors import SnapshotError
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
    from cwtrain.hotload.files.write import write_delta
    from cwtrain.hotload.format.identity import validate_identity

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
    progress = ByteProgress("diff", 0, live=True if args.progress else None)

    def total(nbytes: int) -> None:  # known once both checkpoints are open
        progress.total = nbytes

    stats = write_delta(
        args.base,
        args.new,
        args.out,
        version=version,
        base_version=base_version,
        workers=args.workers,
        on_progress=progress.add,
        on_total=total,
    )
    progress.close()
    emit(stats.to_json())
    return 0


def _apply(args: argparse.Namespace) -> int:
    from cwtrain.hotload.files.write import write_applied_snapshot

    start = time.perf_counter()
    applied = write_applied_snapshot(
        args.base, args.delta, args.out, base_version=args.base_version, workers=args.workers
    )
    base_version = args.base_version if args.base_version is not None else (applied.base_version or "0")
    emit(
        {
            "path": str(applied.path),
            "version": applied.version if applied.version is not None else base_version,
            "base_version": base_version,
            "tensors_changed": len(applied.changed),
            "tensors_verified": len(applied.changed),
            "bytes_changed": applied.bytes_changed,
            "seconds": round(time.perf_counter() - start, 3),
        }
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cwtrain.hotload.files.checkpoint import verify_snapshot_dir
    from cwtrain.hotload.files.validate import inspect_snapshot
    from cwtrain.hotload.format.index import INDEX_NAME, is_delta_index, read_index_file

    index = Path(args.dir) / INDEX_NAME
    if index.is_file() and is_delta_index(read_index_file(index)):  # its structure, as `hotload inspect` checks it
        inspect_snapshot(args.dir, previous_identity="unchecked", allow_empty_delta=True)
    report = verify_snapshot_dir(args.dir, base=args.base, workers=args.workers)
    ok = report.verified > 0
    emit(
        {
            "path": args.dir,
            "type": report.type,
            "tensors": report.tensors,
            "verified": report.verified,
            "unchecked": report.unchecked,
            "result": "ok" if ok else "unverified",
        }
    )
    if ok:
        return 0
    if report.tensors == 0:
        why = "it holds no tensor (an empty delta)"
    elif report.type == "INCREMENTAL":
        why = "its frames decode, but a delta's Adler-32s are of the applied result: pass --base CHECKPOINT"
    else:
        why = "its shards carry no Adler-32 in __metadata__ (write a copy with checksums: cwtrain snapshot apply, or a FULL cut)"
    raise SnapshotError(f"{args.dir}: verified no tensor: {why}")

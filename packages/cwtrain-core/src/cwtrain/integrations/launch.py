"""``python -m cwtrain.integrations.launch``: the command line of the recipe launchers.

``stage-model`` copies a model from object storage to local disk before training (the
trainer reads ``--hf-checkpoint`` from disk)::

    python -m cwtrain.integrations.launch stage-model s3://models/qwen3-4b /work/hf/base --workers 16

It copies the objects directly under the prefix (not deeper) into ``DEST`` through
``DEST.partial``, renamed when complete, so an interrupted copy never looks finished.
When ``DEST/config.json`` exists nothing is copied. On success it prints ``DEST`` on
stdout (exit 0); no objects under the prefix, or no ``config.json`` among them, is an
error (stderr ``error: <reason>``, exit 1); a bad command line exits 2. The object-store
store comes from :func:`cwtrain.infra.s3.object_store` (``CW_S3_ENDPOINT``, ``AWS_*``).

The launchers' Python helpers live beside this module, each in the module that owns it:
:func:`cwtrain.integrations.staging.stage_from_s3` (the copy above),
:mod:`cwtrain.integrations.envforward` (variables handed to Ray workers, secret
redaction) and :func:`cwtrain.integrations.patches.apply_patches` (a recipe's patches,
applied once).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from cwtrain.errors import CWTrainError
from cwtrain.integrations.staging import stage_from_s3

__all__ = ["main"]

_DESCRIPTION = "Helpers of the recipe launchers, and ``python -m cwtrain.integrations.launch stage-model``."


def _stage_model(args: argparse.Namespace) -> int:
    try:
        stage_from_s3(args.uri, args.dest, workers=args.workers)
    except CWTrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # object-store and credential errors: one line, no traceback
        print(f"error: copying {args.uri} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(str(Path(args.dest)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cwtrain.integrations.launch <command>``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m cwtrain.integrations.launch", description=_DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    stage = commands.add_parser("stage-model", help="copy a model from object storage to a local directory")
    stage.add_argument("uri", help="s3://<bucket>/<prefix>")
    stage.add_argument("dest", help="local directory")
    stage.add_argument("--workers", type=int, default=16, help="objects downloaded in parallel (16)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.command == "stage-model":
        if args.workers < 1:
            parser.error(f"--workers {args.workers} must be at least 1")
        return _stage_model(args)
    return 2  # pragma: no cover - argparse refuses unknown commands


if __name__ == "__main__":
    sys.exit(main())

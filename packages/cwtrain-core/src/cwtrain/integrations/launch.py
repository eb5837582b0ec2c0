"""Helpers of the recipe launchers, and ``python -m cwtrain.integrations.launch stage-model``.

``stage-model`` copies a model from object storage to local disk before training (the
trainer reads ``--hf-checkpoint`` from disk)::

    python -m cwtrain.integrations.launch stage-model s3://models/qwen3-4b /work/hf/base --workers 16

It copies the objects directly under the prefix (not deeper) into ``DEST`` through
``DEST.partial``, renamed when complete, so an interrupted copy never looks finished.
When ``DEST/config.json`` exists nothing is copied. No objects under the prefix, or no
``config.json`` among them, is an error (stderr ``error: <reason>``, exit 1). The
object store comes from :func:`cwtrain.infra.s3.object_store` (``CW_S3_ENDPOINT``,
``AWS_*``).

The other helpers:

* :func:`stage_from_s3` - the copy above, as a function.
* :func:`forwarded_env` - the variables a launcher passes to Ray workers (``CWTRAIN_*``,
  ``COREWEAVE_*``, ``CW_*``, ``AWS_*``, ``HF_*``), never on a command line.
* :func:`is_secret_env_var` - whether a variable's value must never be printed.
* :func:`redacted_env` - an environment safe to log.
* :func:`apply_patches` - apply a recipe's patches to a framework checkout once (a patch
  already applied is skipped; one that does not apply is an error naming it).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from cwtrain.config import VARIABLES
from cwtrain.errors import CWTrainError

if TYPE_CHECKING:
    from cwtrain.infra.objectstore import ObjectStore
    from cwtrain.infra.s3 import ObjectStoreLike

__all__ = [
    "FORWARDED_PREFIXES",
    "apply_patches",
    "forwarded_env",
    "is_secret_env_var",
    "main",
    "parse_s3_uri",
    "redacted_env",
    "stage_from_s3",
]

log = logging.getLogger("cwtrain.integrations.launch")

FORWARDED_PREFIXES = ("CWTRAIN_", "COREWEAVE_", "CW_", "AWS_", "HF_")
_SECRET_WORDS = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE|AUTH)", re.I)
_CONFIG = "config.json"


def is_secret_env_var(name: str) -> bool:
    """Whether the value of variable ``name`` is a secret (never logged, printed or put on a command line).

    Declared cwtrain variables say so themselves (``COREWEAVE_API_TOKEN``, ``CWTRAIN_API_HEADERS``,
    ...); any other name is judged by words such as TOKEN, SECRET, PASSWORD, KEY or CREDENTIAL.
    """
    declared = VARIABLES.get(name)
    if declared is not None and declared.secret:
        return True
    if name == "AWS_ACCESS_KEY_ID":
        return True
    return bool(_SECRET_WORDS.search(name))


def forwarded_env(environ: Mapping[str, str] | None = None, *, extra: Sequence[str] = ()) -> dict[str, str]:
    """The variables a launcher hands to Ray workers: every ``CWTRAIN_*``, ``COREWEAVE_*``,
    ``CW_*``, ``AWS_*`` and ``HF_*`` variable that is set, plus the names in ``extra``.

    Pass the result through Ray's ``runtime_env={"env_vars": ...}`` (or the job's
    environment), never on a command line, where secrets would be visible to every process.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if (k.startswith(FORWARDED_PREFIXES) or k in extra) and v != ""}


def redacted_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with every secret value replaced by ``***`` (for logs)."""
    return {k: ("***" if is_secret_env_var(k) else v) for k, v in environ.items()}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → ``(bucket, "prefix/")`` (the prefix empty or ending in ``/``).

    Raises:
        CWTrainError: not an ``s3://`` URI with a bucket.
    """
    if not uri.startswith("s3://"):
        raise CWTrainError(f"{uri!r} is not an s3:// URI (expected s3://<bucket>/<prefix>)")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise CWTrainError(f"{uri!r} names no bucket (expected s3://<bucket>/<prefix>)")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/") if prefix else ""


def _list_direct(s3: ObjectStore, bucket: str, prefix: str) -> list[tuple[str, int]]:
    """Objects directly under ``prefix`` (not in deeper "folders"): ``(key, size)``."""
    return [(o.key, o.size) for o in s3.list_objects(bucket, prefix, delimiter="/") if o.key != prefix]


def stage_from_s3(
    uri: str, dest: str | os.PathLike[str], *, workers: int = 16, s3: ObjectStoreLike | None = None
) -> Path:
    """Copy the objects directly under ``uri`` into ``dest`` (see the module docstring).

    Args:
        uri: ``s3://<bucket>/<prefix>``.
        dest: the local directory; left alone when ``dest/config.json`` exists.
        workers: objects downloaded in parallel.
        s3: the object store, or a boto3 client (default :func:`cwtrain.infra.s3.object_store`).

    Returns:
        ``dest``.

    Raises:
        CWTrainError: no objects under the prefix, or no ``config.json`` among them.
    """
    target = Path(dest)
    if (target / _CONFIG).is_file():
        log.info("%s already holds a model (%s exists); nothing to copy", target, _CONFIG)
        return target
    if workers < 1:
        raise CWTrainError(f"--workers {workers} must be at least 1")
    bucket, prefix = parse_s3_uri(uri)
    from cwtrain.infra.s3 import as_object_store

    store = as_object_store(s3)
    objects = _list_direct(store, bucket, prefix)
    if not objects:
        raise CWTrainError(f"no objects directly under s3://{bucket}/{prefix}: check the URI and the credentials")
    names = {key[len(prefix) :]: key for key, _ in objects}
    if _CONFIG not in names:
        raise CWTrainError(f"s3://{bucket}/{prefix} has no {_CONFIG}: it does not look like a HuggingFace model")
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    total = sum(size for _, size in objects)
    log.info("copying %d objects (%d bytes) from s3://%s/%s to %s", len(objects), total, bucket, prefix, target)

    def fetch(item: tuple[str, str]) -> None:
        name, key = item
        path = partial / name
        tmp = path.with_name(path.name + ".tmp")
        store.download(bucket, key, tmp)
        os.replace(tmp, path)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cwtrain-stage") as pool:
        list(pool.map(fetch, sorted(names.items())))
    if target.exists():
        shutil.rmtree(target)
    os.replace(partial, target)
    return target


def apply_patches(checkout: str | os.PathLike[str], patches: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Apply each patch to a git checkout once; returns the names of the patches applied now.

    A patch whose reverse applies cleanly is already in and skipped; a patch that applies
    neither way raises, naming it and the checkout.

    Raises:
        CWTrainError: a patch does not apply, or ``checkout`` is not a git checkout.
    """
    root = Path(checkout)
    if not (root / ".git").exists():
        raise CWTrainError(f"{root} is not a git checkout: clone the framework first")
    applied: list[str] = []
    for patch in patches:
        path = Path(patch).resolve()
        if not path.is_file():
            raise CWTrainError(f"patch {path} does not exist")

        def git(*args: str, patch_path: Path = path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["git", "-C", str(root), "apply", *args, str(patch_path)], capture_output=True, text=True, check=False
            )

        if git("--check").returncode == 0:
            result = git()
            if result.returncode != 0:
                raise CWTrainError(f"applying {path.name} to {root} failed: {result.stderr.strip()}")
            applied.append(path.name)
        elif git("--reverse", "--check").returncode == 0:
            log.info("%s is already applied to %s", path.name, root)
        else:
            detail = git("--check").stderr.strip().splitlines()
            raise CWTrainError(
                f"{path.name} does not apply to {root} ({detail[0] if detail else 'no detail'}): "
                "the checkout is not the version the patch was written for"
            )
    return applied


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
    parser = argparse.ArgumentParser(prog="python -m cwtrain.integrations.launch", description=__doc__.split("\n")[0])
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

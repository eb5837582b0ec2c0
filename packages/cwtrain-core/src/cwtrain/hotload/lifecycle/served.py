"""The served-identity file: ``<state_dir>/served_identity``, what the fleet serves, for the run's other processes.

Whoever publishes weights (the cycle's records, :mod:`cwtrain.hotload.lifecycle.cycle`)
writes the identity now served to ``<state_dir>/served_identity`` (identity + ``\\n``,
replaced atomically); rollout functions, the prompt-cache salt
(:mod:`cwtrain.integrations.nvext`, which re-exports these names) and the Gym model server
read it, and learn the publisher's run and version from it (:func:`recorded_run_id`,
:func:`recorded_version`)::

    write_served_identity(state_dir, "run1-v000007")
    read_served_identity(state_dir)            # "run1-v000007"
    recorded_version(state_dir, "run1")         # 7
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from cwtrain.hotload.format.identity import identity_version, split_version_identity

__all__ = [
    "SERVED_IDENTITY_FILE",
    "read_served_identity",
    "recorded_run_id",
    "record_served_identity",
    "recorded_version",
    "write_served_identity",
]

log = logging.getLogger(__name__)

SERVED_IDENTITY_FILE = "served_identity"


def write_served_identity(state_dir: str | os.PathLike[str], identity: str) -> Path:
    """Atomically write ``identity`` + ``\\n`` to ``<state_dir>/served_identity``.

    Returns:
        the file's path.
    """
    if not identity or "\n" in identity:
        raise ValueError(f"not a snapshot identity: {identity!r}")
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / SERVED_IDENTITY_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{SERVED_IDENTITY_FILE}.", dir=root)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(identity + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def record_served_identity(state_dir: str | os.PathLike[str], identity: str) -> None:
    """:func:`write_served_identity` for a publisher: informational, so a failure to write only warns."""
    try:
        write_served_identity(state_dir, identity)
    except OSError as exc:
        log.warning("could not record the served identity in %s: %s", state_dir, exc)


def read_served_identity(state_dir: str | os.PathLike[str] | None) -> str | None:
    """The identity in ``<state_dir>/served_identity``, or ``None`` when there is none."""
    if state_dir is None:
        return None
    try:
        text = (Path(state_dir) / SERVED_IDENTITY_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def recorded_run_id(state_dir: str | os.PathLike[str] | None) -> str | None:
    """The run of the identity in ``<state_dir>/served_identity`` (the publisher's run id).

    ``None`` when there is no such file, it cannot be read, or its identity names no version.
    """
    try:
        parts = split_version_identity(read_served_identity(state_dir))
    except OSError:
        return None
    return parts[0] if parts is not None else None


def recorded_version(state_dir: str | os.PathLike[str] | None, run_id: str) -> int | None:
    """The version of ``run_id`` in ``<state_dir>/served_identity``; ``None`` for another run's
    identity, no file, or one that cannot be read."""
    try:
        return identity_version(read_served_identity(state_dir), run_id)
    except OSError:
        return None

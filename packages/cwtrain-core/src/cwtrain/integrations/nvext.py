"""Prompt-cache salts and the served-identity file (``nvext`` request extensions).

The engine's prompt (KV) cache survives a hot-load unless the hot-load resets it. Salting
each request with the identity that serves it keeps cache entries of one weight version
from being reused under another::

    from cwtrain.integrations.nvext import served_salt, with_nvext

    body = with_nvext({"model": "m", "prompt": [1, 2, 3]}, cache_salt=served_salt(state_dir))

A salt is 1–128 characters without ``@``, ``/``, ``\\`` or NUL; anything else is replaced
by its SHA-256 hex (:func:`as_cache_salt`). Whoever publishes weights writes the identity
now served to ``<state_dir>/served_identity`` (identity + ``\\n``, replaced atomically;
:mod:`cwtrain.hotload.lifecycle.served` owns the file, re-exported here); readers learn the
publisher's run and version from it (:func:`recorded_run_id`, :func:`recorded_version`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cwtrain.errors import RolloutError
from cwtrain.hotload.lifecycle.served import (
    SERVED_IDENTITY_FILE,
    read_served_identity,
    recorded_run_id,
    recorded_version,
    write_served_identity,
)

__all__ = [
    "SERVED_IDENTITY_FILE",
    "as_cache_salt",
    "read_served_identity",
    "recorded_run_id",
    "recorded_version",
    "require_served_salt",
    "rollout_cache_salt",
    "served_salt",
    "with_nvext",
    "write_served_identity",
]

_FORBIDDEN = frozenset("@/\\\x00")


def as_cache_salt(value: str) -> str:
    """``value`` when it is a valid ``nvext.cache_salt``, else its SHA-256 hex digest."""
    if 1 <= len(value) <= 128 and not (_FORBIDDEN & set(value)):
        return value
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def rollout_cache_salt(identity: str | None) -> str | None:
    """The cache salt for rollouts served by ``identity`` (``None`` when it is unknown)."""
    if not identity:
        return None
    return as_cache_salt(identity)


def served_salt(state_dir: str | os.PathLike[str] | None) -> str | None:
    """The cache salt of the identity now served (see :func:`read_served_identity`), or ``None``."""
    return rollout_cache_salt(read_served_identity(state_dir))


def require_served_salt(state_dir: str | os.PathLike[str] | None) -> str:
    """Like :func:`served_salt`, but fail closed.

    Raises:
        RolloutError: no served identity has been written yet.
    """
    salt = served_salt(state_dir)
    if salt is None:
        where = "no state directory" if state_dir is None else str(Path(state_dir) / SERVED_IDENTITY_FILE)
        raise RolloutError(
            f"no served snapshot identity ({where}); publish the baseline first so the prompt cache can be "
            "salted with the identity that serves it (or set CWTRAIN_HOTLOAD_STATE_DIR to the publisher's directory)"
        )
    return salt


def with_nvext(
    body: Mapping[str, Any],
    *,
    cache_salt: str | None = None,
    extra_fields: Iterable[str] = (),
) -> dict[str, Any]:
    """A copy of a completions request body with ``nvext`` fields merged in.

    Args:
        body: the request body; an existing ``nvext`` object is kept and extended.
        cache_salt: sent as ``nvext.cache_salt`` (through :func:`as_cache_salt`).
        extra_fields: names added to ``nvext.extra_fields`` (e.g. ``"routed_experts"``).
    """
    out = dict(body)
    nvext = dict(out.get("nvext") or {})
    if cache_salt:
        nvext["cache_salt"] = as_cache_salt(cache_salt)
    extra = [*nvext.get("extra_fields", ())]
    for name in extra_fields:
        if name not in extra:
            extra.append(name)
    if extra:
        nvext["extra_fields"] = extra
    if nvext:
        out["nvext"] = nvext
    return out

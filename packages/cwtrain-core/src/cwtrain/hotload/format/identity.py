"""Snapshot identities and where their objects live (snapshot-format.md sections 1 and 2).

::

    validate_identity("run1-v000003")          # 1-128 printable chars, one path segment, not reserved
    version_identity("run1", 3)                # "run1-v000003"
    identity_version("run1-v000003", "run1")   # 3 (None for another run's identity, or "initial")
    split_version_identity("run1-v000003")     # ("run1", 3)
    identity_for_base_version("000006")        # "weight_v000006" (a delta index's base_version)
    snapshot_prefix("hotload", "run1-v000003") # "hotload/run1-v000003"
"""

from __future__ import annotations

import re
import unicodedata

from cwtrain.errors import SnapshotError

__all__ = [
    "RESERVED_IDENTITIES",
    "identity_for_base_version",
    "identity_version",
    "same_version",
    "split_version_identity",
    "snapshot_prefix",
    "validate_identity",
    "version_identity",
]

RESERVED_IDENTITIES = frozenset({"initial", "_manifests", "_preflight"})
#: Unicode categories an identity may not hold: control, format (bidi overrides, zero-width
#: characters), surrogate and private-use characters, line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})


def validate_identity(identity: str, *, what: str = "identity", allow_reserved: bool = False) -> str:
    """Check a snapshot identity (section 2) and return it.

    1-128 characters, one path segment (no ``/``, not ``.`` or ``..``), no character
    that can hide or reorder what a log or a listing shows (control and format
    characters such as bidi overrides and zero-width spaces, surrogates, private-use
    characters, line and paragraph separators), and not one of the reserved names
    (``initial``, ``_manifests``, ``_preflight``) unless ``allow_reserved``.

    Raises:
        SnapshotError: the identity is invalid, with the rule it breaks.
    """
    if not isinstance(identity, str) or not 1 <= len(identity) <= 128:
        raise SnapshotError(f"invalid {what} {identity!r}: must be 1-128 characters")
    if "/" in identity or identity in (".", ".."):
        raise SnapshotError(f"invalid {what} {identity!r}: must be one path segment (no '/', not '.' or '..')")
    bad = next((c for c in identity if unicodedata.category(c) in _REFUSED_CATEGORIES), None)
    if bad is not None:
        raise SnapshotError(
            f"invalid {what} {identity!r}: holds U+{ord(bad):04X} ({unicodedata.category(bad)}, a control, format "
            "or separator character that hides or reorders text); use printable characters"
        )
    if not allow_reserved and identity in RESERVED_IDENTITIES:
        raise SnapshotError(f"invalid {what} {identity!r}: reserved name; choose another identity")
    return identity


def version_identity(run_id: str, version: int) -> str:
    """``<run_id>-v{version:06d}`` (six digits or more)."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return f"{run_id}-v{version:06d}"


_VERSION_SUFFIX = re.compile(r"-v([0-9]{6,})$")


def split_version_identity(identity: str | None) -> tuple[str, int] | None:
    """``(run_id, N)`` of an identity :func:`version_identity` made, else ``None``.

    The run id is everything before the last ``-v`` followed by six or more ASCII digits
    ending the identity; it is never empty.
    """
    if not identity:
        return None
    match = _VERSION_SUFFIX.search(identity)
    if match is None or match.start() == 0:
        return None
    return identity[: match.start()], int(match.group(1))


def identity_version(identity: str | None, run_id: str) -> int | None:
    """The inverse of :func:`version_identity` for one run.

    ``N`` for ``<run_id>-v{N:06d}``; ``None`` for another run's identity, ``initial``, or an
    identity that names no version. Every reader of served identities (the rollout
    sampler, the plug-ins, NeMo Gym's model server) asks this, so a sample served by another
    run's weights is never taken for one of this run's versions.
    """
    parts = split_version_identity(identity)
    if parts is None or parts[0] != run_id:
        return None
    return parts[1]


def same_version(a: str, b: str) -> bool:
    """Whether two version labels of a delta index name the same version.

    Equal, or both ASCII digits of the same number (``"6"`` and ``"000006"``).
    """
    return a == b or (a.isascii() and b.isascii() and a.isdigit() and b.isdigit() and int(a) == int(b))


def identity_for_base_version(base_version: str | None) -> str:
    """Default predecessor identity of a delta from its index ``base_version`` (section 2).

    All digits → ``weight_v{int:06d}``; another value is used as is.

    Raises:
        SnapshotError: ``base_version`` is absent (pass ``--previous-identity``).
    """
    if base_version is None or base_version == "":
        raise SnapshotError(
            "the delta index has no metadata.base_version; pass --previous-identity to name its predecessor"
        )
    text = str(base_version)
    if text.isdigit() and text.isascii():
        return f"weight_v{int(text):06d}"
    return text


def snapshot_prefix(path_prefix: str, identity: str) -> str:
    """The object-key prefix of a snapshot: ``P/<identity>``, or ``<identity>`` when ``P`` is empty."""
    prefix = (path_prefix or "").strip("/")
    return f"{prefix}/{identity}" if prefix else identity

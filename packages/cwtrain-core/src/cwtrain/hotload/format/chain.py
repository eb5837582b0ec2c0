"""Chain rules: when to cut a chain with a FULL snapshot, and what a new hot-load applies on.

The cadence (snapshot-format.md section 10), one object per publisher::

    cadence = ChainCadence.from_env()          # CWTRAIN_HOTLOAD_FULL_EVERY, default 20, 0-64
    if cadence.is_full(version):               # nothing served yet, a failed publish, N % F == 0,
        ...                                    # or one more delta would pass 63
    cadence.published(full=True)               # after the hot-load of that version completed
    cadence.failed()                           # the replicas keep what they served: next is FULL

Every publisher (the slime and miles hook, slime's live-tensor actor, the NeMo-RL
synchronizer, the demo) asks this object; none of them writes the rule again.

A delta is applied on top of its predecessor, which may itself be a delta: the resolved
chain runs back to the last FULL snapshot. A replica starting cold replays the whole
chain from object storage and handles at most
:data:`MAX_CHAIN_DELTAS` (63) deltas, so a delta that would make
the chain longer is refused before anything is uploaded (publish FULL instead).

``deltas_after`` counts from the deployment's hot-load listing: the predecessor's newest
COMPLETED (else unfinished) hot-load gives its ``snapshotChain`` when the service resolved
one, else the walk follows ``previousSnapshotIdentity`` links back to a FULL snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cwtrain.config import env_int
from cwtrain.errors import ConfigError, SnapshotError
from cwtrain.infra.enums import HotLoadState, SnapshotType
from cwtrain.infra.models import HotLoad

__all__ = [
    "DEFAULT_FULL_EVERY",
    "MAX_CHAIN_DELTAS",
    "MAX_FULL_EVERY",
    "ChainCadence",
    "check_delta_allowed",
    "check_full_every",
    "deltas_after",
    "full_every_from_env",
    "resolve_type",
]

log = logging.getLogger(__name__)

#: A cold replica replays at most this many deltas after the chain's FULL root.
MAX_CHAIN_DELTAS = 63
DEFAULT_FULL_EVERY = 20
MAX_FULL_EVERY = 64


def full_every_from_env(environ: Mapping[str, str] | None = None, default: int = DEFAULT_FULL_EVERY) -> int:
    """``CWTRAIN_HOTLOAD_FULL_EVERY``: 0-64, default 20.

    Raises:
        ConfigError: not an integer in 0..64.
    """
    return env_int("CWTRAIN_HOTLOAD_FULL_EVERY", default, environ, minimum=0, maximum=MAX_FULL_EVERY)


def check_full_every(full_every: int) -> int:
    """Validate a cadence value given explicitly.

    Raises:
        ConfigError: not an integer in 0..64.
    """
    if isinstance(full_every, bool) or not isinstance(full_every, int) or not 0 <= full_every <= MAX_FULL_EVERY:
        raise ConfigError(f"full_every={full_every!r} must be an integer in 0..{MAX_FULL_EVERY}")
    return full_every


@dataclass
class ChainCadence:
    """When a version must be published FULL (snapshot-format.md section 10).

    A version is FULL when nothing was published yet, after a failed publish (the
    replicas keep what they served, which the next delta would not apply to), when
    ``full_every > 0`` and ``version % full_every == 0``, and in any case when one more
    delta would make the chain longer than :data:`MAX_CHAIN_DELTAS`.

    Attributes:
        full_every: FULL every this many versions (0 = never by count; warns once).
        deltas_in_chain: deltas published since the chain's FULL root.
        force_full: the next version must be FULL (nothing published yet, or a failure).
    """

    full_every: int = DEFAULT_FULL_EVERY
    deltas_in_chain: int = 0
    force_full: bool = True

    def __post_init__(self) -> None:
        check_full_every(self.full_every)
        if self.full_every == 0:
            log.warning(
                "CWTRAIN_HOTLOAD_FULL_EVERY=0: chains are never cut by count; a replica starting cold replays "
                "at most %d deltas (the API accepts 128), so a FULL snapshot is still due before a chain passes it",
                MAX_CHAIN_DELTAS,
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChainCadence:
        """Cadence from ``CWTRAIN_HOTLOAD_FULL_EVERY``."""
        return cls(full_every_from_env(environ))

    def is_full(self, version: int) -> bool:
        """Whether ``version`` must be published FULL."""
        if self.force_full or (self.full_every > 0 and version % self.full_every == 0):
            return True
        return self.deltas_in_chain + 1 > MAX_CHAIN_DELTAS

    def published(self, *, full: bool) -> None:
        """Record a published snapshot (FULL resets the chain, a delta lengthens it)."""
        self.deltas_in_chain = 0 if full else self.deltas_in_chain + 1
        self.force_full = False

    def failed(self) -> None:
        """Record a failed publish: the next version is FULL."""
        self.force_full = True


def deltas_after(hot_loads: Iterable[HotLoad], previous_identity: str) -> int | None:
    """Deltas after the last FULL snapshot if one more delta is applied on ``previous_identity``.

    Args:
        hot_loads: the deployment's hot-loads, newest first.
        previous_identity: the predecessor of the new delta.

    Returns:
        The count (1 for a delta straight on a FULL snapshot), or ``None`` when the
        predecessor's chain cannot be resolved from ``hot_loads``.
    """
    by_identity: dict[str, HotLoad] = {}
    for hot_load in hot_loads:
        if hot_load.state in (HotLoadState.FAILED, HotLoadState.CANCELED):
            continue
        known = by_identity.get(hot_load.identity)
        if known is None or (known.state is not HotLoadState.COMPLETED and hot_load.state is HotLoadState.COMPLETED):
            by_identity[hot_load.identity] = hot_load
    count, current = 1, previous_identity
    for _ in range(4 * MAX_CHAIN_DELTAS):
        link = by_identity.get(current)
        if link is None:
            return None
        if link.snapshot_chain:
            return count + link.deltas_in_chain()
        if link.type is SnapshotType.FULL:
            return count
        previous = link.previous_identity
        if not previous:
            return None
        count, current = count + 1, previous
    return count


def check_delta_allowed(identity: str, previous_identity: str, deltas: int | None) -> None:
    """Refuse a delta whose chain would pass the cold-start limit.

    Raises:
        SnapshotError: ``deltas`` is above :data:`MAX_CHAIN_DELTAS`; publish FULL.
    """
    if deltas is None:
        log.debug("chain of %r not resolvable from the listing; not counting deltas", previous_identity)
        return
    if deltas > MAX_CHAIN_DELTAS:
        raise SnapshotError(
            f"delta {identity!r} on {previous_identity!r} would make the snapshot chain {deltas} deltas long; "
            f"a replica starting cold replays at most {MAX_CHAIN_DELTAS}: publish {identity!r} as a FULL snapshot"
        )


def _info_type(info: Any) -> SnapshotType:
    return SnapshotType.parse(getattr(info, "type", None) if not isinstance(info, Mapping) else info.get("type"))


def _info_previous(info: Any) -> str | None:
    value = getattr(info, "previous_identity", None)
    return str(value) if value else None


def resolve_type(
    info: Any, previous_identity: str | None, snapshot_type: SnapshotType | None
) -> tuple[SnapshotType, str | None]:
    """The hot-load type and predecessor from ``info`` or the explicit arguments.

    From ``info`` (a ``SnapshotInfo``) when given; else ``snapshot_type``; else
    INCREMENTAL iff ``previous_identity``.

    Raises:
        SnapshotError: ``previous_identity`` together with ``info`` or with FULL, or
            INCREMENTAL without a predecessor.
    """
    if info is not None:
        if previous_identity is not None:
            raise SnapshotError(
                "pass previous_identity to inspect_snapshot, not together with its SnapshotInfo (it already names one)"
            )
        kind = _info_type(info)
        previous = _info_previous(info)
        if kind is SnapshotType.INCREMENTAL and not previous:
            raise SnapshotError("the delta snapshot names no predecessor; pass --previous-identity")
        return kind, previous if kind is SnapshotType.INCREMENTAL else None
    kind = SnapshotType.parse(snapshot_type) if snapshot_type is not None else SnapshotType.UNSPECIFIED
    if kind is SnapshotType.UNSPECIFIED:
        kind = SnapshotType.INCREMENTAL if previous_identity else SnapshotType.FULL
    if kind is SnapshotType.FULL and previous_identity:
        raise SnapshotError(f"a FULL snapshot has no predecessor; drop previous_identity={previous_identity!r}")
    if kind is SnapshotType.INCREMENTAL and not previous_identity:
        raise SnapshotError("an INCREMENTAL snapshot needs previous_identity (the snapshot it applies on)")
    return kind, previous_identity

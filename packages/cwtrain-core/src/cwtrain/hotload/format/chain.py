"""Chain rules: how long a chain may grow, and what a new hot-load applies on (snapshot-format.md §10).

A delta is applied on top of its predecessor, which may itself be a delta: the resolved
chain runs back to the last FULL snapshot. A replica starting cold replays the whole
chain from object storage and handles at most :data:`MAX_CHAIN_DELTAS` (63) deltas, so a
delta that would make the chain longer is refused before anything is uploaded (publish
FULL instead). When a publisher cuts its chain is :mod:`cwtrain.hotload.lifecycle.cadence`.

``deltas_after`` counts from the deployment's hot-load listing: the predecessor's newest
COMPLETED (else unfinished) hot-load gives its ``snapshotChain`` when the service resolved
one, else the walk follows ``previousSnapshotIdentity`` links back to a FULL snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from cwtrain.errors import SnapshotError
from cwtrain.infra.enums import HotLoadState, SnapshotType
from cwtrain.infra.models import HotLoad

__all__ = ["MAX_CHAIN_DELTAS", "check_delta_allowed", "deltas_after", "resolve_type"]

log = logging.getLogger(__name__)

#: A cold replica replays at most this many deltas after the chain's FULL root.
MAX_CHAIN_DELTAS = 63


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

"""Which snapshots a replica applies for a resolved chain (no I/O)."""

from __future__ import annotations

import pytest

from cwtrain.errors import SnapshotError
from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS
from cwtrain.local.engine.snapshots import ChainLink, plan_chain


def _chain(*types: str) -> list[ChainLink]:
    return [ChainLink(f"v{i}", t) for i, t in enumerate(types)]


def test_served_identity_in_chain_applies_only_later_deltas() -> None:
    chain = _chain("FULL", "INCREMENTAL", "INCREMENTAL", "INCREMENTAL")
    assert plan_chain("v1", chain) == (None, chain[2:])
    assert plan_chain("v3", chain) == (None, [])


def test_cold_or_foreign_identity_replays_from_the_full_root() -> None:
    chain = _chain("FULL", "INCREMENTAL", "INCREMENTAL")
    assert plan_chain("initial", chain) == (chain[0], chain[1:])
    assert plan_chain(None, chain) == (chain[0], chain[1:])


def test_identity_before_a_later_full_reloads_that_full() -> None:
    chain = _chain("FULL", "INCREMENTAL", "FULL", "INCREMENTAL")
    assert plan_chain("v1", chain) == (chain[2], chain[3:])
    assert plan_chain("v2", chain) == (None, chain[3:])


def test_replay_limit_and_malformed_chains() -> None:
    ok = _chain("FULL", *["INCREMENTAL"] * MAX_CHAIN_DELTAS)
    assert plan_chain("initial", ok)[1] == ok[1:]
    with pytest.raises(SnapshotError, match="at most 63"):
        plan_chain("initial", _chain("FULL", *["INCREMENTAL"] * (MAX_CHAIN_DELTAS + 1)))
    with pytest.raises(SnapshotError, match="not a FULL"):
        plan_chain("initial", _chain("INCREMENTAL"))
    with pytest.raises(SnapshotError, match="empty"):
        plan_chain("initial", [])

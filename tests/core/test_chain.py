"""Chain rules: the FULL cadence every publisher asks (snapshot-format.md section 10)."""

from __future__ import annotations

import logging

import pytest

from cwtrain.errors import ConfigError
from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS
from cwtrain.hotload.publish.cadence import ChainCadence
from cwtrain.hotload.settings import HotLoadSettings


def _kinds(cadence: ChainCadence, versions: range) -> list[bool]:
    kinds = []
    for version in versions:
        full = cadence.is_full(version)
        kinds.append(full)
        cadence.published(full=full)
    return kinds


def test_first_version_is_full_then_every_n() -> None:
    cadence = ChainCadence(full_every=3)
    assert cadence.is_full(7)  # nothing published yet
    cadence.published(full=True)  # the baseline
    assert _kinds(cadence, range(1, 10)) == [False, False, True, False, False, True, False, False, True]


def test_a_failed_publish_makes_the_next_version_full() -> None:
    cadence = ChainCadence(full_every=20)
    cadence.published(full=True)
    assert not cadence.is_full(1)
    cadence.published(full=False)
    cadence.failed()
    assert cadence.is_full(2)
    cadence.published(full=True)
    assert not cadence.is_full(3) and cadence.deltas_in_chain == 0


def test_never_by_count_still_cuts_before_63_deltas(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        never = ChainCadence(full_every=0)
    assert "never cut" in caplog.text and str(MAX_CHAIN_DELTAS) in caplog.text
    never.published(full=True)
    kinds = _kinds(never, range(1, 130))
    assert kinds.index(True) == MAX_CHAIN_DELTAS and kinds.count(True) == 2


def test_cut_at_64_with_the_largest_cadence() -> None:
    cadence = ChainCadence(full_every=64, deltas_in_chain=MAX_CHAIN_DELTAS - 1, force_full=False)
    assert not cadence.is_full(63)
    cadence.published(full=False)
    assert cadence.is_full(65)  # a 64th delta would pass the cold-start limit


def test_full_every_from_env_and_range() -> None:
    def full_every(env: dict[str, str]) -> int:
        return HotLoadSettings.from_env({"CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "d", **env}, default_run_id="r").full_every

    assert full_every({}) == 20
    assert full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": "0"}) == 0
    assert full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": "64"}) == 64
    for bad in ("65", "-1", "x"):
        with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_FULL_EVERY"):
            full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": bad})
    for value in (-1, 65, True):
        with pytest.raises(ConfigError):
            ChainCadence(full_every=value)

"""Chain rules: the FULL cadence every publisher asks (snapshot-format.md section 10)."""

from __future__ import annotations

import logging

import pytest

from cwtrain.errors import ConfigError
from cwtrain.hotload.format.chain import MAX_CHAIN_DELTAS
from cwtrain.hotload.lifecycle.cadence import ChainCadence, CutReason
from cwtrain.hotload.lifecycle.settings import HotLoadSettings


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
    def full_every(env: dict[str, str]) -> int | str:
        return HotLoadSettings.from_env({"CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "d", **env}, default_run_id="r").full_every

    assert full_every({}) == "auto"
    assert full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": " Auto "}) == "auto"
    assert full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": "0"}) == 0
    assert full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": "20"}) == 20
    assert full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": "64"}) == 64
    for bad in ("65", "-1", "x", "automatic"):
        with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_FULL_EVERY"):
            full_every({"CWTRAIN_HOTLOAD_FULL_EVERY": bad})
    for value in (-1, 65, True, "sometimes"):
        with pytest.raises(ConfigError):
            ChainCadence(full_every=value)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ auto: the cost rules (issue 25)


def _auto(**kwargs: float) -> ChainCadence:
    cadence = ChainCadence("auto", **kwargs)  # type: ignore[arg-type]
    cadence.published(full=True, snapshot_bytes=1000)  # the baseline: a FULL of 1000 bytes
    return cadence


def test_auto_cuts_a_delta_of_at_least_the_share_of_a_full() -> None:
    cadence = _auto()
    assert cadence.reason(1) is CutReason.NONE and cadence.delta_limit() == 900
    assert cadence.cost_reason(899) is CutReason.NONE
    assert cadence.cost_reason(900) is CutReason.SHARE  # 90 % of the FULL: FULL costs the same upload
    assert ChainCadence("auto", full_share=0.5, full_bytes=1000, force_full=False).cost_reason(500) is CutReason.SHARE


def test_auto_cuts_when_the_chain_would_pass_the_replay_budget() -> None:
    cadence = _auto()
    for _ in range(3):
        assert cadence.cost_reason(600) is CutReason.NONE
        cadence.published(full=False, snapshot_bytes=600)
    assert cadence.chain_bytes == 1800 and cadence.replay_bytes == 2800
    assert cadence.delta_limit() == 201  # 1800 + 200 = 2000 is the budget itself: still a delta
    assert cadence.cost_reason(200) is CutReason.NONE
    assert cadence.cost_reason(201) is CutReason.REPLAY  # a cold start would read more than three FULLs
    assert cadence.cost_reason(950) is CutReason.SHARE  # both: the share is named first
    cadence.published(full=True, snapshot_bytes=1100)
    assert (cadence.chain_bytes, cadence.replay_bytes, cadence.delta_limit()) == (0, 1100, 990)


def test_auto_cuts_by_count_after_19_deltas_and_fixed_counts_by_version() -> None:
    cadence = _auto()
    reasons = []
    for version in range(1, 41):
        reason = cadence.reason(version)
        reasons.append(reason)
        cadence.published(full=reason is not CutReason.NONE, snapshot_bytes=1000 if reason else 10)
    assert [v for v, r in enumerate(reasons, 1) if r] == [20, 40]  # as FULL_EVERY=20, on a sparse run
    assert set(reasons) == {CutReason.NONE, CutReason.COUNT}
    fixed = ChainCadence(7, force_full=False)
    assert fixed.reason(14) is CutReason.COUNT and fixed.reason(15) is CutReason.NONE
    assert fixed.delta_limit() is None and fixed.cost_reason(10**9) is CutReason.NONE  # no cost rule


def test_the_63_delta_limit_holds_in_every_mode() -> None:
    never = ChainCadence(0, deltas_in_chain=MAX_CHAIN_DELTAS, force_full=False)
    assert never.reason(1000) is CutReason.CHAIN_LIMIT
    assert ChainCadence(64, deltas_in_chain=MAX_CHAIN_DELTAS - 1, force_full=False).reason(63) is CutReason.NONE


def test_first_and_after_failure_reasons_and_no_cost_rule_without_a_full_size() -> None:
    cadence = ChainCadence("auto")
    assert cadence.reason(5) is CutReason.FIRST
    cadence.published(full=True)  # a FULL of unknown size: the cost rules wait for one that is known
    assert cadence.delta_limit() is None and cadence.cost_reason(10**9) is CutReason.NONE
    cadence.failed()
    assert cadence.reason(6) is CutReason.FAILED
    cadence.published(full=True, snapshot_bytes=10)
    assert cadence.reason(7) is CutReason.NONE and cadence.delta_limit() == 9
    assert [reason.label for reason in CutReason] == [
        "none", "first", "requested", "failed", "count", "chain_limit", "share", "replay",
    ]  # fmt: skip


@pytest.mark.parametrize(("share", "budget"), [(0.0, 2.0), (1.5, 2.0), (0.9, 0.0), (0.9, float("inf"))])
def test_the_cost_settings_are_checked(share: float, budget: float) -> None:
    with pytest.raises(ConfigError):
        ChainCadence("auto", full_share=share, replay_budget=budget)
    with pytest.raises(ConfigError):
        HotLoadSettings("d", "r", full_share=share, replay_budget=budget)

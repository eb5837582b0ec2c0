"""API enums: wire names and lenient parsing (service-api.md section 4)."""

from __future__ import annotations

import logging

import pytest

from cwtrain.infra.enums import (
    ChecksumFormat,
    CompressionFormat,
    ConditionStatus,
    HotLoadState,
    PromptCachePolicy,
    ReplicaState,
    ResourceStatus,
    SnapshotType,
    TransitionMode,
)


@pytest.mark.parametrize(
    ("member", "wire"),
    [
        (ResourceStatus.READY, "STATUS_READY"),
        (HotLoadState.IN_PROGRESS, "HOT_LOAD_STATE_IN_PROGRESS"),
        (SnapshotType.INCREMENTAL, "SNAPSHOT_TYPE_INCREMENTAL"),
        (CompressionFormat.ZSTD, "COMPRESSION_FORMAT_ZSTD"),
        (ChecksumFormat.ADLER32, "CHECKSUM_FORMAT_ADLER32"),
        (PromptCachePolicy.RESET_ALL, "PROMPT_CACHE_POLICY_RESET_ALL"),
        (TransitionMode.ASYNC, "TRANSITION_MODE_ASYNC"),
        (ReplicaState.PENDING_UPDATE, "PENDING_UPDATE"),
        (ConditionStatus.TRUE, "STATUS_TRUE"),
    ],
)
def test_wire_names(member: object, wire: str) -> None:
    assert member.wire == wire  # type: ignore[attr-defined]
    assert type(member).parse(wire) is member  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("STATUS_READY", ResourceStatus.READY),
        ("ready", ResourceStatus.READY),
        (" Ready ", ResourceStatus.READY),
        (6, ResourceStatus.READY),
        ("6", ResourceStatus.READY),
        (4, ResourceStatus.ERROR),
        ("STATUS_UPDATING", ResourceStatus.UPDATING),
        (None, ResourceStatus.UNSPECIFIED),
        ("", ResourceStatus.UNSPECIFIED),
    ],
)
def test_resource_status_parse(value: object, expected: ResourceStatus) -> None:
    assert ResourceStatus.parse(value) is expected


def test_replica_state_accepts_any_prefix() -> None:
    assert ReplicaState.parse("READY") is ReplicaState.READY
    assert ReplicaState.parse("REPLICA_STATE_READY") is ReplicaState.READY
    assert ReplicaState.parse("HOT_LOAD_REPLICA_STATE_PENDING_UPDATE") is ReplicaState.PENDING_UPDATE
    assert ReplicaState.parse("hot_load_replica_state_updating") is ReplicaState.UPDATING
    assert ReplicaState.parse(4) is ReplicaState.ERROR


def test_condition_status_forms() -> None:
    assert ConditionStatus.parse("True") is ConditionStatus.TRUE
    assert ConditionStatus.parse("STATUS_FALSE") is ConditionStatus.FALSE
    assert ConditionStatus.parse(3) is ConditionStatus.UNKNOWN


def test_unknown_values_become_unspecified_and_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cwtrain.infra.enums"):
        assert HotLoadState.parse("HOT_LOAD_STATE_EXPLODED") is HotLoadState.UNSPECIFIED
        assert HotLoadState.parse("HOT_LOAD_STATE_EXPLODED") is HotLoadState.UNSPECIFIED
        assert HotLoadState.parse(99) is HotLoadState.UNSPECIFIED
        assert HotLoadState.parse(True) is HotLoadState.UNSPECIFIED
    messages = [r.getMessage() for r in caplog.records]
    assert sum("EXPLODED" in m for m in messages) == 1
    assert any("99" in m for m in messages)


def test_terminal_states() -> None:
    terminal = {s for s in HotLoadState if s.terminal}
    assert terminal == {HotLoadState.COMPLETED, HotLoadState.FAILED, HotLoadState.CANCELED}


def test_str_is_bare_name() -> None:
    assert str(SnapshotType.FULL) == "FULL"

"""One step ahead (``PublishAhead``): in order, one at a time, the loop's wait measured, failures answered.

Against the in-memory API stand-in (``fakeapi``) and the session's moto S3 server, through the
real session: every version is encoded, uploaded and hot-loaded. A publish is slowed by
wrapping it (``_slow``) so that a test can tell the loop's wait from the publish's length.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from fakeapi import FakeAPI

from cwtrain.errors import HotLoadFailedError, UsageError
from cwtrain.hotload import PublishAhead
from cwtrain.hotload.lifecycle.session import PublishSession
from cwtrain.hotload.lifecycle.settings import HotLoadSettings
from cwtrain.hotload.lifecycle.target import Target
from cwtrain.hotload.lifecycle.version import PublishOutcome, VersionPlan

CONFIG = {"config.json": b'{"torch_dtype": "float32"}'}
#: How much longer than the loop's step a slowed publish lasts (seconds).
SLOW = 0.3


def _session(fake: FakeAPI, s3: Any, **settings: Any) -> tuple[PublishSession, list[tuple[PublishOutcome, str]]]:
    """A session whose sink records each outcome and the thread that heard it."""
    heard: list[tuple[PublishOutcome, str]] = []
    config = HotLoadSettings("dep-1", "run", full_every=0, **settings)
    sink = lambda outcome: heard.append((outcome, threading.current_thread().name))  # noqa: E731
    return PublishSession(config, target=Target(fake.client(), "dep-1", poll_interval=0.0, s3=s3), sink=sink), heard


def _weights(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    weights = {f"layer{i}.weight": rng.standard_normal((16, 8)).astype(np.float32) for i in range(3)}
    weights["layer0.weight"][0, :] += step  # one row moves per step
    return weights


def test_versions_publish_in_order_one_at_a_time_and_the_loop_waits_only_for_what_is_left(
    fake: FakeAPI, s3_bucket: tuple[Any, str]
) -> None:
    session, heard = _session(fake, s3_bucket[0])
    spans: dict[int, tuple[float, float]] = {}
    handed: list[tuple[str, int]] = []
    publish = session.publish_tensors

    def slow(plan: VersionPlan, tensors: Any, **options: Any) -> PublishOutcome:
        started = time.monotonic()
        time.sleep(SLOW)  # a hot-load that takes longer than the loop's step
        outcome = publish(plan, tensors, **options)
        spans[plan.version] = (started, time.monotonic())
        return outcome

    session.publish_tensors = slow  # type: ignore[method-assign]
    with PublishAhead(session, on_publishing=[lambda run, version: handed.append((run, version))]) as ahead:
        returned = []
        for step in range(4):
            weights = _weights(step)
            returned.append(ahead.publish_tensors(weights, extra_files=CONFIG))
            assert ahead.in_flight and ahead.tensors_in_flight is weights
            time.sleep(SLOW / 3)  # the loop trains meanwhile: a third of the publish
        last = ahead.finish()
    assert returned[0] is None and [o.version for o in returned[1:]] == [0, 1, 2] and last is not None
    assert handed == [("run", v) for v in range(4)]
    # one at a time, in order: each starts after the one before ended
    assert all(spans[v][0] >= spans[v - 1][1] for v in range(1, 4))
    outcomes = [o for o, _ in heard]
    assert [o.version for o in outcomes] == [0, 1, 2, 3] and [o.kind for o in outcomes] == [
        "FULL",
        "INCREMENTAL",
        "INCREMENTAL",
        "INCREMENTAL",
    ]
    # the sink hears each version on the loop's thread, once the loop waited for it
    assert {name for _, name in heard} == {threading.current_thread().name}
    for outcome in outcomes[:3]:  # waited for the rest of the publish after a third of it trained
        assert 0.3 * SLOW < outcome.trainer_wait_seconds < outcome.publish_seconds + SLOW
        assert outcome.metrics()["hotload/trainer_wait_seconds"] == outcome.trainer_wait_seconds
    assert outcomes[3].trainer_wait_seconds > 0.5 * SLOW  # finish() waited for all of the last one


def test_a_publish_shorter_than_the_step_costs_the_loop_nearly_nothing(
    fake: FakeAPI, s3_bucket: tuple[Any, str]
) -> None:
    session, heard = _session(fake, s3_bucket[0])
    with PublishAhead(session) as ahead:
        for step in range(3):
            ahead.publish_tensors(_weights(step), extra_files=CONFIG)
            deadline = time.monotonic() + 10
            while ahead.in_flight and time.monotonic() < deadline:  # the loop trains longer than a publish
                time.sleep(0.01)
    outcomes = [o for o, _ in heard]
    assert [o.version for o in outcomes] == [0, 1, 2] and outcomes[1].incremental
    assert all(o.trainer_wait_seconds < 0.05 for o in outcomes)


def test_a_synchronous_publish_reports_its_whole_length_as_the_loops_wait(
    fake: FakeAPI, s3_bucket: tuple[Any, str]
) -> None:
    session, heard = _session(fake, s3_bucket[0])
    session.publish_tensors(session.begin(), _weights(0), extra_files=CONFIG)
    outcome = heard[-1][0]
    assert outcome.trainer_wait_seconds == outcome.publish_seconds > 0


def test_a_failed_hot_load_ahead_is_answered_as_in_sync_mode_and_an_error_is_raised_by_the_next_hand_over(
    fake: FakeAPI, s3_bucket: tuple[Any, str]
) -> None:
    session, _ = _session(fake, s3_bucket[0])
    burned: list[tuple[str, int]] = []
    session.on_burned.append(lambda run, version: burned.append((run, version)))
    fake.fail_identities.add("run-v000001")
    with PublishAhead(session) as ahead:
        ahead.publish_tensors(_weights(0), extra_files=CONFIG)
        ahead.publish_tensors(_weights(1), extra_files=CONFIG)  # fails; the fleet is brought back to v0
        failed = ahead.publish_tensors(_weights(2), extra_files=CONFIG)
        assert failed is not None and failed.failed and failed.reactivated and failed.served_version == 0
        assert burned == [("run", 1)]
        after = ahead.finish()
    assert after is not None and after.version == 2 and after.kind == "FULL"  # the chain is cut after a failure
    assert session.served_identity == "run-v000002"

    stopping, heard_stop = _session(fake, s3_bucket[0], on_failure="stop")  # the run goes on, stopping on failure
    fake.fail_identities.add("run-v000004")
    ahead = PublishAhead(stopping)
    ahead.publish_tensors(_weights(3), version=3, extra_files=CONFIG)
    ahead.publish_tensors(_weights(4), extra_files=CONFIG)
    with pytest.raises(HotLoadFailedError):
        ahead.publish_tensors(_weights(5), extra_files=CONFIG)  # v4's error, raised here; v5 not handed over
    assert heard_stop[-1][0].version == 4 and heard_stop[-1][0].failed  # the sink heard it first
    assert not ahead.in_flight
    ahead.close()
    with pytest.raises(UsageError, match="closed"):
        ahead.publish_tensors(_weights(6))
    assert stopping.sink is not None and stopping.sink is not ahead._heard  # the session's sink is given back


def test_a_refused_plan_still_reports_the_version_that_ended(fake: FakeAPI, s3_bucket: tuple[Any, str]) -> None:
    session, heard = _session(fake, s3_bucket[0])
    with PublishAhead(session) as ahead:
        ahead.publish_tensors(_weights(0), version=3, extra_files=CONFIG)
        with pytest.raises(UsageError, match="versions must increase"):
            ahead.publish_tensors(_weights(1), version=2, extra_files=CONFIG)
        assert [o.version for o, _ in heard] == [3] and heard[0][0].completed and not ahead.in_flight

"""Samples fenced by version: staleness, other runs' identities, versions newer than published or
burned, mixed groups (two identities, or some answers naming none), and the batch's counters.

Scripted endpoints (``httpx.MockTransport``) answer with the identity a test chooses per
request (``None``: the answer names none); the end-to-end case (an identity swapped in the
middle of a batch on the local stack) is ``tests/e2e/test_rollout_swap.py``. The tests
marked ``fault_row("fence-two-sided")`` are that row of docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from rollout_fake import FakeEndpoint

from cwtrain.errors import UsageError
from cwtrain.integrations.rollout import (
    CompletionSampler,
    RolloutConfig,
    RolloutError,
    SamplingParams,
    fill_group,
    merge_batches,
    note_burned,
    note_published,
    run_sync,
    shared_sampler,
    version_tag,
)

PARAMS = SamplingParams(max_tokens=3)


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


class Serving:
    """A fake fleet: answers with ``identity()`` (thread-safe; ``None``: no identity), counting requests."""

    def __init__(self, identities: Callable[[dict[str, Any]], str | None]) -> None:
        self.fake = FakeEndpoint(length=3)
        self.identities = identities
        self.lock = threading.Lock()
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self.lock:
            self.requests += 1
            self.fake.identity = self.identities(body)
            payload = self.fake.answer(body)
        return httpx.Response(200, json=payload)


def make(
    serving: Serving, sleeps: Sleeps | None = None, run_id: str | None = "run", **fields: Any
) -> CompletionSampler:
    config = RolloutConfig("http://fake.test/v1", "tiny", **fields)
    return CompletionSampler(
        config, transport=httpx.MockTransport(serving), sleep=sleeps or Sleeps(), seed=3, run_id=run_id
    )


def _fleet(*identities: str) -> Callable[[dict[str, Any]], str]:
    """Round-robin over the identities (one per replica)."""
    turn = itertools.cycle(identities)
    return lambda body: next(turn)


def test_versions_are_this_runs_only_and_the_counters_report_what_was_served() -> None:
    serving = Serving(_fleet("run-v000004", "run-v000005", "other-v000005", "initial"))
    with make(serving) as sampler:  # no limit: everything returned, as before
        sampler.note_published(5)
        batch = sampler.sample_groups_sync([[1, 2], [3, 4], [5, 6], [7, 8]], 2, PARAMS)
    by_identity = {g[0].identity: g for g in batch}
    assert [c.version for c in by_identity["run-v000004"]] == [4, 4]
    assert [c.version for c in by_identity["run-v000005"]] == [5, 5]
    assert [c.version for c in by_identity["other-v000005"]] == [None, None]  # another run's is no version
    assert [c.version for c in by_identity["initial"]] == [None, None]
    assert batch.versions == {4: 2, 5: 2} and batch.published_version == 5
    m = batch.metrics
    assert (m["coreweave/served_version_min"], m["coreweave/served_version_max"]) == (4.0, 5.0)
    assert m["coreweave/served_version_samples/4"] == 2.0 and m["coreweave/served_version_samples/5"] == 2.0
    assert m["coreweave/served_versions"] == 2.0 and m["coreweave/staleness_max"] == 1.0
    assert m["coreweave/samples_without_version"] == 4.0
    assert m["coreweave/stale_rerequested"] == 0.0 and m["coreweave/mixed_groups_resampled"] == 0.0
    assert serving.requests == 4


def test_merged_batches_count_what_every_batch_held() -> None:
    serving = Serving(_fleet("run-v000004", "other-v000001", "run-v000005"))
    with make(serving) as sampler:
        first = sampler.sample_groups_sync([[1, 2], [3, 4]], 2, PARAMS)
        sampler.note_published(6)
        second = sampler.sample_groups_sync([[5, 6]], 3, SamplingParams(max_tokens=2))
    merged = merge_batches([first, second])
    assert merged.groups == [*first.groups, *second.groups]
    assert merged.identities == ("run-v000004", "other-v000001", "run-v000005")
    assert merged.versions == {4: 2, 5: 3} and merged.published_version == 6
    m = merged.metrics
    assert m["coreweave/served_version_min"] == 4.0 and m["coreweave/served_version_max"] == 5.0
    assert m["coreweave/served_version_samples/4"] == 2.0 and m["coreweave/served_version_samples/5"] == 3.0
    assert m["coreweave/served_versions"] == 2.0 and m["coreweave/staleness_max"] == 2.0  # from 6, the newest
    assert m["coreweave/samples_without_version"] == 2.0  # the other run's group, from the first batch
    assert m["coreweave/samples"] == second.metrics["coreweave/samples"] == 3.0  # the rest: the last batch's
    assert merge_batches([first]).metrics == first.metrics
    with make(serving, run_id=None) as unknown:  # no run: nothing counted as unversioned
        alone = merge_batches([unknown.sample_groups_sync([[1, 2]], 1, PARAMS)])
    assert "coreweave/samples_without_version" not in alone.metrics and alone.versions == {}


def test_with_a_limit_stale_and_foreign_completions_are_re_requested() -> None:
    answers = iter(["run-v000003", "other-v000009", "initial", "run-v000004", "run-v000005"])
    serving = Serving(lambda body: next(answers, "run-v000005"))
    sleeps = Sleeps()
    with make(serving, sleeps, max_staleness=1) as sampler:
        sampler.note_published(5)
        batch = sampler.sample_groups_sync([[1, 2]], 4, PARAMS)
    (group,) = batch.groups
    assert {c.identity for c in group} == {"run-v000004"}  # 1 behind: within the limit
    assert batch.metrics["coreweave/stale_rerequested"] == 12.0  # three answers of 4 completions refused
    assert serving.requests == 4 and len(sleeps.calls) == 3  # backed off between the re-requests
    assert sleeps.calls[0] < sleeps.calls[-1]


def test_a_limit_of_zero_waits_for_the_newest_and_gives_up_within_the_budget() -> None:
    serving = Serving(lambda body: "run-v000006")
    with make(serving, max_staleness=0, max_attempts=3) as sampler:
        sampler.note_published(7)
        with pytest.raises(RolloutError) as refused:
            sampler.sample_groups_sync([[1, 2]], 2, PARAMS)
    assert "'run-v000006', 1 versions behind the newest published 'run-v000007'" in str(refused.value)
    assert "CWTRAIN_ROLLOUT_MAX_STALENESS=0" in str(refused.value) and "3 times" in str(refused.value)
    assert serving.requests == 3


def test_without_a_run_or_a_published_version_nothing_is_fenced() -> None:
    serving = Serving(_fleet("a-v000001", "b-v000009"))
    with make(serving, run_id=None, max_staleness=0) as sampler:
        batch = sampler.sample_groups_sync([[1], [2]], 2, PARAMS)
        assert batch.versions == {} and "coreweave/samples_without_version" not in batch.metrics
        assert all(c.version is None for g in batch for c in g)
        sampler.set_run("a")  # a run, but nothing published yet: versions, no fence
        batch = sampler.sample_groups_sync([[1], [2]], 2, PARAMS)
        assert batch.versions == {1: 2} and batch.metrics["coreweave/stale_rerequested"] == 0.0


def test_a_split_group_is_never_returned_mixed_even_without_a_limit() -> None:
    # two replicas on two identities; the second round answers from one identity only
    calls = itertools.count()
    serving = Serving(lambda body: "run-v000002" if next(calls) < 4 and body["seed"] % 2 else "run-v000003")
    with make(serving) as sampler:
        batch = sampler.sample_groups_sync([[1, 2]], 4, PARAMS, split=True)
    (group,) = batch.groups
    assert len({c.identity for c in group}) == 1 and len(group) == 4
    assert [c.index for c in group] == [0, 1, 2, 3]
    assert batch.metrics["coreweave/mixed_groups_resampled"] >= 1.0
    assert serving.requests >= 8


def test_a_fleet_that_stays_mixed_fails_the_batch_naming_the_identities() -> None:
    serving = Serving(lambda body: "run-v000002" if body["seed"] % 2 else "run-v000003")
    with make(serving, max_attempts=2) as sampler, pytest.raises(RolloutError) as refused:
        sampler.sample_groups_sync([[1, 2]], 8, PARAMS, split=True)
    assert "run-v000002, run-v000003" in str(refused.value) and "2 times" in str(refused.value)


def test_groups_that_went_stale_during_the_batch_are_re_sampled_at_its_end() -> None:
    sampler_box: list[CompletionSampler] = []
    served = {"identity": "run-v000001"}

    def identities(body: dict[str, Any]) -> str:
        identity = served["identity"]
        if body["prompt"] == [9, 9]:  # the last group: the trainer publishes v2 and the fleet swaps
            sampler_box[0].note_published(2)
            served["identity"] = "run-v000002"
        return identity

    serving = Serving(identities)
    with make(serving, max_staleness=0, concurrency=1) as sampler:
        sampler_box.append(sampler)
        sampler.note_published(1)
        batch = sampler.sample_groups_sync([[1, 2], [3, 4], [9, 9]], 2, PARAMS)
    assert {c.identity for g in batch for c in g} == {"run-v000002"}
    assert batch.versions == {2: 6} and batch.published_version == 2
    assert batch.metrics["coreweave/stale_rerequested"] == 6.0  # all three groups, two completions each


def _split_half_unnamed(rounds: int, named: str = "run-v000002") -> Callable[[dict[str, Any]], str | None]:
    """The first ``rounds`` × 4 answers alternate between no identity and ``named``; then ``named`` only."""
    calls = itertools.count()
    return lambda body: None if (k := next(calls)) < 4 * rounds and k % 2 == 0 else named


@pytest.mark.faults
@pytest.mark.fault_row("fence-two-sided")
def test_a_version_above_the_newest_published_is_re_requested_not_kept() -> None:
    # the filed case: limit 0, v5 the newest published, the fleet answers from v6 (refused and
    # re-activated away, or not announced yet) before it is back on v5
    answers = iter(["run-v000006", "run-v000006"])
    serving = Serving(lambda body: next(answers, "run-v000005"))
    sleeps = Sleeps()
    with make(serving, sleeps, max_staleness=0) as sampler:
        sampler.note_published(5)
        batch = sampler.sample_groups_sync([[1, 2]], 2, PARAMS)
    (group,) = batch.groups
    assert [c.identity for c in group] == ["run-v000005"] * 2 and [c.version for c in group] == [5, 5]
    assert batch.versions == {5: 2} and batch.published_version == 5
    m = batch.metrics
    assert m["coreweave/unpublished_rerequested"] == 4.0  # two answers of 2 completions refused
    assert m["coreweave/stale_rerequested"] == 0.0 and m["coreweave/served_version_max"] == 5.0
    assert m["coreweave/staleness_max"] == 0.0
    assert serving.requests == 3 and len(sleeps.calls) == 2  # backed off, like a stale re-request
    merged = merge_batches([batch, batch]).metrics
    assert merged["coreweave/unpublished_rerequested"] == 8.0 and merged["coreweave/stale_rerequested"] == 0.0


def test_a_newer_version_the_deployment_confirms_is_kept_and_a_burned_one_is_not() -> None:
    # slime's rollout learns the newest version at its start; a hot-load completing meanwhile
    # is confirmed by asking the deployment again (once a second at most), not refused
    serving = Serving(lambda body: "run-v000006")
    asked: list[int] = []

    def lookup() -> int:
        asked.append(6)
        return 6

    with make(serving, max_staleness=0) as sampler:
        sampler.note_published(5)
        sampler.look_up_published(lookup)
        batch = sampler.sample_groups_sync([[1, 2], [3, 4]], 2, PARAMS)
        assert sampler.published_version == 6 and len(asked) == 1  # two groups, one look-up
    assert batch.versions == {6: 4} and batch.metrics["coreweave/unpublished_rerequested"] == 0.0
    assert serving.requests == 2

    # the deployment serves the burned version no more than it says; a look-up never clears a burn
    answers = iter(["run-v000006", "run-v000006"])
    serving = Serving(lambda body: next(answers, "run-v000005"))
    with make(serving, Sleeps(), max_staleness=0) as sampler:
        sampler.note_published(5)
        sampler.note_burned(6)
        sampler.look_up_published(lambda: 5)
        batch = sampler.sample_groups_sync([[1, 2]], 2, PARAMS)
    assert batch.versions == {5: 2} and batch.metrics["coreweave/unpublished_rerequested"] == 4.0


@pytest.mark.faults
@pytest.mark.fault_row("fence-two-sided")
def test_a_burned_version_is_re_requested_even_within_the_limit() -> None:
    # v4 burned, then v5 published: a sample from v4 is one behind (within the limit of 2) but
    # the trainer never published it as served; v3, two behind, is kept
    answers = iter(["run-v000004"])
    serving = Serving(lambda body: next(answers, "run-v000003"))
    with make(serving, max_staleness=2) as sampler:
        sampler.note_published(3)
        sampler.note_burned(4)
        sampler.note_published(5)
        assert sampler.burned_versions == {4} and sampler.published_version == 5
        batch = sampler.sample_groups_sync([[1, 2]], 3, PARAMS)
    assert {c.identity for c in batch[0]} == {"run-v000003"} and batch.versions == {3: 3}
    assert batch.metrics["coreweave/unpublished_rerequested"] == 3.0
    assert batch.metrics["coreweave/stale_rerequested"] == 0.0 and serving.requests == 2


@pytest.mark.faults
@pytest.mark.fault_row("fence-two-sided")
@pytest.mark.parametrize(
    ("served", "said"),
    [
        ("run-v000008", "'run-v000008', newer than the newest published 'run-v000007'"),
        ("run-v000006", "'run-v000006', a burned version"),
    ],
)
def test_a_fleet_that_stays_on_an_unpublished_version_fails_within_the_budget(served: str, said: str) -> None:
    serving = Serving(lambda body: served)
    with make(serving, max_staleness=1, max_attempts=3) as sampler:
        sampler.note_burned(6)
        sampler.note_published(7)
        with pytest.raises(RolloutError) as refused:
            sampler.sample_groups_sync([[1, 2]], 2, PARAMS)
    assert said in str(refused.value) and "3 times" in str(refused.value)
    assert "did not publish as served" in str(refused.value) and "MAX_STALENESS" not in str(refused.value)
    assert serving.requests == 3  # the re-request budget, never an endless loop


@pytest.mark.faults
@pytest.mark.fault_row("fence-two-sided")
def test_groups_whose_version_was_burned_during_the_batch_are_re_sampled_at_its_end() -> None:
    sampler_box: list[CompletionSampler] = []
    served = {"identity": "run-v000002"}

    def identities(body: dict[str, Any]) -> str:
        identity = served["identity"]
        if body["prompt"] == [9, 9]:  # the last group: v2's hot-load is refused and the fleet moves to v3
            sampler_box[0].note_burned(2)
            served["identity"] = "run-v000003"
        return identity

    serving = Serving(identities)
    with make(serving, max_staleness=1, concurrency=1) as sampler:
        sampler_box.append(sampler)
        sampler.note_published(1)
        sampler.note_published(3)  # a path told only the newest: v2 was within the limit
        batch = sampler.sample_groups_sync([[1, 2], [3, 4], [9, 9]], 2, PARAMS)
    assert {c.identity for g in batch for c in g} == {"run-v000003"} and batch.versions == {3: 6}
    assert batch.metrics["coreweave/unpublished_rerequested"] == 6.0  # all three groups, two completions each
    assert batch.metrics["coreweave/stale_rerequested"] == 0.0


@pytest.mark.faults
@pytest.mark.fault_row("fence-two-sided")
def test_a_split_group_with_answers_naming_no_identity_is_mixed_and_one_naming_none_is_kept() -> None:
    serving = Serving(_split_half_unnamed(rounds=1))
    with make(serving, max_staleness=0) as sampler:
        sampler.note_published(2)
        batch = sampler.sample_groups_sync([[1, 2]], 4, PARAMS, split=True)
        (group,) = batch.groups
        assert [c.identity for c in group] == ["run-v000002"] * 4 and [c.index for c in group] == [0, 1, 2, 3]
        assert batch.metrics["coreweave/mixed_groups_resampled"] == 1.0 and serving.requests == 8
        assert batch.metrics["coreweave/samples_without_version"] == 0.0
        # no answer names an identity: it cannot be fenced; counted, kept, asked once
        serving.identities = lambda body: None
        unnamed = sampler.sample_groups_sync([[1, 2]], 4, PARAMS, split=True)
    assert [c.identity for c in unnamed[0]] == [None] * 4 and serving.requests == 12
    m = unnamed.metrics
    assert m["coreweave/samples_without_version"] == 4.0 and m["coreweave/mixed_groups_resampled"] == 0.0
    assert m["coreweave/stale_rerequested"] == m["coreweave/unpublished_rerequested"] == 0.0


@pytest.mark.faults
@pytest.mark.fault_row("fence-two-sided")
def test_a_fleet_that_stays_half_unnamed_fails_the_batch_within_the_budget() -> None:
    serving = Serving(_split_half_unnamed(rounds=10))
    with make(serving, max_attempts=2) as sampler, pytest.raises(RolloutError) as refused:
        sampler.sample_groups_sync([[1, 2]], 4, PARAMS, split=True)
    assert "run-v000002 and answers that named no identity 2 times" in str(refused.value)
    assert serving.requests == 8


def test_note_burned_is_kept_for_the_run_and_a_new_run_starts_over() -> None:
    with make(Serving(lambda body: "x"), run_id=None) as sampler:
        with pytest.raises(UsageError, match="run id"):
            sampler.note_burned(1)
        sampler.note_burned(2, run_id="r1")
        sampler.note_published(3)
        sampler.note_burned(4)
        assert (sampler.run_id, sampler.published_version, sampler.burned_versions) == ("r1", 3, {2, 4})
        sampler.note_burned(1, run_id="r2")  # another run: its newest version is not known yet
        assert (sampler.run_id, sampler.published_version, sampler.burned_versions) == ("r2", None, {1})
        sampler.set_run("r3")
        assert sampler.burned_versions == frozenset()
        with pytest.raises(UsageError, match="integer >= 0"):
            sampler.note_burned(True)


def test_a_version_burned_after_it_was_announced_stops_being_the_newest() -> None:
    # a framework's canary refused v5 after its publish; the fleet is back on v4
    serving = Serving(lambda body: "run-v000004")
    with make(serving, max_staleness=0) as sampler:
        sampler.note_published(4)
        sampler.note_published(5)
        sampler.note_burned(5)
        assert sampler.published_version == 4
        sampler.note_published(4)  # the session's followers announce the version brought back
        batch = sampler.sample_groups_sync([[1, 2]], 2, PARAMS)
        sampler.note_published(5)  # a burned version is never the newest again
        assert sampler.published_version == 4
    assert batch.versions == {4: 2} and batch.metrics["coreweave/stale_rerequested"] == 0.0


def test_note_published_keeps_the_newest_and_a_new_run_starts_over() -> None:
    with make(Serving(lambda body: "x"), run_id=None) as sampler:
        with pytest.raises(UsageError, match="run id"):
            sampler.note_published(1)
        sampler.note_published(3, run_id="r1")
        sampler.note_published(2)
        assert (sampler.run_id, sampler.published_version) == ("r1", 3)
        sampler.note_published(1, run_id="r2")
        assert (sampler.run_id, sampler.published_version) == ("r2", 1)
        with pytest.raises(UsageError, match="integer >= 0"):
            sampler.note_published(-1)


@pytest.fixture
def _shared() -> Iterator[None]:
    from cwtrain.integrations import rollout

    saved = dict(rollout._SHARED), dict(rollout._PUBLISHED), dict(rollout._BURNED)
    rollout._SHARED.clear()
    rollout._PUBLISHED.clear()
    rollout._BURNED.clear()
    try:
        yield
    finally:
        for sampler in rollout._SHARED.values():
            sampler.close()
        rollout._SHARED.clear()
        rollout._SHARED.update(saved[0])
        rollout._PUBLISHED.clear()
        rollout._PUBLISHED.update(saved[1])
        rollout._BURNED.clear()
        rollout._BURNED.update(saved[2])


@pytest.mark.usefixtures("_shared")
def test_the_module_level_note_reaches_every_shared_sampler_and_later_ones() -> None:
    first = shared_sampler(RolloutConfig("http://a.test/v1", "tiny"))
    note_published(4, run_id="run")
    later = shared_sampler(RolloutConfig("http://b.test/v1", "tiny"))
    assert (first.run_id, first.published_version) == ("run", 4)
    assert (later.run_id, later.published_version) == ("run", 4)


@pytest.mark.usefixtures("_shared")
def test_the_module_level_burned_note_reaches_every_shared_sampler_and_a_new_run_forgets_it() -> None:
    first = shared_sampler(RolloutConfig("http://a.test/v1", "tiny"))
    note_published(4, run_id="run")
    note_burned(5, run_id="run")
    later = shared_sampler(RolloutConfig("http://b.test/v1", "tiny"))
    assert first.burned_versions == later.burned_versions == {5}
    assert later.published_version == 4
    with pytest.raises(UsageError, match="integer >= 0"):
        note_burned(-1, run_id="run")
    note_published(1, run_id="next")  # another run: what was burned of the first is forgotten
    fresh = shared_sampler(RolloutConfig("http://c.test/v1", "tiny"))
    assert (fresh.run_id, fresh.published_version, fresh.burned_versions) == ("next", 1, frozenset())
    assert first.burned_versions == frozenset() and first.run_id == "next"


def test_fill_group_tags_this_runs_versions_and_other_identities_as_they_are() -> None:
    class Sample:
        def __init__(self) -> None:
            self.weight_versions: list[str] = []

    serving = Serving(_fleet("run-v000007", "other-v000007"))
    with make(serving) as sampler:
        batch = sampler.sample_groups_sync([[1], [2]], 1, PARAMS)
    samples = [Sample(), Sample()]
    for sample, group in zip(samples, batch.groups, strict=True):
        fill_group([sample], group)
    assert [s.weight_versions for s in samples] == [["7"], ["other-v000007"]]
    assert version_tag("run-v000012", "run") == "12" and version_tag("run-v000012", None) == "run-v000012"
    assert version_tag(None, "run") is None and version_tag("initial", "run") == "initial"


def test_run_sync_runs_a_coroutine_from_plain_code_inside_or_outside_a_running_loop() -> None:
    async def double(x: int) -> tuple[int, str]:
        await asyncio.sleep(0)
        return 2 * x, threading.current_thread().name

    async def fail() -> None:
        await asyncio.sleep(0)
        raise RolloutError("the deployment went away")

    assert run_sync(double(3)) == (6, threading.current_thread().name)  # no loop: here

    async def framework_code() -> tuple[int, str]:  # a plain function called from async code
        with pytest.raises(RolloutError, match="went away"):  # the exception comes back
            run_sync(fail())
        return run_sync(double(4))

    value, thread = asyncio.run(framework_code())
    assert value == 8 and thread == "cwtrain-rollout"  # on its own loop, in its own thread


def test_one_step_ahead_staleness_counts_from_the_version_handed_over_and_newer_is_still_refused() -> None:
    # v5 served, v6 handed over and hot-loading (note_publishing): with a limit of 1 a sample of
    # v4 is 2 behind the trainer's weights (refused), v5 is kept; v6 is refused until announced
    answers = iter(["run-v000004", "run-v000006"])
    serving = Serving(lambda body: next(answers, "run-v000005"))
    with make(serving, max_staleness=1) as sampler:
        sampler.note_published(4)
        sampler.note_published(5)
        sampler.note_publishing(6)
        batch = sampler.sample_groups_sync([[1, 2]], 3, PARAMS)
        assert batch.versions == {5: 3} and serving.requests == 3
        assert batch.metrics["coreweave/stale_rerequested"] == 3.0  # v4: behind the trainer, not the fleet
        assert batch.metrics["coreweave/unpublished_rerequested"] == 3.0  # v6: not served yet
        sampler.note_published(6)  # announced: v6 now kept, v5 one behind still kept
        answers = iter(["run-v000006"])
        assert sampler.sample_groups_sync([[1, 2]], 3, PARAMS).versions == {6: 3}
        sampler.set_run("other")
        sampler.note_published(0)
        assert sampler.published_version == 0  # a new run forgets the version handed over
        sampler.note_publishing(1)
        with pytest.raises(UsageError, match="note_publishing"):
            sampler.note_publishing(-1)

"""The one publish session: versions, the cadence, one budget, READY → trigger → wait → verify, records, metrics.

Against the in-memory API stand-in (``fakeapi``) and the session's moto S3 server: every
snapshot is really encoded, uploaded and read back.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakeapi import FakeAPI

from cwtrain.errors import (
    ConfigError,
    CWTrainError,
    HotLoadFailedError,
    HotLoadVerificationError,
    SnapshotError,
    UsageError,
)
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.lifecycle.cadence import CutReason
from cwtrain.hotload.lifecycle.protocol import SingleProcess, publish_spmd
from cwtrain.hotload.lifecycle.rank import RankShare
from cwtrain.hotload.lifecycle.session import PublishSession
from cwtrain.hotload.lifecycle.settings import FIELD_VARIABLES, HotLoadSettings, default_of, validate_run_id
from cwtrain.hotload.lifecycle.shares import SharePlan, layout_by_sizes
from cwtrain.hotload.lifecycle.target import Target
from cwtrain.hotload.lifecycle.version import PublishOutcome
from cwtrain.integrations.nvext import read_served_identity


def _session(fake: FakeAPI, s3: Any, tmp_path: Path, **settings: Any) -> tuple[PublishSession, list[PublishOutcome]]:
    target = Target(fake.client(), "dep-1", poll_interval=0.0, s3=s3)
    outcomes: list[PublishOutcome] = []
    config = HotLoadSettings("dep-1", "run", state_dir=str(tmp_path / "state"), **settings)
    return PublishSession(config, target=target, sink=outcomes.append), outcomes


#: A FULL snapshot carries the model's config.json (the session passes it with FULL plans only).
CONFIG = {"config.json": b'{"torch_dtype": "float32"}'}


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layer{i}.weight": rng.standard_normal((32, 16)).astype(np.float32) for i in range(4)}


def _objects(s3: Any, bucket: str, identity: str) -> list[str]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"hotload/{identity}/")
    return sorted(item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", []))


# ------------------------------------------------------------------------------ settings


def test_settings_read_every_variable_and_name_the_label_in_errors() -> None:
    env = {
        "CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "dep",
        "CWTRAIN_HOTLOAD_RUN_ID": "grpo-a",
        "CWTRAIN_HOTLOAD_WAIT": "0",
        "CWTRAIN_HOTLOAD_TIMEOUT": "90",
        "CWTRAIN_HOTLOAD_FULL_EVERY": "5",
        "CWTRAIN_HOTLOAD_VERIFY": "yes",
        "CWTRAIN_HOTLOAD_PROMPT_CACHE_POLICY": "reset_all",
        "CWTRAIN_HOTLOAD_UPLOAD_WORKERS": "3",
        "CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME": "on",
    }
    settings = HotLoadSettings.from_env(env)
    assert (settings.deployment_id, settings.run_id, settings.wait, settings.timeout) == ("dep", "grpo-a", False, 90.0)
    assert (settings.full_every, settings.verify, settings.upload_workers) == (5, True, 3)
    assert settings.rollback_on_resume and not default_of("rollback_on_resume")
    assert settings.prompt_cache_policy.name == "RESET_ALL"
    assert HotLoadSettings.from_env(env, timeout=7.0).timeout == 7.0  # explicit beats the variable
    with pytest.raises(ConfigError, match=r"coreweave_cfg\.hotload_timeout='-1'"):
        HotLoadSettings.from_env(
            {**env, "CWTRAIN_HOTLOAD_TIMEOUT": "-1"},
            labels={"CWTRAIN_HOTLOAD_TIMEOUT": "coreweave_cfg.hotload_timeout"},
        )
    assert default_of("timeout") == 1800.0 and default_of("full_every") == "auto"
    assert (default_of("full_share"), default_of("replay_budget")) == (0.9, 2.0)
    assert set(FIELD_VARIABLES) == {name for name in HotLoadSettings.__dataclass_fields__}


@pytest.mark.parametrize("run_id", ["", ".", "..", "a/b", "x" * 121, "tab\there", "bidi\u202e", "initial-\u200b"])
def test_one_run_id_rule_for_every_framework(run_id: str) -> None:
    with pytest.raises(ConfigError, match="not a usable run id"):
        validate_run_id(run_id, "CWTRAIN_HOTLOAD_RUN_ID")
    with pytest.raises(ConfigError):
        HotLoadSettings.from_env({"CWTRAIN_HOTLOAD_DEPLOYMENT_ID": "d", "CWTRAIN_HOTLOAD_RUN_ID": run_id or " "})


# ------------------------------------------------------------------------------ versions


def test_full_then_deltas_then_a_cut_then_an_empty_delta(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    session, outcomes = _session(fake, s3, tmp_path, full_every=3)
    weights = _weights()
    served: dict[str, np.ndarray] = {}
    for version in range(5):
        plan = session.begin()
        assert plan.version == version
        if version:
            weights[f"layer{version % 4}.weight"][0, 0] += 1.0
        if version == 4:
            weights = {name: array.copy() for name, array in served.items()}  # nothing changed
        outcome = session.publish_tensors(plan, weights, base=served, extra_files=CONFIG)
        served = {name: array.copy() for name, array in weights.items()}
        assert outcome is outcomes[-1]
    kinds = [(o.identity, o.chain_cut, o.incremental, o.skipped_empty) for o in outcomes]
    assert kinds == [
        ("run-v000000", True, False, False),
        ("run-v000001", False, True, False),
        ("run-v000002", False, True, False),
        ("run-v000003", True, False, False),  # 3 % 3: the chain is cut
        (None, False, False, True),  # nothing changed: nothing published
    ]
    assert [o.chain_length for o in outcomes] == [0, 1, 2, 0, 0]
    assert [o.served_version for o in outcomes] == [0, 1, 2, 3, 3]
    assert outcomes[1].tensors_changed == 1 and outcomes[1].bytes_changed == 32 * 16 * 4
    assert outcomes[0].tensors_changed == 4 and outcomes[0].completed and outcomes[0].replicas_total == 2
    # snapshot_bytes is every object of the snapshot, as stored
    for outcome in outcomes[:4]:
        assert outcome.identity is not None
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"hotload/{outcome.identity}/")["Contents"]
        assert outcome.snapshot_bytes == outcome.wire_bytes == sum(item["Size"] for item in listed)
    assert _objects(s3, bucket, "run-v000004") == []
    assert read_served_identity(tmp_path / "state") == "run-v000003"
    manifest = session.target.store.read_manifest("run-v000002")
    assert manifest is not None and set(manifest["tensors"]) == set(weights)
    metrics = outcomes[1].metrics()
    assert metrics["hotload/version"] == 1.0 and metrics["hotload/incremental"] == 1.0
    assert all(key.startswith("hotload/") and isinstance(value, float) for key, value in metrics.items())


@pytest.mark.parametrize("policy", ["stop", "reactivate"])
def test_a_failed_hot_load_makes_the_next_version_full_and_still_reaches_the_sink(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, policy: str
) -> None:
    session, outcomes = _session(fake, s3_bucket[0], tmp_path, full_every=0, on_failure=policy)
    burned: list[tuple[str, int]] = []
    session.on_burned.append(lambda run, version: burned.append((run, version)))
    weights = _weights(1)
    session.publish_tensors(session.begin(), weights, extra_files=CONFIG)
    assert not burned
    fake.fail_identities.add("run-v000001")
    changed = {name: array + 1 for name, array in weights.items()}
    if policy == "stop":
        with pytest.raises(HotLoadFailedError):
            session.publish_tensors(session.begin(), changed, base=weights, extra_files=CONFIG)
    else:  # the fleet is brought back to v0 and the run goes on
        outcome = session.publish_tensors(session.begin(), changed, base=weights, extra_files=CONFIG)
        assert outcome.reactivated and outcome.served_version == 0
        again = [spec for spec in (h["spec"] for h in fake.hot_loads.values()) if spec["identity"] == "run-v000000"]
        assert len(again) == 2  # the re-activation: a second hot-load of v0
    assert outcomes[-1].failed and not outcomes[-1].completed and outcomes[-1].version == 1
    assert outcomes[-1].reactivated is (policy == "reactivate")
    plan = session.begin()
    assert plan.version == 2 and plan.full  # FULL; the failed identity (its objects may be stored) is not reused
    assert session.served_identity == "run-v000000"
    assert burned == [("run", 1)]  # created, then failed: a sampler refuses its samples


def test_a_re_activation_is_followed_and_verified_whatever_the_policy_waits_for(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    """One step ahead (``wait=False``) waits for no version, but a re-activation is followed to every replica."""
    from cwtrain.hotload.lifecycle.cycle import CyclePolicy, VersionCycle

    session, _ = _session(fake, s3_bucket[0], tmp_path)
    session.publish_tensors(session.begin(), _weights(3), extra_files=CONFIG)
    cycle = VersionCycle(session.target, CyclePolicy(wait=False))
    back = cycle.reactivate("run-v000001")
    assert back.identity == "run-v000000" and back.state.name == "COMPLETED"  # waited for, not just created
    with pytest.raises(UsageError, match="on_failure='retry' must be one of reactivate, stop"):
        CyclePolicy(on_failure="retry")


def test_versions_must_increase(fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path) -> None:
    session, _ = _session(fake, s3_bucket[0], tmp_path)
    session.publish_tensors(session.begin(4), _weights(), extra_files=CONFIG)
    with pytest.raises(UsageError, match="versions must increase"):
        session.begin(4)


@pytest.mark.parametrize("policy", ["reactivate", "stop"])
def test_a_version_refused_after_its_publish_is_answered_as_a_failed_hot_load(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, policy: str
) -> None:
    # a framework's canary judges v1 from the next step's log-probs, after v1's cycle ended
    session, outcomes = _session(fake, s3_bucket[0], tmp_path, full_every=0, on_failure=policy)
    burned: list[int] = []
    session.on_burned.append(lambda run, version: burned.append(version))
    weights = _weights(1)
    session.publish_tensors(session.begin(), weights, extra_files=CONFIG)
    changed = {name: array + 1 for name, array in weights.items()}
    session.publish_tensors(session.begin(), changed, base=weights, extra_files=CONFIG)
    with pytest.raises(UsageError, match="only the served identity"):
        session.refuse("run-v000000", "canary gap 0.3")
    if policy == "stop":
        with pytest.raises(HotLoadVerificationError, match=r"canary gap 0\.3"):
            session.refuse("run-v000001", "canary gap 0.3", gap=0.3)
        assert session.served_identity == "run-v000001"  # what the fleet still serves
    else:
        outcome = session.refuse("run-v000001", "canary gap 0.3", gap=0.3)
        assert outcome.reactivated and outcome.served_version == 0 and session.served_identity == "run-v000000"
        again = [spec for spec in (h["spec"] for h in fake.hot_loads.values()) if spec["identity"] == "run-v000000"]
        assert len(again) == 2  # the re-activation
        assert read_served_identity(tmp_path / "state") == "run-v000000"
    refused = outcomes[-1]
    assert (refused.version, refused.failed, refused.canary_checked, refused.canary_gap) == (1, True, True, 0.3)
    assert burned == [1]
    plan = session.begin()
    assert plan.version == 2 and plan.full


@pytest.mark.faults
@pytest.mark.fault_row("session-ownership")
def test_a_session_closes_only_the_client_it_built(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trainer that shares its client with the session keeps using it after the session closes.
    session, _ = _session(fake, s3_bucket[0], tmp_path)
    shared = session.target.client
    session.publish_tensors(session.begin(), _weights(), extra_files=CONFIG)
    session.close()
    assert shared.get_deployment("dep-1").id == "dep-1"
    # A session that built its target (from the settings) closes the client it made.
    monkeypatch.setattr(HotLoadSettings, "client", lambda self: fake.client())
    own = PublishSession(HotLoadSettings("dep-1", "run"))
    built = own.target.client
    own.close()
    with pytest.raises(RuntimeError):
        built.get_deployment("dep-1")


def test_verify_is_honoured_and_counts_the_replicas(fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path) -> None:
    session, outcomes = _session(fake, s3_bucket[0], tmp_path, verify=True)
    session.publish_tensors(session.begin(), _weights(), extra_files=CONFIG)
    assert outcomes[-1].replicas_verified == 2
    plain, plain_outcomes = _session(fake, s3_bucket[0], tmp_path)
    plain.settings = HotLoadSettings("dep-1", "other", state_dir=str(tmp_path / "state2"))
    plain.publish_tensors(plain.begin(), _weights(2), extra_files=CONFIG)
    assert plain_outcomes[-1].replicas_verified == 0


def test_a_deployment_that_is_not_ready_is_waited_for_within_the_one_budget(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    session, outcomes = _session(fake, s3_bucket[0], tmp_path)
    fake.deployments["dep-1"]["status"]["status"] = "STATUS_UPDATING"
    original = fake._route
    reads = {"n": 0}

    def route(request: Any, path: str, body: Any) -> Any:  # READY after the third read of the deployment
        if request.method == "GET" and path == "/deployments/dep-1":
            reads["n"] += 1
            if reads["n"] >= 3:
                fake.deployments["dep-1"]["status"]["status"] = "STATUS_READY"
        return original(request, path, body)

    fake._route = route  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        session.publish_tensors(session.begin(), _weights(), extra_files=CONFIG)
    assert outcomes[-1].completed
    assert any("waiting for it to be READY" in record.getMessage() for record in caplog.records)

    fake.deployments["dep-1"]["status"]["status"] = "STATUS_UPDATING"
    reads["n"] = -(10**9)  # never READY again
    session.settings = HotLoadSettings("dep-1", "run", timeout=0.5, state_dir=str(tmp_path / "state"))
    plan = session.begin()
    with pytest.raises(CWTrainError, match="not STATUS_READY"):
        session.publish_tensors(plan, {k: v + 1 for k, v in _weights().items()}, base=_weights(), extra_files=CONFIG)
    assert plan.budget.elapsed < 0.5 + 1.0  # one budget for the whole cycle


def test_the_baseline_is_skipped_when_an_identical_one_completed(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from codec_helpers import save_checkpoint

    checkpoint = save_checkpoint(tmp_path / "base", _weights(3), shards=2)
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    first, _outcomes = _session(fake, s3_bucket[0], tmp_path)
    outcome = first.publish_baseline(checkpoint)
    assert outcome.published and outcome.chain_cut and not outcome.baseline_skipped
    fake.add_hot_load("h-other", "other-v000001")  # since then, the deployment served another run
    again, _again_outcomes = _session(fake, s3_bucket[0], tmp_path)
    skipped = again.publish_baseline(checkpoint)
    assert skipped.baseline_skipped and not skipped.published
    assert skipped.hot_load is not None and skipped.hot_load.identity == "run-v000000"  # pointed back at it
    assert again.served_identity == "run-v000000" and again.begin().previous_identity == "run-v000000"


# ------------------------------------------------------------------------------ restarts


def _run_versions(session: PublishSession, count: int, seed: int = 5) -> dict[str, np.ndarray]:
    """Publish ``count`` versions (a FULL, then deltas); returns the weights served last."""
    weights = _weights(seed)
    served: dict[str, np.ndarray] | None = None
    for step in range(count):
        if step:
            weights = {name: array.copy() for name, array in weights.items()}
            weights[f"layer{step % 4}.weight"][0, 0] += 1.0
        session.publish_tensors(session.begin(), weights, base=served, extra_files=CONFIG)
        served = weights
    return weights


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_a_restarted_session_publishes_the_next_version_full_and_renumbers_its_own_count(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, _ = _session(fake, s3_bucket[0], tmp_path)
    served = _run_versions(first, 4)  # v0..v3
    restarted, outcomes = _session(fake, s3_bucket[0], tmp_path)  # a new process, the same run id
    trained = {name: array + 0.5 for name, array in served.items()}  # its checkpoint's weights, not v3's
    with caplog.at_level(logging.INFO):
        plan = restarted.begin()
    assert (plan.version, plan.full, plan.cut_reason) == (4, True, CutReason.FIRST)
    assert any("restarted trainer" in r.getMessage() and "run-v000003" in r.getMessage() for r in caplog.records)
    outcome = restarted.publish_tensors(plan, trained, extra_files=CONFIG)
    assert outcome.completed and not outcome.failed and outcome.chain_cut and outcome.served_version == 4
    later = {name: array.copy() for name, array in trained.items()}
    later["layer0.weight"][0, 0] += 1.0
    with caplog.at_level(logging.WARNING):
        moved = restarted.begin(1)  # a framework counting from its own restart
    assert (moved.version, moved.full, moved.previous_identity) == (5, False, "run-v000004")
    assert any("publishing it as version 5" in r.getMessage() for r in caplog.records)
    restarted.publish_tensors(moved, later, base=trained, extra_files=CONFIG)
    assert [(o.version, o.kind, o.completed) for o in outcomes] == [(4, "FULL", True), (5, "INCREMENTAL", True)]
    assert read_served_identity(tmp_path / "state") == "run-v000005"


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_a_restart_never_reuses_an_identity_a_failed_attempt_stored_objects_under(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from fakeapi import error_response

    s3, bucket = s3_bucket
    first, _ = _session(fake, s3, tmp_path)
    served = _run_versions(first, 1)
    fake.inject("POST", r"/hotLoads$", error_response(400, "invalid_argument", "refused"))
    with pytest.raises(CWTrainError, match="refused"):  # v1's objects are stored; it never got a hot-load
        first.publish_tensors(first.begin(), {n: a + 1 for n, a in served.items()}, base=served, extra_files=CONFIG)
    assert _objects(s3, bucket, "run-v000001") and not any(
        h["spec"]["identity"] == "run-v000001" for h in fake.hot_loads.values()
    )
    s3.create_multipart_upload(Bucket=bucket, Key="hotload/run-v000002/model-00000-of-00001.safetensors")
    restarted, _ = _session(fake, s3, tmp_path)  # v2: only an unfinished upload of a killed process
    plan = restarted.begin()
    assert plan.version == 3 and plan.full
    assert restarted.history is not None
    assert (restarted.history.last_hot_loaded, restarted.history.last_stored) == (0, 2)
    outcome = restarted.publish_tensors(plan, {n: a + 2 for n, a in served.items()}, extra_files=CONFIG)
    assert outcome.completed and outcome.served_version == 3


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_a_restarted_baseline_keeps_a_later_version_served_unless_asked_to_roll_back(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from codec_helpers import save_checkpoint

    base = _weights(3)
    checkpoint = save_checkpoint(tmp_path / "base", base)
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    first, _ = _session(fake, s3_bucket[0], tmp_path)
    first.publish_baseline(checkpoint)
    changed = {name: array + 1 for name, array in base.items()}
    first.publish_tensors(first.begin(), changed, base=base, extra_files=CONFIG)  # v1, served
    created = len(fake.hot_loads)
    restarted, outcomes = _session(fake, s3_bucket[0], tmp_path)
    kept = restarted.publish_baseline(checkpoint)
    assert len(fake.hot_loads) == created  # nothing hot-loaded: the fleet keeps v1
    assert kept.baseline_skipped and not kept.published and kept.served_version == 1 and outcomes == [kept]
    assert restarted.served_identity == "run-v000001" == read_served_identity(tmp_path / "state")
    plan = restarted.begin()
    assert (plan.version, plan.full) == (2, True)  # its weights are the base's, not v1's: FULL
    asked, _ = _session(fake, s3_bucket[0], tmp_path, rollback_on_resume=True)
    back = asked.publish_baseline(checkpoint)
    assert back.baseline_skipped and back.hot_load is not None and back.hot_load.identity == "run-v000000"
    assert asked.served_identity == "run-v000000" and fake.serving == "run-v000000"
    plan = asked.begin()
    assert (plan.version, plan.previous_identity) == (2, "run-v000000")  # the chain goes on from the baseline


# ------------------------------------------------------------------------------ distributed


class _Threads:
    """A world of ``n`` ranks on threads, with all-gather and broadcast through barriers."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slots: list[Any] = [None] * n
        self.barrier = threading.Barrier(n)
        self.calls: list[tuple[int, str]] = []  # (rank, collective) in the order they ran

    def view(self, rank: int) -> Any:
        world = self

        class View:
            world_size = world.n

            def __init__(self) -> None:
                self.rank = rank

            def all_gather_object(self, obj: Any) -> list[Any]:
                world.calls.append((rank, "all_gather"))
                world.slots[rank] = obj
                world.barrier.wait()
                out = list(world.slots)
                world.barrier.wait()
                return out

            def broadcast_object(self, obj: Any, src: int = 0) -> Any:
                world.calls.append((rank, "broadcast"))
                world.slots[rank] = obj
                world.barrier.wait()
                out = world.slots[src]
                world.barrier.wait()
                return out

        return View()


def _spmd(
    session: PublishSession,
    shares: list[RankShare],
    parts: list[dict[str, Any]],
    full: bool = False,
    world: _Threads | None = None,
) -> Any:
    world = world if world is not None else _Threads(len(shares))
    plan = session.begin(full=full)
    results: list[Any] = [None] * len(shares)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            chunks = [[(name, parts[rank][name])] for name in sorted(parts[rank])]
            results[rank] = publish_spmd(
                world.view(rank), shares[rank], chunks,
                session=session if rank == 0 else None, plan=plan if rank == 0 else None, s3=session.target.store.s3,
            )  # fmt: skip
        except BaseException as exc:  # collected for the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(len(shares))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results[0], errors


def test_two_ranks_publish_one_snapshot_equal_to_one_process(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    weights = _weights(4)
    names = sorted(weights)
    parts = [{n: weights[n] for n in names[:2]}, {n: weights[n] for n in names[2:]}]
    session, _outcomes = _session(fake, s3, tmp_path, full_every=0)
    shares = [RankShare(0, 2), RankShare(1, 2)]
    outcome, errors = _spmd(session, shares, parts)
    assert not errors and outcome.identity == "run-v000000" and outcome.chain_cut
    assert _objects(s3, bucket, "run-v000000") == sorted(
        [INDEX_NAME, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    )
    changed = {name: array.copy() for name, array in weights.items()}
    changed[names[3]][1, 1] = 42.0  # only rank 1's tensor changes
    parts = [{n: changed[n] for n in names[:2]}, {n: changed[n] for n in names[2:]}]
    outcome, errors = _spmd(session, shares, parts)
    assert not errors and outcome.incremental and outcome.tensors_changed == 1
    stored_names = _objects(s3, bucket, "run-v000001")
    assert INDEX_NAME in stored_names and len(stored_names) == 2  # rank 0 wrote no shard
    # one process encoding the same delta gives the same shard, byte for byte
    alone = RankShare()
    alone.seed({name: weights[name] for name in names})
    plan = SharePlan("run-v000001", False, "run-v000000", bucket, "hotload")
    encoded = alone.encode(plan, [list(changed.items())])
    assert [f.name for f in encoded.files] == [n for n in stored_names if n != INDEX_NAME]
    for file in encoded.files:
        assert file.tobytes() == s3.get_object(Bucket=bucket, Key=f"hotload/run-v000001/{file.name}")["Body"].read()


def test_a_failure_on_one_rank_raises_on_every_rank_and_nothing_is_committed(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    weights = _weights(5)
    names = sorted(weights)
    session, outcomes = _session(fake, s3, tmp_path, full_every=0)
    shares = [RankShare(0, 2), RankShare(1, 2)]
    _spmd(session, shares, [{n: weights[n] for n in names[:2]}, {n: weights[n] for n in names[2:]}])
    bad = {n: weights[n] for n in names[2:]}
    bad[names[2]] = weights[names[2]].astype(np.float64)  # another dtype: the delta is refused on rank 1
    outcome, errors = _spmd(session, shares, [{n: weights[n] + 1 for n in names[:2]}, bad])
    assert outcome is None and len(errors) == 2
    assert all("rank 1" in str(error) for error in errors)
    assert _objects(s3, bucket, "run-v000001") == []
    assert outcomes[-1].failed and session.begin().full  # the next version is FULL
    assert shares[0].served[names[0]].data is not None  # rank 0 kept its previous served copy


def test_layout_by_sizes_gives_each_rank_its_own_slots() -> None:
    sizes = [(f"t{i}", 10) for i in range(5)]
    zero = layout_by_sizes(sizes, 0, 2, full=True, shard_bytes=15)
    one = layout_by_sizes(sizes, 1, 2, full=True, shard_bytes=15)
    assert set(zero) == {"t0", "t2", "t4"} and set(one) == {"t1", "t3"}
    assert set(zero.values()) | set(one.values()) <= {f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)}
    assert not set(zero.values()) & set(one.values())
    with pytest.raises(ValueError):
        layout_by_sizes(sizes, 2, 2, full=True)


def test_a_single_process_world_needs_no_collective(fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path) -> None:
    session, _outcomes = _session(fake, s3_bucket[0], tmp_path)
    share = RankShare()
    outcome = publish_spmd(SingleProcess(), share, [list(_weights(6).items())], session=session, plan=session.begin())
    assert outcome is not None and outcome.completed and set(share.served) == set(_weights(6))
    with pytest.raises(SnapshotError, match="no served copy"):
        RankShare().encode(SharePlan("x-v000001", False, "x-v000000", "b", "p"), [[("w", np.zeros(2, np.float32))]])


# ------------------------------------------------------------------------------ auto: the cost rule (issue 25)


def _model(seed: int = 0) -> dict[str, np.ndarray]:
    """Four 64 KiB tensors: big enough that a sparse delta is a small share of a FULL."""
    rng = np.random.default_rng(seed)
    return {f"layer{i}.weight": rng.standard_normal((128, 128)).astype(np.float32) for i in range(4)}


def _sparse(weights: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    out = {name: array.copy() for name, array in weights.items()}
    out["layer0.weight"][step % 128, :4] += 1.0
    return out


def _dense(weights: dict[str, np.ndarray], fraction: float, seed: int) -> dict[str, np.ndarray]:
    """``fraction`` of every tensor's values replaced by random ones (an XOR that does not compress)."""
    rng = np.random.default_rng(seed)
    out = {name: array.copy() for name, array in weights.items()}
    for array in out.values():
        flat = array.reshape(-1)
        count = int(flat.size * fraction)
        flat[:count] = rng.standard_normal(count).astype(np.float32)
    return out


def _stored(s3: Any, bucket: str, identity: str) -> int:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"hotload/{identity}/")
    return sum(item["Size"] for item in listed.get("Contents", []))


def test_auto_publishes_full_when_a_delta_is_nearly_a_full_and_logs_why(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s3, bucket = s3_bucket
    session, outcomes = _session(fake, s3, tmp_path)  # full_every defaults to auto
    assert session.settings.full_every == "auto"
    served = _model()
    session.publish_tensors(session.begin(), served, extra_files=CONFIG)
    full_bytes = outcomes[-1].snapshot_bytes
    new = _sparse(served, 1)
    session.publish_tensors(session.begin(), new, base=served, extra_files=CONFIG)
    served = new
    dense = _dense(served, 1.0, 7)
    with caplog.at_level(logging.INFO, logger="cwtrain.hotload.lifecycle.session"):
        plan = session.begin()
        assert not plan.full and plan.cut_at_bytes == math.ceil(0.9 * full_bytes)
        outcome = session.publish_tensors(plan, dense, base=served, extra_files=CONFIG)
    assert [(o.chain_cut, o.cut_reason) for o in outcomes] == [(True, 1), (False, 0), (True, 6)]
    assert _objects(s3, bucket, "run-v000002") == sorted([INDEX_NAME, "config.json", "model.safetensors"])
    assert (
        outcome.completed and outcome.chain_length == 0 and outcome.snapshot_bytes == _stored(s3, bucket, plan.identity)
    )
    assert outcome.replay_bytes == outcome.snapshot_bytes  # a cold replica reads this FULL only
    assert outcomes[1].replay_bytes == full_bytes + outcomes[1].snapshot_bytes
    assert outcome.metrics()["hotload/cut_reason"] == 6.0 and "hotload/replay_bytes" in outcome.metrics()
    assert any("FULL instead of a delta (share: delta" in r.getMessage() for r in caplog.records)
    manifest = session.target.store.read_manifest("run-v000002")
    assert manifest is not None and len(manifest["tensors"]) == 4
    assert session.begin().previous_identity == "run-v000002"  # the chain restarts at the cut


def test_auto_cuts_when_a_cold_replica_would_replay_more_than_the_budget(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    session, outcomes = _session(fake, s3, tmp_path, replay_budget=1.0)
    served = _model(1)
    session.publish_tensors(session.begin(), served, extra_files=CONFIG)
    full_bytes = outcomes[-1].snapshot_bytes
    for step in range(1, 5):  # each delta about 40 % of a FULL: the third would pass one FULL of deltas
        new = _dense(served, 0.4, step)
        session.publish_tensors(session.begin(), new, base=served, extra_files=CONFIG)
        served = new
    assert [o.cut_reason for o in outcomes] == [1, 0, 0, 7, 0]
    assert all(0.25 < o.snapshot_bytes / full_bytes < 0.5 for o in outcomes[1:3])
    assert [o.chain_length for o in outcomes] == [0, 1, 2, 0, 1]
    # no version's cold replay passes the FULL plus the budget's one FULL of deltas
    assert all(o.replay_bytes <= 2 * full_bytes for o in outcomes)
    assert outcomes[2].replay_bytes == full_bytes + outcomes[1].snapshot_bytes + outcomes[2].snapshot_bytes
    assert "model.safetensors" in _objects(s3, bucket, "run-v000003")  # FULL


def test_a_run_below_the_share_encodes_each_version_once(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwtrain.hotload.codec.encode import DeltaEncoder

    calls = {"encode": 0, "plan_full": 0}
    encode, plan_full = DeltaEncoder.encode, DeltaEncoder.plan_full

    def counted_encode(self: DeltaEncoder, *args: Any, **kwargs: Any) -> Any:
        calls["encode"] += 1
        return encode(self, *args, **kwargs)

    def counted_plan_full(self: DeltaEncoder, *args: Any, **kwargs: Any) -> Any:
        calls["plan_full"] += 1
        return plan_full(self, *args, **kwargs)

    monkeypatch.setattr(DeltaEncoder, "encode", counted_encode)
    monkeypatch.setattr(DeltaEncoder, "plan_full", counted_plan_full)
    session, outcomes = _session(fake, s3_bucket[0], tmp_path)
    served = _model(2)
    session.publish_tensors(session.begin(), served, extra_files=CONFIG)
    for step in range(1, 7):
        new = _sparse(served, step)
        session.publish_tensors(session.begin(), new, base=served, extra_files=CONFIG)
        served = new
    assert [o.cut_reason for o in outcomes] == [1, 0, 0, 0, 0, 0, 0] and all(o.completed for o in outcomes)
    assert calls == {"encode": 6, "plan_full": 1}  # one encode per delta, the baseline's FULL; no second one
    dense = _dense(served, 1.0, 3)
    session.publish_tensors(session.begin(), dense, base=served, extra_files=CONFIG)
    assert outcomes[-1].cut_reason == 6 and calls == {"encode": 7, "plan_full": 2}  # the cut builds its FULL


def test_publish_diff_cuts_to_the_new_checkpoints_directory(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from codec_helpers import save_checkpoint

    s3, bucket = s3_bucket
    session, outcomes = _session(fake, s3, tmp_path)
    weights = _model(3)
    base = save_checkpoint(tmp_path / "v0", weights)
    session.publish_directory(session.begin(), base)
    sparse = save_checkpoint(tmp_path / "v1", _sparse(weights, 1))
    session.publish_diff(session.begin(), sparse, base)
    dense = save_checkpoint(tmp_path / "v2", _dense(weights, 1.0, 5))
    outcome = session.publish_diff(session.begin(), dense, sparse)
    assert [(o.incremental, o.cut_reason) for o in outcomes] == [(False, 1), (True, 0), (False, 6)]
    assert outcome.completed and outcome.snapshot_bytes == _stored(s3, bucket, "run-v000002")
    assert _objects(s3, bucket, "run-v000002") == sorted([INDEX_NAME, *(p.name for p in dense.iterdir())])  # its files
    manifest = session.target.store.read_manifest("run-v000002")  # from the delta's encode: every tensor's Adler-32
    assert manifest is not None and len(manifest["tensors"]) == 4


def test_a_delta_directory_keeps_half_a_full_as_a_delta_and_cuts_a_dense_one_to_its_full(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from codec_helpers import save_checkpoint

    from cwtrain.hotload.files.write import write_delta
    from cwtrain.hotload.lifecycle.sources import DirectorySource

    s3, bucket = s3_bucket
    session, outcomes = _session(fake, s3, tmp_path)
    weights = _model(4)
    base = save_checkpoint(tmp_path / "v0", weights)
    session.publish_directory(session.begin(), base)
    half = save_checkpoint(tmp_path / "v1", _dense(weights, 0.5, 1))
    write_delta(base, half, tmp_path / "d1", version="000001", base_version="000000")
    plan = session.begin()
    session.publish_directory(plan, tmp_path / "d1", full=DirectorySource(half))  # about half a FULL: a delta
    assert outcomes[-1].incremental and session.cadence.chain_bytes == outcomes[-1].snapshot_bytes
    dense = save_checkpoint(tmp_path / "v2", _dense(weights, 1.0, 2))
    write_delta(half, dense, tmp_path / "d2", version="000002", base_version="000001")
    cut = session.publish_directory(session.begin(), tmp_path / "d2", full=DirectorySource(dense))
    assert cut.chain_cut and not cut.incremental and cut.cut_reason == int(CutReason.SHARE)
    assert _objects(s3, bucket, "run-v000002") == sorted([INDEX_NAME, *(p.name for p in dense.iterdir())])  # FULL
    assert cut.hot_load is not None and fake.hot_loads[cut.hot_load.id]["spec"]["type"] == "SNAPSHOT_TYPE_FULL"
    with pytest.raises(UsageError, match="must be >= 0"):
        session.weigh(session.begin(), -1)


def test_weigh_directory_sizes_equal_the_stored_bytes(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from codec_helpers import save_checkpoint

    from cwtrain.hotload.files.validate import inspect_snapshot
    from cwtrain.hotload.files.write import write_delta

    s3, bucket = s3_bucket
    session, outcomes = _session(fake, s3, tmp_path)
    weights = _model(5)
    base = save_checkpoint(tmp_path / "v0", weights)
    session.publish_directory(session.begin(), base)
    write_delta(base, save_checkpoint(tmp_path / "v1", _sparse(weights, 3)), tmp_path / "d1", version="000001",
                base_version="000000")  # fmt: skip
    info = inspect_snapshot(tmp_path / "d1", previous_identity="run-v000000")
    size = info.stored_bytes("run-v000001")
    session.publish_directory(session.begin(), tmp_path / "d1")
    assert size == outcomes[-1].snapshot_bytes == _stored(s3, bucket, "run-v000001")


def test_a_skipped_baseline_gives_the_cost_rule_its_stored_size(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    from codec_helpers import save_checkpoint

    s3, bucket = s3_bucket
    checkpoint = save_checkpoint(tmp_path / "base", _model(6))
    first, _ = _session(fake, s3, tmp_path)
    first.publish_baseline(checkpoint)
    again, _outcomes = _session(fake, s3, tmp_path)
    skipped = again.publish_baseline(checkpoint)
    assert skipped.baseline_skipped and skipped.snapshot_bytes == 0
    assert again.cadence.full_bytes == _stored(s3, bucket, "run-v000000") == skipped.replay_bytes
    assert again.begin().cut_at_bytes == math.ceil(0.9 * _stored(s3, bucket, "run-v000000"))


def test_a_fixed_count_weighs_nothing(fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path) -> None:
    session, outcomes = _session(fake, s3_bucket[0], tmp_path, full_every=20)
    served = _model(7)
    session.publish_tensors(session.begin(), served, extra_files=CONFIG)
    plan = session.begin()
    assert plan.cut_at_bytes is None and session.weigh(plan, 10**12) is plan
    session.publish_tensors(plan, _dense(served, 1.0, 1), base=served, extra_files=CONFIG)
    assert outcomes[-1].incremental and outcomes[-1].cut_reason == 0  # as large as a FULL, still a delta


def test_two_ranks_cut_to_full_from_their_served_copies_in_one_more_step(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    weights = _model(8)
    names = sorted(weights)

    def parts(tensors: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        return [{n: tensors[n] for n in names[:2]}, {n: tensors[n] for n in names[2:]}]

    session, _outcomes = _session(fake, s3, tmp_path)
    shares = [RankShare(0, 2), RankShare(1, 2)]
    _spmd(session, shares, parts(weights))
    sparse = _sparse(weights, 2)
    delta_world = _Threads(2)
    outcome, errors = _spmd(session, shares, parts(sparse), world=delta_world)
    assert not errors and outcome.incremental
    dense = _dense(sparse, 1.0, 9)
    cut_world = _Threads(2)
    outcome, errors = _spmd(session, shares, parts(dense), world=cut_world)
    assert not errors and outcome.chain_cut and outcome.cut_reason == 6 and outcome.completed
    # the protocol's steps, each one broadcast and one all-gather: encode, store, then the settling broadcast;
    # weighing a delta costs no step, a cut one more (every rank's FULL share from its served copy)
    step = ["broadcast", "all_gather"]
    rank0 = [[kind for rank, kind in world.calls if rank == 0] for world in (delta_world, cut_world)]
    assert rank0[0] == [*step, *step, "broadcast"]
    assert rank0[1] == [*step, *step, *step, "broadcast"]
    assert [[kind for rank, kind in world.calls if rank == 1] for world in (delta_world, cut_world)] == rank0
    cut = _objects(s3, bucket, "run-v000002")
    assert cut == sorted([INDEX_NAME, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"])
    # byte for byte the FULL snapshot a FULL plan of the same tensors stores
    other, _ = _session(fake, s3, tmp_path)
    other.settings = HotLoadSettings("dep-1", "other", state_dir=str(tmp_path / "other"))
    _spmd(other, [RankShare(0, 2), RankShare(1, 2)], parts(dense))
    for name in cut:
        if name != INDEX_NAME:
            ours = s3.get_object(Bucket=bucket, Key=f"hotload/run-v000002/{name}")["Body"].read()
            theirs = s3.get_object(Bucket=bucket, Key=f"hotload/other-v000000/{name}")["Body"].read()
            assert ours == theirs, name
    # the served copies moved to the cut's weights: the next delta goes against them
    after = _sparse(dense, 5)
    outcome, errors = _spmd(session, shares, parts(after))
    assert not errors and outcome.incremental and outcome.tensors_changed == 1

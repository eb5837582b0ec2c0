"""The NeMo-RL synchronizer drives core's publish session: one version per sync, the session's metrics.

Two in-process policy workers (the stand-in of ./standin, each holding half of a small
model as torch tensors) publish through cwtrain's worker mixin, unchanged, into the session's
moto S3 server; the API is the in-memory stand-in of tests/core (``fakeapi``). Every snapshot
is really encoded, uploaded and read back. The Ray test (test_nemo_rl_distributed.py) shows
replicas serving the trainer's bytes; this one the cycle around it: READY waited,
``CWTRAIN_HOTLOAD_VERIFY`` honoured, failures recorded and followed by a FULL version.
"""

from __future__ import annotations

import logging
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from _reference_snapshot import assert_same_weights, bucket_reader, decode_chain

CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if CORE_TESTS not in sys.path:
    sys.path.append(CORE_TESTS)

from fakeapi import FakeAPI  # noqa: E402

from cwtrain.errors import CWTrainError, HotLoadFailedError, SnapshotError  # noqa: E402
from cwtrain.hotload import HotLoader, PublishOutcome  # noqa: E402


class InProcessPolicy:
    """NeMo-RL's Policy as the synchronizer drives it, its workers in this process (calls recorded)."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers
        self.calls: list[str] = []

    def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> list[Any]:
        self.calls.append(method_name)
        return [getattr(worker, method_name)(**kwargs) for worker in self.workers]

    def train(self, step: int) -> int:
        return sum(worker.train_step(step) for worker in self.workers)

    def weights(self) -> dict[str, torch.Tensor]:
        merged: dict[str, torch.Tensor] = {}
        for worker in self.workers:
            merged.update(worker.weights())
        return merged


class _Tok:
    pad_token_id = 0
    eos_token_id = 2


def _model() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn((16, 8), generator=gen) for i in range(6)}


@pytest.fixture
def fake(s3_bucket: tuple[Any, str], s3_env: dict[str, str]) -> FakeAPI:
    api = FakeAPI()
    api.add_gateway()
    api.add_deployment()
    api.deployments["dep-1"]["spec"]["hotLoad"]["bucket"] = s3_bucket[1]
    return api


def _synchronizer(
    fake: FakeAPI,
    s3: Any,
    tmp_path: Path,
    *,
    config_json: bool = True,
    weights: dict[str, torch.Tensor] | None = None,
    **cfg: Any,
) -> tuple[Any, InProcessPolicy, list[dict[str, float]]]:
    from cwtrain_test_workers import HalfWorker  # type: ignore[import-not-found]

    from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
    from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer

    hf = tmp_path / "hf"
    hf.mkdir(exist_ok=True)
    if config_json:
        (hf / "config.json").write_text('{"model_type": "tiny"}')
    (hf / "tokenizer.json").write_text("{}")
    config = {
        "coreweave_cfg": {
            "base_url": "http://127.0.0.1:9/v1", "model": "tiny", "deployment_id": "dep-1", "run_id": "nemo",
            "state_dir": str(tmp_path / "state"), "full_every": 3, **cfg,
        }
    }  # fmt: skip
    generation = CoreWeaveGeneration(config, _Tok(), environ={})
    weights = weights if weights is not None else _model()
    policy = InProcessPolicy([HalfWorker(rank, 2, weights) for rank in range(2)])
    loader = HotLoader(fake.client(), "dep-1", s3=s3, poll_interval=0.0, timeout=30)
    sunk: list[dict[str, float]] = []
    sync = HotLoadWeightSynchronizer(
        policy, generation, config, hf_checkpoint=hf, loader=loader, metrics_sink=sunk.append
    )
    return sync, policy, sunk


def _stored(s3: Any, bucket: str, identity: str) -> dict[str, int]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"hotload/{identity}/").get("Contents", [])
    return {item["Key"].rsplit("/", 1)[1]: item["Size"] for item in listed}


def test_each_sync_is_one_version_of_the_session_with_its_metrics(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    sync, policy, sunk = _synchronizer(fake, s3, tmp_path)
    schema = set(PublishOutcome(version=0).metrics())
    changed = [0]
    for step in range(4):
        if step:
            changed.append(policy.train(step))
        assert sync.sync_weights() is None and not sync.is_stale
        metrics = sync.last_metrics
        identity = f"nemo-v{step:06d}"
        assert set(metrics) == schema and "hotload/export_seconds" not in metrics  # the session's names
        assert sunk[-1] == metrics and len(sunk) == step + 1
        full = step in (0, 3)  # version 0, then every full_every=3
        assert (metrics["hotload/chain_cut"], metrics["hotload/incremental"]) == (float(full), float(not full))
        assert metrics["hotload/version"] == step and metrics["hotload/completed"] == 1.0
        assert metrics["hotload/tensors_changed"] == (6 if full else changed[step])
        stored = _stored(s3, bucket, identity)
        assert metrics["hotload/snapshot_bytes"] == metrics["hotload/wire_bytes"] == sum(stored.values())
        assert ("config.json" in stored, "tokenizer.json" in stored) == (full, full)  # HF side files beside FULL only
        assert metrics["hotload/chain_length"] == (0 if full else step)
        assert metrics["hotload/stage_seconds"] > 0 and metrics["hotload/publish_seconds"] > 0
        assert sync.served_identity == identity and sync.version == step + 1
        assert (tmp_path / "state" / "served_identity").read_text() == identity + "\n"
        manifest = sync.session.target.store.read_manifest(identity)
        trainer = policy.weights()
        assert manifest is not None and manifest["tensors"] == {
            name: f"{zlib.adler32(trainer[name].contiguous().view(torch.uint8).numpy().tobytes()):08x}"
            for name in sorted(trainer)
        }
        # the bucket's chain, decoded by the tests' reference reader (not cwtrain's codec), is the trainer's
        assert_same_weights(decode_chain(bucket_reader(s3, bucket, "hotload"), identity), trainer, identity)
    assert policy.calls.count("cwtrain_commit_share") == 4 and "cwtrain_discard_share" not in policy.calls


def test_verify_is_honoured(fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path) -> None:
    sync, _, _ = _synchronizer(fake, s3_bucket[0], tmp_path, verify=True)
    sync.sync_weights()
    assert sync.last_metrics["hotload/replicas_verified"] == 2.0
    plain, _, _ = _synchronizer(fake, s3_bucket[0], tmp_path, run_id="plain")
    plain.sync_weights()
    assert plain.last_metrics["hotload/replicas_verified"] == 0.0


def test_a_deployment_that_is_not_ready_is_waited_for(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sync, _, _ = _synchronizer(fake, s3_bucket[0], tmp_path)
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
        sync.sync_weights()
    assert sync.last_metrics["hotload/completed"] == 1.0 and reads["n"] >= 3
    assert any("waiting for it to be READY" in record.getMessage() for record in caplog.records)


def test_a_failing_worker_fails_the_version_and_the_next_one_is_full(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    sync, policy, sunk = _synchronizer(fake, s3, tmp_path, full_every=0)
    sync.sync_weights()
    served = [dict(worker.cwtrain_share().served) for worker in policy.workers]
    policy.train(1)
    sync.mark_stale()  # as grpo_train after the optimizer step
    broken = policy.workers[1]
    others, broken.others = broken.others, {}  # rank 1's gather fails (a tensor it cannot size)
    with pytest.raises(CWTrainError, match=r"nemo-v000001 failed: rank 1: KeyError"):
        sync.sync_weights()
    assert sunk[-1]["hotload/failed"] == 1.0 and sunk[-1]["hotload/version"] == 1.0
    assert "model.safetensors.index.json" not in _stored(s3, bucket, "nemo-v000001")  # nothing committed
    assert policy.calls[-1] == "cwtrain_discard_share" and sync.is_stale
    for worker, before in zip(policy.workers, served, strict=True):  # every served copy is the one replicas hold
        assert set(worker.cwtrain_share().served) == set(before)
        assert all(torch.equal(worker.cwtrain_share().served[n], t) for n, t in before.items())
    broken.others = others
    sync.sync_weights()  # FULL (the replicas keep what they served), under a new identity: v1 holds rank 0's shards
    metrics = sync.last_metrics
    assert (metrics["hotload/version"], metrics["hotload/chain_cut"], metrics["hotload/completed"]) == (2.0, 1.0, 1.0)
    assert sync.served_identity == "nemo-v000002" and not sync.is_stale


@pytest.mark.parametrize("on_failure", ["stop", "reactivate"])
def test_a_failed_hot_load_is_recorded_and_the_next_version_is_full(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, on_failure: str
) -> None:
    sync, policy, sunk = _synchronizer(fake, s3_bucket[0], tmp_path, full_every=0, on_failure=on_failure)
    sync.sync_weights()
    policy.train(1)
    fake.fail_identities.add("nemo-v000001")
    if on_failure == "stop":
        with pytest.raises(HotLoadFailedError):
            sync.sync_weights()
    else:  # the default: every replica brought back to v0, the run goes on
        sync.sync_weights()
        assert sunk[-1]["hotload/reactivated"] == 1.0 and sunk[-1]["hotload/served_version"] == 0.0
    assert sunk[-1]["hotload/failed"] == 1.0 and policy.calls[-1] == "cwtrain_discard_share"
    assert sync.served_identity == "nemo-v000000" and sync.version == 2
    sampler = sync.generation.sampler  # v1 is burned: the fence refuses its samples whatever the newest
    assert (sampler.published_version, sampler.burned_versions) == (0, {1})
    sync.sync_weights()  # the stored delta v1 stays as it is; v2 is FULL from every worker's current tensors
    metrics = sync.last_metrics
    assert (metrics["hotload/version"], metrics["hotload/chain_cut"], metrics["hotload/completed"]) == (2.0, 1.0, 1.0)
    assert metrics["hotload/tensors_changed"] == 6 and sync.served_identity == "nemo-v000002"
    policy.train(2)
    sync.sync_weights()  # and deltas follow on it
    assert sync.last_metrics["hotload/incremental"] == 1.0 and sync.served_identity == "nemo-v000003"


@pytest.mark.faults
@pytest.mark.fault_row("trainer-restart")
def test_a_restarted_synchronizer_publishes_the_next_version_full_then_deltas(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    sync, policy, _ = _synchronizer(fake, s3, tmp_path, full_every=5)
    for step in range(3):  # v0 FULL, v1 and v2 deltas
        if step:
            policy.train(step)
        sync.sync_weights()
    sync.shutdown()
    # the run restarts from a checkpoint: new workers, weights other than v2's, the same run id
    again, restored, sunk = _synchronizer(fake, s3, tmp_path, full_every=5)
    restored.train(7)
    assert again.version == 3  # the session's next version, read from the fleet: not 0
    again.sync_weights()
    assert (sunk[-1]["hotload/version"], sunk[-1]["hotload/chain_cut"], sunk[-1]["hotload/completed"]) == (3, 1, 1)
    assert sunk[-1]["hotload/cut_reason"] == 1.0 and sunk[-1]["hotload/tensors_changed"] == 6  # FULL: a restart
    restored.train(8)
    again.sync_weights()
    assert sunk[-1]["hotload/incremental"] == 1.0 and again.served_identity == "nemo-v000004"
    assert (tmp_path / "state" / "served_identity").read_text() == "nemo-v000004\n"
    trainer = restored.weights()
    assert_same_weights(decode_chain(bucket_reader(s3, bucket, "hotload"), "nemo-v000004"), trainer, "nemo-v000004")


def test_a_full_version_without_config_json_is_refused_and_recorded(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    s3, bucket = s3_bucket
    sync, policy, sunk = _synchronizer(fake, s3, tmp_path, config_json=False)
    with pytest.raises(SnapshotError, match=r"config\.json is missing"):
        sync.sync_weights()
    assert sunk[-1]["hotload/failed"] == 1.0 and _stored(s3, bucket, "nemo-v000000") == {}
    assert "cwtrain_encode_share" not in policy.calls and policy.calls == ["cwtrain_discard_share"]
    assert sync.version == 1 and sync.served_identity is None  # each identity is tried once


def test_auto_weighs_the_workers_delta_between_encode_and_store(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path
) -> None:
    """``full_every: auto``: the workers encode, the driver weighs their shard bytes, then they store (issue 25).

    The calls are core's share protocol's steps: encode, (cut,) store, commit or discard.
    """
    s3, bucket = s3_bucket
    gen = torch.Generator().manual_seed(4)
    big = {f"layers.{i}.weight": torch.randn((128, 64), generator=gen) for i in range(6)}  # headers a small share
    sync, policy, _ = _synchronizer(fake, s3, tmp_path, weights=big, full_every="auto")
    sync.sync_weights()
    assert policy.calls == ["cwtrain_encode_share", "cwtrain_store_share", "cwtrain_commit_share"]  # FULL: no cut
    policy.calls.clear()
    worker = policy.workers[0]
    name = sorted(worker.mine)[0]
    worker.mine[name] = worker.mine[name].clone()
    worker.mine[name][0, 0] += 1.0  # one value: a small delta
    sync.sync_weights()
    assert policy.calls == ["cwtrain_encode_share", "cwtrain_store_share", "cwtrain_commit_share"]
    assert (sync.last_metrics["hotload/incremental"], sync.last_metrics["hotload/cut_reason"]) == (1.0, 0.0)
    gen = torch.Generator().manual_seed(5)
    for each in policy.workers:  # every value new: the delta is as large as a FULL
        each.mine = {n: torch.randn(t.shape, generator=gen) for n, t in each.mine.items()}
    sync.sync_weights()
    metrics = sync.last_metrics
    assert (metrics["hotload/chain_cut"], metrics["hotload/cut_reason"], metrics["hotload/completed"]) == (1, 6, 1)
    stored = _stored(s3, bucket, "nemo-v000002")
    assert "config.json" in stored and metrics["hotload/replay_bytes"] == sum(stored.values())  # FULL: side files
    manifest = sync.session.target.store.read_manifest("nemo-v000002")
    trainer = policy.weights()
    assert manifest is not None and manifest["tensors"] == {
        n: f"{zlib.adler32(trainer[n].contiguous().view(torch.uint8).numpy().tobytes()):08x}" for n in sorted(trainer)
    }
    for each in policy.workers:  # the FULL shares came from the served copies, which now hold the new weights
        assert all(torch.equal(each.cwtrain_share().served[n], t) for n, t in each.mine.items())
    worker.mine[name][1, 1] += 1.0
    sync.sync_weights()
    assert sync.last_metrics["hotload/incremental"] == 1.0 and sync.last_metrics["hotload/tensors_changed"] == 1.0

"""HotLoader against the MockTransport API stand-in and a real moto S3 server."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fakeapi import FakeAPI, error_response

from cwtrain.errors import (
    ConfigError,
    CWTrainError,
    HotLoadFailedError,
    HotLoadInProgressError,
    HotLoadTimeoutError,
    HotLoadVerificationError,
    SnapshotConflictError,
    SnapshotError,
    UsageError,
)
from cwtrain.hotload.codec.encode import DeltaEncoder
from cwtrain.hotload.format.tensors import TensorData
from cwtrain.hotload.loader import HotLoader, ProgressEvent
from cwtrain.infra.enums import HotLoadState, SnapshotType


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "lm_head.weight": rng.standard_normal((4, 8)).astype(np.float32),
        "model.norm.weight": np.ones(8, dtype=np.float16),
    }


def _full_dir(root: Path, weights: dict[str, np.ndarray]) -> Path:
    root.mkdir(parents=True)
    tensors = {
        k: TensorData("F32" if v.dtype == np.float32 else "F16", v.shape, v.tobytes()) for k, v in weights.items()
    }
    with DeltaEncoder(workers=1) as encoder:
        snap = encoder.encode_full(tensors)
    for file in [*snap.files, snap.index]:
        file.write_to(root / file.name)
    (root / "config.json").write_text('{"model_type": "tiny"}')
    return root


def _delta_dir(root: Path, new: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> Path:
    root.mkdir(parents=True)

    def td(w: dict[str, np.ndarray]) -> dict[str, TensorData]:
        return {k: TensorData("F32" if v.dtype == np.float32 else "F16", v.shape, v.tobytes()) for k, v in w.items()}

    with DeltaEncoder(workers=1) as encoder:
        snap = encoder.encode(td(new), td(base))
    for file in [*snap.files, snap.index]:
        file.write_to(root / file.name)
    return root


@pytest.fixture
def fake() -> FakeAPI:
    api = FakeAPI()
    api.add_gateway()
    api.add_deployment()
    return api


@pytest.fixture
def loader(fake: FakeAPI) -> HotLoader:
    return HotLoader(fake.client(), "dep-1", timeout=10, poll_interval=0.01)


@pytest.fixture
def s3_loader(fake: FakeAPI, s3_bucket: tuple[Any, str]) -> tuple[HotLoader, Any, str]:
    s3, bucket = s3_bucket
    fake.deployments["dep-1"]["spec"]["hotLoad"]["bucket"] = bucket
    return HotLoader(fake.client(), "dep-1", s3=s3, timeout=10, poll_interval=0.01), s3, bucket


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


# ----------------------------------------------------------------------- publish


def test_publish_full_then_delta_directories(
    s3_loader: tuple[HotLoader, Any, str], fake: FakeAPI, tmp_path: Path
) -> None:
    loader, s3, bucket = s3_loader
    base, new = _weights(0), _weights(0)
    new["lm_head.weight"][0, 0] += 1.0
    events: list[ProgressEvent] = []
    full = loader.publish(_full_dir(tmp_path / "full", base), "run-v000000", on_progress=events.append)
    assert full.state is HotLoadState.COMPLETED and full.type is SnapshotType.FULL
    assert "hotload/run-v000000/model.safetensors.index.json" in _keys(s3, bucket, "hotload/run-v000000/")
    assert events and events[-1].ready == events[-1].total == 2
    # one stream: the upload's events, the last with every byte stored, then the hot-load's polls
    stages = [e.stage for e in events]
    assert stages[0] == "upload" and "hot_load" in stages
    assert stages == sorted(stages, key=["upload", "hot_load"].index)
    uploads = [e for e in events if e.stage == "upload"]
    assert uploads[-1].bytes_done == uploads[-1].bytes_total > 0
    assert sum(e.bytes_done >= e.bytes_total for e in uploads) == 1
    assert {e.hot_load.identity for e in events} == {"run-v000000"}
    assert all(e.hot_load.id == full.id for e in events if e.stage == "hot_load")
    assert loader.current_identity() == "run-v000000"

    delta = loader.publish(_delta_dir(tmp_path / "d1", new, base), "run-v000001", previous_identity="run-v000000")
    assert delta.type is SnapshotType.INCREMENTAL and delta.previous_identity == "run-v000000"
    body = [c[2] for c in fake.calls if c[:2] == ("POST", "/hotLoads")][-1]
    assert body["incrementalSnapshotMetadata"]["previousSnapshotIdentity"] == "run-v000000"
    index = json.loads(
        s3.get_object(Bucket=bucket, Key="hotload/run-v000001/model.safetensors.index.json")["Body"].read()
    )
    assert index["metadata"]["version"] == "run-v000001" and index["metadata"]["base_version"] == "run-v000000"
    assert loader.current_identity() == "run-v000001"
    assert [h.identity for h in loader.list()] == ["run-v000001", "run-v000000"]


def test_publish_tensors_full_and_delta_without_disk(s3_loader: tuple[HotLoader, Any, str], tmp_path: Path) -> None:
    loader, s3, bucket = s3_loader
    base, new = _weights(1), _weights(1)
    new["model.norm.weight"][3] = 2.0
    loader.publish(base, "mem-v000000", extra_files={"config.json": b"{}"})
    assert _keys(s3, bucket, "hotload/mem-v000000/") == [
        "hotload/mem-v000000/config.json",
        "hotload/mem-v000000/model.safetensors",
        "hotload/mem-v000000/model.safetensors.index.json",
    ]
    hot = loader.publish(new, "mem-v000001", previous_identity="mem-v000000", base=base)
    assert hot.type is SnapshotType.INCREMENTAL
    index = json.loads(
        s3.get_object(Bucket=bucket, Key="hotload/mem-v000001/model.safetensors.index.json")["Body"].read()
    )
    assert list(index["weight_map"]) == ["model.norm.weight"]
    assert not list(tmp_path.iterdir())
    with pytest.raises(SnapshotError, match="needs base="):
        loader.publish(new, "mem-v000002", previous_identity="mem-v000001")
    with pytest.raises(SnapshotError, match="no tensor changed"):
        loader.publish(new, "mem-v000002", previous_identity="mem-v000001", base=new)


def _bf16(array: np.ndarray) -> TensorData:
    """float32 → BF16 bytes by truncation (numpy has no bfloat16; TensorData carries them)."""
    raw = np.ascontiguousarray(array, dtype="<f4").view("<u4") >> 16
    return TensorData("BF16", tuple(array.shape), raw.astype("<u2").tobytes())


def test_publish_checks_arrays_against_the_served_dtype(s3_loader: tuple[HotLoader, Any, str]) -> None:
    """Issue 27: F32 arrays for a BF16 model and a FULL without config.json are caught before any upload."""
    import cwtrain
    from cwtrain.hotload import DtypeWarning

    loader, s3, bucket = s3_loader
    rng = np.random.default_rng(3)
    arrays = {"lm_head.weight": rng.standard_normal((4, 8)).astype(np.float32), "model.norm.weight": np.ones(8)}
    arrays["model.norm.weight"] = arrays["model.norm.weight"].astype(np.float32)
    config = json.dumps({"model_type": "tiny", "torch_dtype": "bfloat16"}).encode()

    # a FULL without config.json: refused, nothing stored
    with pytest.raises(SnapshotError, match=r"FULL snapshot needs the model's config\.json"):
        loader.publish(arrays, "dt-v000000")
    assert _keys(s3, bucket, "hotload/dt-v000000/") == []
    with pytest.raises(SnapshotError, match="must be a JSON object"):
        loader.publish(arrays, "dt-v000000", extra_files={"config.json": b"[1]"})

    # F32 arrays for a model config.json says is BF16: a warning naming the served dtype
    with pytest.warns(DtypeWarning, match=r"2 of 2 tensors are F32 .* the model is served in BF16") as caught:
        loader.publish(arrays, "dt-v000000", extra_files={"config.json": config})
    assert caught[0].filename == __file__  # points at the caller, not into cwtrain

    # BF16 handed over as TensorData (exported from cwtrain): no warning, BF16 stored
    served = {name: _bf16(a) for name, a in arrays.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.publish(served, "dt-v000001", extra_files={"config.json": config})
    header = s3.get_object(Bucket=bucket, Key="hotload/dt-v000001/model.safetensors")["Body"].read()
    size = int.from_bytes(header[:8], "little")
    assert {t["dtype"] for k, t in json.loads(header[8 : 8 + size]).items() if k != "__metadata__"} == {"BF16"}
    assert cwtrain.TensorData is TensorData

    # a delta of F32 arrays on the BF16 served weights: an error naming both dtypes, nothing stored
    arrays["lm_head.weight"][0, 0] += 1
    with pytest.raises(SnapshotError, match=r"'lm_head\.weight' is F32, served as BF16.*TensorData\('BF16'"):
        loader.publish(arrays, "dt-v000002", previous_identity="dt-v000001", base=served)
    assert _keys(s3, bucket, "hotload/dt-v000002/") == []

    # a FULL checked against base= (the served weights): names, dtypes and shapes must match
    with pytest.raises(SnapshotError, match=r"must match the served weights.*'lm_head\.weight' is F32 \[4, 8\]"):
        loader.publish(arrays, "dt-v000002", base=served, extra_files={"config.json": config})
    wider = {**served, "extra.weight": _bf16(np.zeros(2, np.float32))}
    with pytest.raises(SnapshotError, match=r"'extra\.weight' is not served"):
        loader.publish(wider, "dt-v000002", base=served, extra_files={"config.json": config})


def test_publish_refuses_a_deployment_without_hot_load(fake: FakeAPI, tmp_path: Path) -> None:
    fake.add_deployment("plain", hot_load=False)
    loader = HotLoader(fake.client(), "plain")
    with pytest.raises(ConfigError, match="no hotLoad block"):
        loader.publish(_full_dir(tmp_path / "f", _weights(0)), "x-v000000")
    with pytest.raises(ConfigError, match="CWTRAIN_HOTLOAD_DEPLOYMENT_ID"):
        HotLoader(fake.client(), "")


# ----------------------------------------------------------------------- trigger


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"previous_identity": "a", "snapshot_type": SnapshotType.FULL}, "FULL snapshot has no predecessor"),
        ({"snapshot_type": SnapshotType.INCREMENTAL}, "needs previous_identity"),
    ],
)
def test_trigger_misuse_is_refused_before_io(
    loader: HotLoader, fake: FakeAPI, kwargs: dict[str, Any], message: str
) -> None:
    fake.calls.clear()
    with pytest.raises(SnapshotError, match=message):
        loader.trigger("x", **kwargs)
    assert not fake.calls


def test_trigger_refuses_bad_identity_before_io(loader: HotLoader, fake: FakeAPI) -> None:
    fake.calls.clear()
    for bad in ("a/b", "..", "initial", "x" * 129):
        with pytest.raises(SnapshotError):
            loader.trigger(bad)
    assert not fake.calls


def test_trigger_type_follows_previous_identity(loader: HotLoader, fake: FakeAPI) -> None:
    fake.add_hot_load("h0", "base")
    hot = loader.trigger("next", previous_identity="base")
    assert hot.type is SnapshotType.INCREMENTAL
    assert loader.trigger("other", timeout=5).type is SnapshotType.FULL  # waited for "next" (single-flight)


def test_single_flight_waits_for_the_other_and_resends_the_same_id(
    loader: HotLoader, fake: FakeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_hot_load("other", "someone-else", state="IN_PROGRESS")
    fake.hot_loads["other"]["_steps"] = 0
    with caplog.at_level(logging.INFO):
        hot = loader.trigger("mine", hot_load_id="fixed")
    posts = [c[2]["hotLoadId"] for c in fake.calls if c[:2] == ("POST", "/hotLoads")]
    assert posts == ["fixed", "fixed"]
    assert hot.id == "fixed"
    assert fake.hot_loads["other"]["status"]["state"] == "HOT_LOAD_STATE_COMPLETED"


def test_single_flight_failure_of_the_other_is_not_ours(loader: HotLoader, fake: FakeAPI) -> None:
    fake.add_hot_load("other", "broken", state="PENDING")
    fake.hot_loads["other"]["_steps"] = 0
    fake.fail_identities.add("broken")
    assert loader.trigger("mine").identity == "mine"


def test_single_flight_adopts_our_own_earlier_attempt(loader: HotLoader, fake: FakeAPI) -> None:
    def created_then_in_progress(request: httpx.Request) -> httpx.Response:
        fake._route(request, "/hotLoads", json.loads(request.content))
        return httpx.Response(400, json={"code": "failed_precondition", "message": "a hot-load is already in progress"})

    fake.inject("POST", "/hotLoads", created_then_in_progress)
    hot = loader.trigger("mine", hot_load_id="fixed")
    assert hot.id == "fixed"
    assert list(fake.hot_loads) == ["fixed"]


def test_single_flight_budget_spent(loader: HotLoader, fake: FakeAPI) -> None:
    fake.add_hot_load("other", "slow", state="IN_PROGRESS")
    fake.hot_loads["other"]["_steps"] = -(10**6)
    with pytest.raises(HotLoadInProgressError, match="already in progress"):
        loader.trigger("mine", timeout=0.05)
    with pytest.raises(HotLoadInProgressError):
        loader.trigger("mine", wait_for_active=False)


def test_other_preconditions_are_raised(loader: HotLoader, fake: FakeAPI) -> None:
    fake.inject("POST", "/hotLoads", error_response(400, "failed_precondition", "deployment is not READY"))
    with pytest.raises(CWTrainError, match="not READY") as info:
        loader.trigger("mine")
    assert not isinstance(info.value, HotLoadInProgressError)


# ------------------------------------------------------------------------- chain


def test_chain_limit_refuses_the_64th_delta(loader: HotLoader, fake: FakeAPI) -> None:
    fake.add_hot_load("h0", "v0")
    for i in range(1, 64):
        meta = {"previousSnapshotIdentity": f"v{i - 1}"}
        fake.add_hot_load(f"h{i}", f"v{i}", type="SNAPSHOT_TYPE_INCREMENTAL", incrementalSnapshotMetadata=meta)
    assert loader.chain_deltas("v62") == 63
    loader.trigger("v63-again", previous_identity="v62")  # the 63rd delta is fine
    with pytest.raises(SnapshotError, match=r"64 deltas long.*publish 'v64' as a FULL snapshot"):
        loader.trigger("v64", previous_identity="v63")


def test_chain_uses_the_resolved_snapshot_chain(loader: HotLoader, fake: FakeAPI) -> None:
    chain = [{"identity": "root", "type": "SNAPSHOT_TYPE_FULL"}] + [
        {"identity": f"d{i}", "type": "SNAPSHOT_TYPE_INCREMENTAL"} for i in range(63)
    ]
    fake.add_hot_load(
        "tip",
        "d62",
        type="SNAPSHOT_TYPE_INCREMENTAL",
        incrementalSnapshotMetadata={"previousSnapshotIdentity": "d61"},
        snapshotChain=chain,
    )
    with pytest.raises(SnapshotError, match="FULL"):
        loader.trigger("d63", previous_identity="d62")
    assert loader.chain_deltas("unknown") is None


# -------------------------------------------------------------------------- wait


def test_wait_failure_carries_replica_reasons(loader: HotLoader, fake: FakeAPI) -> None:
    fake.fail_identities.add("bad")
    hot = loader.trigger("bad")
    with pytest.raises(HotLoadFailedError, match=r"checksum mismatch in lm_head\.weight") as info:
        loader.wait(hot.id)
    assert info.value.hot_load.state is HotLoadState.FAILED
    fake.fail_identities.add("bad2")
    assert loader.wait(loader.trigger("bad2").id, raise_on_failure=False).state is HotLoadState.FAILED


def test_wait_timeout(loader: HotLoader, fake: FakeAPI) -> None:
    fake.steps_to_complete = 10**6
    hot = loader.trigger("slow")
    with pytest.raises(HotLoadTimeoutError, match=r"did not finish within 0.05s \(0/2 replicas ready\)"):
        loader.wait(hot.id, timeout=0.05)


def test_waits_adapt_below_the_default_interval_to_a_fast_service(
    fake: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default 5 s poll interval is the cap: an API that answers at once is polled far sooner (issue 27)."""
    import cwtrain.polling as polling

    sleeps: list[float] = []
    real_sleep = polling.time.sleep
    monkeypatch.setattr(polling.time, "sleep", lambda s: (sleeps.append(s), real_sleep(s)))
    loader = HotLoader(fake.client(), "dep-1", timeout=60)
    assert loader.poll_interval == 5.0
    fake.steps_to_complete = 4
    hot = loader.trigger("fast")
    assert loader.wait(hot.id).state is HotLoadState.COMPLETED
    assert len(sleeps) == 3 and all(0 < s < 1.0 for s in sleeps), sleeps  # a fixed 5 s interval: [5.0] * 3
    assert sum(sleeps) < 1.0


def test_wait_tolerates_transient_errors(fake: FakeAPI) -> None:
    loader = HotLoader(fake.client(max_retries=1), "dep-1", timeout=10, poll_interval=0.01)
    hot = loader.trigger("x")
    for _ in range(3):
        fake.inject("GET", f"/hotLoads/{hot.id}", error_response(503, "unavailable"))
    fake.inject("GET", f"/hotLoads/{hot.id}/replicas", error_response(502, None, "bad gateway"))
    assert loader.wait(hot.id).state is HotLoadState.COMPLETED


def test_waits_go_on_through_transport_errors(loader: HotLoader, fake: FakeAPI) -> None:
    def dropped(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection reset")

    loader.client.max_retries = 1
    hot = loader.trigger("x")
    fake.inject("GET", f"/hotLoads/{hot.id}", dropped)
    fake.inject("GET", f"/hotLoads/{hot.id}/replicas", dropped)
    assert loader.wait(hot.id).state is HotLoadState.COMPLETED

    # single-flight: the wait for another hot-load and the listing of hot-loads go on too
    fake.add_hot_load("other", "someone-else", state="IN_PROGRESS")
    fake.hot_loads["other"]["_steps"] = 0
    fake.inject("GET", "/hotLoads/other", dropped)
    assert loader.trigger("mine", hot_load_id="fixed").id == "fixed"


def test_waits_raise_what_is_not_transient(loader: HotLoader, fake: FakeAPI) -> None:
    hot = loader.trigger("x")
    fake.inject("GET", f"/hotLoads/{hot.id}", error_response(403, "permission_denied", "needs Inference Viewer"))
    with pytest.raises(CWTrainError, match="permission_denied"):
        loader.wait(hot.id)


def test_progress_event_summary() -> None:
    from cwtrain.infra.models import HotLoad, HotLoadReplica

    hot = HotLoad.from_api({"spec": {"id": "h", "identity": "a"}, "status": {"state": "HOT_LOAD_STATE_IN_PROGRESS"}})
    replicas = [
        HotLoadReplica.from_api({"name": "r0", "state": "READY", "currentSnapshotIdentity": "a"}),
        HotLoadReplica.from_api({"name": "r1", "state": "UPDATING"}),
        HotLoadReplica.from_api({"name": "r2", "state": "UPDATING"}),
    ]
    event = ProgressEvent.of(hot, replicas, 12.4)
    assert event.summary() == "in_progress after 12s (ready=1, updating=2)"
    assert (event.ready, event.total) == (1, 3)


def test_verify_served(loader: HotLoader, fake: FakeAPI) -> None:
    hot = loader.wait(loader.trigger("x").id)
    assert len(loader.verify_served(hot.id, "x")) == 2
    with pytest.raises(HotLoadVerificationError, match="replica-0: READY on 'x'"):
        loader.verify_served(hot.id, "y")
    fake.replicas[hot.id] = []
    with pytest.raises(HotLoadVerificationError, match="no replicas"):
        loader.verify_served(hot.id, "x")


# --------------------------------------------------------------------- listings


def test_listing_helpers(loader: HotLoader, fake: FakeAPI) -> None:
    assert loader.current_identity() == "initial"
    assert loader.active_hot_load() is None and loader.latest_completed() is None
    fake.add_hot_load("h1", "a")
    fake.add_hot_load("h2", "b", state="FAILED")
    fake.add_hot_load("h3", "a")
    fake.add_hot_load("h4", "c", state="PENDING")
    assert loader.current_identity() == "a"
    assert loader.completed_hot_load("a").id == "h3"  # type: ignore[union-attr]
    assert loader.completed_hot_load("b") is None
    assert loader.active_hot_load().id == "h4"  # type: ignore[union-attr]
    assert [h.id for h in loader.list(limit=2)] == ["h4", "h3"]
    status = loader.status("h1")
    assert status.to_json()["hot_load"]["spec"]["id"] == "h1" and len(status.replicas) == 2


# -------------------------------------------------------------------- rollback


def test_rollback_copies_the_completed_hot_load(
    s3_loader: tuple[HotLoader, Any, str], fake: FakeAPI, tmp_path: Path
) -> None:
    loader, _, _ = s3_loader
    loader.publish(_full_dir(tmp_path / "f", _weights(0)), "r-v000000")
    loader.publish(_full_dir(tmp_path / "g", _weights(1)), "r-v000001")
    back = loader.rollback("r-v000000")
    assert back.state is HotLoadState.COMPLETED and back.identity == "r-v000000" and back.type is SnapshotType.FULL
    assert loader.current_identity() == "r-v000000"
    with pytest.raises(UsageError, match="no COMPLETED hot-load of 'never'"):
        loader.rollback("never")


def test_rollback_refuses_when_objects_are_gone(s3_loader: tuple[HotLoader, Any, str], fake: FakeAPI) -> None:
    loader, _, _ = s3_loader
    fake.add_hot_load("h", "vanished")
    with pytest.raises(SnapshotError, match="'vanished' are gone"):
        loader.rollback("vanished")


# -------------------------------------------------------------------- manifests


def test_manifest_round_trip_and_conflict(s3_loader: tuple[HotLoader, Any, str]) -> None:
    loader, s3, bucket = s3_loader
    assert loader.manifest_key("run-v000003") == "hotload/_manifests/run-v000003.json"
    assert loader.read_manifest("run-v000003") is None
    manifest = {"identity": "run-v000003", "tensors": {"b": "00000001", "a": "00000002"}}
    uri = loader.upload_manifest("run-v000003", manifest)
    assert uri == f"s3://{bucket}/hotload/_manifests/run-v000003.json"
    raw = s3.get_object(Bucket=bucket, Key="hotload/_manifests/run-v000003.json")["Body"].read()
    assert raw == b'{\n"identity": "run-v000003",\n"tensors": {\n"a": "00000002",\n"b": "00000001"\n}\n}'
    assert loader.read_manifest("run-v000003") == manifest
    assert loader.upload_manifest("run-v000003", dict(manifest)) == uri  # identical content: success
    with pytest.raises(SnapshotConflictError):
        loader.upload_manifest("run-v000003", {"identity": "other"})


def test_check_snapshot_access(s3_loader: tuple[HotLoader, Any, str]) -> None:
    loader, s3, bucket = s3_loader
    assert loader.check_snapshot_access() == f"s3://{bucket}/hotload/"
    assert _keys(s3, bucket, "") == []


def test_wait_lets_replicas_catch_up_after_completed(
    loader: HotLoader, fake: FakeAPI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import cwtrain.hotload.follow as follow_module

    hot = loader.trigger("x")

    def replicas(request: httpx.Request) -> httpx.Response:
        items = json.loads(json.dumps(fake.replicas[hot.id]))
        items[0]["currentSnapshotIdentity"] = "initial"
        return httpx.Response(200, json={"replicas": items})

    for _ in range(6):
        fake.inject("GET", f"/hotLoads/{hot.id}/replicas", replicas)
    events: list[ProgressEvent] = []
    assert loader.wait(hot.id, on_progress=events.append).state is HotLoadState.COMPLETED
    assert events[-1].ready == 2 and any(e.hot_load.terminal and e.ready == 1 for e in events)

    # A replica that never catches up: the aggregate state decides after the grace period.
    monkeypatch.setattr(follow_module, "CATCH_UP_SECONDS", 0.05)
    hot = loader.trigger("y")
    loader.wait(hot.id)
    for _ in range(10**3):
        fake.inject("GET", f"/hotLoads/{hot.id}/replicas", replicas)
    with caplog.at_level(logging.WARNING):
        assert loader.wait(hot.id).state is HotLoadState.COMPLETED
    assert any("1/2 replicas serve 'y'" in r.getMessage() for r in caplog.records)
    fake.injected.clear()


def test_publish_accepts_a_snapshot_info(s3_loader: tuple[HotLoader, Any, str], tmp_path: Path) -> None:
    from cwtrain.hotload.files.validate import inspect_snapshot

    loader, s3, bucket = s3_loader
    info = inspect_snapshot(_full_dir(tmp_path / "f", _weights(2)))
    assert loader.publish(info, "info-v000000").type is SnapshotType.FULL
    assert "hotload/info-v000000/config.json" in _keys(s3, bucket, "hotload/info-v000000/")
    with pytest.raises(SnapshotError):
        loader.publish(info, "info-v000001", previous_identity="info-v000000")

"""One budget for the whole publish: uploads included, and nothing created after it ran out.

* ``store-deadline``: an object store that accepts connections and never answers, or stops
  answering in the middle of a multipart upload. The publish ends at its deadline (each
  store call bounded by what is left of the budget, retries included) with an error that
  says nothing was created; what was stored stays and a re-run resumes it. The CLI's
  ``hotload publish --timeout 5`` is timed as a process.
* ``late-create``: a create of the hot-load answered after the budget ran out (a slow
  control plane), and a budget that runs out while a retry of the create waits. A publish
  is never reported failed while the hot-load it created goes live: a create that went out
  is followed to its end, and no create is sent once the budget is spent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _s3_proxy import Request, S3Proxy
from _silent import Silent

from cwtrain.cli import main
from cwtrain.errors import FailedPreconditionError, HotLoadTimeoutError, PublishTimeoutError
from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.loader import HotLoader
from cwtrain.hotload.store import object_writer as objects
from cwtrain.hotload.store.snapshot_upload import upload_snapshot
from cwtrain.infra.enums import HotLoadState, SnapshotType
from cwtrain.infra.objectstore import ObjectStoreDeadlineError
from cwtrain.infra.s3 import object_store, s3_client
from cwtrain.polling import Budget

pytestmark = [pytest.mark.faults]

CORE_TESTS = Path(__file__).resolve().parents[1] / "core"
sys.path.insert(0, str(CORE_TESTS))
from _upload_util import MIB, write_full_snapshot  # noqa: E402
from fakeapi import FakeAPI  # noqa: E402

PART = 5 * MIB


# ------------------------------------------------------------------ a store that never answers


@pytest.mark.fault_row("store-deadline")
def test_an_upload_to_a_store_that_never_answers_ends_at_its_deadline(
    tmp_path: Path, silent: Silent, s3_env: dict[str, str]
) -> None:
    snap = write_full_snapshot(tmp_path / "snap", seed=1)
    store = object_store(silent.endpoint_url)
    started = time.monotonic()
    with pytest.raises(ObjectStoreDeadlineError, match="the deadline passed before the object store answered"):
        upload_snapshot(snap, bucket="silent", identity="never", s3=store, deadline=Budget(2.0))
    took = time.monotonic() - started
    assert 1.9 < took < 3.0, took  # the SDK alone would wait 60 s per attempt, 5 attempts


@pytest.mark.fault_row("store-deadline")
def test_a_store_that_stops_answering_mid_upload_leaves_it_resumable(
    tmp_path: Path, s3_bucket: tuple[Any, str], s3_server: Any, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s3, bucket = s3_bucket
    monkeypatch.setattr(objects, "MIN_PART_SIZE", PART)
    snap = write_full_snapshot(tmp_path / "snap", seed=2)  # a shard of three 5 MiB parts
    release = threading.Event()
    seen_parts: list[str] = []

    def hang_on_the_second_data_part(request: Request) -> None:
        if "partNumber=10000" not in request.path:
            seen_parts.append(request.path)
            if len(seen_parts) == 2:
                release.wait(30)  # the store stops answering

    with S3Proxy(s3_server.endpoint_url) as proxy:
        proxy.on("UploadPart", hang_on_the_second_data_part)
        started = time.monotonic()
        try:
            with pytest.raises(ObjectStoreDeadlineError):
                upload_snapshot(
                    snap,
                    bucket=bucket,
                    identity="stalled",
                    s3=s3_client(proxy.endpoint_url),
                    workers=1,
                    part_size=PART,
                    deadline=Budget(3.0),
                )
            took = time.monotonic() - started
        finally:
            release.set()
    assert took < 4.0, took
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="stalled/").get("Contents", [])]
    assert f"stalled/{INDEX_NAME}" not in keys
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == [
        "stalled/model-00001-of-00002.safetensors"
    ]  # left to resume, as the error says
    sent: list[int] = []
    store = s3_client()
    store.meta.events.register(
        "before-parameter-build.s3.UploadPart", lambda params, **_: sent.append(params["PartNumber"])
    )
    upload_snapshot(snap, bucket=bucket, identity="stalled", s3=store, workers=1, part_size=PART)
    assert 1 not in sent and sent  # the part stored before the store stopped answering is not sent again
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[Any]:
    with shared_stack.view("faults-deadlines", replicas=1) as local:
        yield local


@pytest.fixture(scope="module")
def deployed(stack: Any) -> Any:
    return stack.deploy(name="deadlines", replicas=1)


def _checkpoint(root: Path, seed: int) -> Path:
    from cwtrain.local.engine.model import write_base_checkpoint

    write_base_checkpoint(root, seed=seed)
    return root


@pytest.mark.e2e
@pytest.mark.fault_row("store-deadline")
@pytest.mark.parametrize("given", ["option", "variable"])
def test_cli_publish_with_timeout_5_against_a_store_that_never_answers(
    tmp_path: Path, stack: Any, deployed: Any, silent: Silent, given: str
) -> None:
    """The figure the issue asks for: exit status and wall time of `hotload publish --timeout 5`,
    the same with CWTRAIN_HOTLOAD_TIMEOUT=5 (the CLI honours the library's variable)."""
    ckpt = _checkpoint(tmp_path / "full", seed=5)
    env = {**os.environ, **stack.env(), "CW_S3_ENDPOINT": silent.endpoint_url}
    env.pop("CWTRAIN_HOTLOAD_TIMEOUT", None)
    if given == "variable":
        env["CWTRAIN_HOTLOAD_TIMEOUT"] = "5"
    command = [
        str(Path(sys.executable).parent / "cwtrain"),
        "hotload",
        "publish",
        "--deployment",
        deployed.deployment_id,
    ]
    command += ["--checkpoint", str(ckpt), "--identity", "silent-v000001"]
    command += ["--timeout", "5"] if given == "option" else []
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - started
    print(f"\nhotload publish --timeout 5 against a silent store: exit {done.returncode} after {took:.1f}s")
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "did not finish within 5s" in last and "no hot-load was created" in last, last
    assert took < 5 + 5, took  # 5 s plus one poll interval (the default 5 s), process start included
    with httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}) as api:
        listed = api.get("/v1alpha1/inference/hotLoads", params={"parentDeploymentId": deployed.deployment_id})
    assert "silent-v000001" not in listed.text


# ------------------------------------------------------------------ a create answered late


@pytest.fixture
def fake() -> FakeAPI:
    api = FakeAPI()
    api.add_gateway()
    api.add_deployment()
    return api


@pytest.mark.fault_row("late-create")
def test_a_create_answered_after_the_budget_ran_out_is_followed_to_its_end(
    fake: FakeAPI, s3_bucket: tuple[Any, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s3, bucket = s3_bucket
    fake.deployments["dep-1"]["spec"]["hotLoad"]["bucket"] = bucket
    loader = HotLoader(fake.client(), "dep-1", s3=s3, timeout=1.0, poll_interval=0.01)

    def slow_create(request: httpx.Request) -> httpx.Response:
        time.sleep(1.5)  # the service acts after the caller's budget ran out
        return fake._create_hot_load(json.loads(request.content))

    fake.inject("POST", "/hotLoads", slow_create)
    hot_load = loader.publish(write_full_snapshot(tmp_path / "snap", seed=3), "late-v000001")
    assert hot_load.state is HotLoadState.COMPLETED  # not "did not finish within 1s" while it goes live
    assert "created as the budget of 1s ran out; it may go live, so it is followed to its end" in caplog.text


@pytest.mark.fault_row("late-create")
def test_no_create_is_sent_once_the_budget_is_spent(fake: FakeAPI) -> None:
    """A deployment that is not READY when asked, and is when the budget has run out: nothing is created then."""
    fake.deployments["dep-1"]["status"]["status"] = "STATUS_UPDATING"
    loader = HotLoader(fake.client(), "dep-1", timeout=0.3, poll_interval=0.5)

    def ready_soon() -> None:
        time.sleep(0.1)
        fake.deployments["dep-1"]["status"]["status"] = "STATUS_READY"

    threading.Thread(target=ready_soon).start()
    with pytest.raises(FailedPreconditionError, match="STATUS_UPDATING"):
        loader.trigger("late-v000002")
    time.sleep(0.1)
    assert fake.hot_loads == {}
    assert [c for c in fake.calls if c[:2] == ("POST", "/hotLoads")] and not fake.hot_loads
    with pytest.raises(PublishTimeoutError, match="no hot-load was created"):
        loader.target.create("late-v000003", SnapshotType.FULL, None, budget=Budget(0.0))
    assert fake.hot_loads == {}


@pytest.mark.e2e
@pytest.mark.fault_row("late-create")
def test_cli_publish_whose_create_outlasts_its_timeout_reports_the_hot_load_that_went_live(
    tmp_path: Path,
    stack: Any,
    deployed: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for key, value in stack.env().items():
        monkeypatch.setenv(key, value)
    ckpt = _checkpoint(tmp_path / "full", seed=6)
    stack.faults.api.delay_next(1, seconds=5.0, method="POST", path=r"^/hotLoads$")
    started = time.monotonic()
    argv = ["hotload", "publish", "--deployment", deployed.deployment_id, "--checkpoint", str(ckpt)]
    code = main([*argv, "--identity", "late-v000004", "--timeout", "3", "--poll-interval", "0.2"])
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    print(f"\nhotload publish --timeout 3, create answered after 5 s: exit {code} after {took:.1f}s")
    assert code == 0, err[-2000:]
    assert json.loads(out)["status"]["state"] == "COMPLETED"
    assert "it may go live, so it is followed to its end" in caplog.text
    client = HotLoader(_client(stack), deployed.deployment_id)
    assert client.current_identity() == "late-v000004"


def _client(stack: Any) -> Any:
    from cwtrain.infra import InferenceClient

    return InferenceClient(stack.token, base_url=stack.api_url)


@pytest.mark.fault_row("late-create")
def test_the_wait_timeout_says_the_hot_load_may_still_go_live() -> None:
    """A budget that ends during the wait: the error names the hot-load and how to follow it."""
    from cwtrain.infra.models import HotLoad

    running = HotLoad.from_api(
        {"spec": {"id": "h1", "identity": "x-v1"}, "status": {"state": "HOT_LOAD_STATE_IN_PROGRESS"}}
    )
    text = str(HotLoadTimeoutError(running, [], 5.0))
    assert "did not finish within 5s" in text and "may still go live" in text and "cwtrain hotload wait h1" in text

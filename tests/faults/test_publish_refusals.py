"""What the service would refuse after the upload is refused before it (issue 33), through the CLI.

On the local stack (real control plane, engine replica, S3 server), ``cwtrain hotload publish``
of a delta whose ``--previous-identity`` is a typo, ``initial``, or an identity whose snapshot
is gone from the bucket: exit 1, one ``error:`` line naming ``--previous-identity``, nothing
stored under the new identity (no object, no unfinished upload), no hot-load created, and the
same identity publishes once the predecessor is right. A FULL directory of F32 tensors whose
``config.json`` declares bfloat16 gets the in-memory path's ``DtypeWarning`` as one
``warning:`` line. A run's session asks the bucket nothing about its own predecessors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _recording import one_error_line, run_cli

from cwtrain.hotload import DtypeWarning, HotLoader, HotLoadSettings, PublishSession
from cwtrain.hotload.files.checkpoint import load_full_dir
from cwtrain.hotload.files.validate import inspect_snapshot
from cwtrain.hotload.files.write import write_delta
from cwtrain.hotload.format.index import INDEX_NAME, SINGLE_FILE_NAME
from cwtrain.hotload.format.safetensors import TensorEntry, encode_header
from cwtrain.hotload.store.prefix import SnapshotStore
from cwtrain.infra import InferenceClient
from cwtrain.local import LocalStack
from cwtrain.local.engine.model import init_weights, to_tensor_data, write_base_checkpoint

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("wrong-predecessor"), pytest.mark.e2e]

POLL = ("--poll-interval", "0.1", "--timeout", "120")


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[LocalStack]:
    with shared_stack.view("refusals", replicas=1) as local, pytest.MonkeyPatch.context() as patch:
        for key, value in local.env().items():
            patch.setenv(key, value)
        yield local


@pytest.fixture(scope="module")
def target(stack: LocalStack) -> Any:
    return stack.deploy(name="refusals")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The base weights, the next ones, and the delta between them."""
    root = tmp_path_factory.mktemp("refusals")
    write_base_checkpoint(root / "v0", seed=1)
    write_base_checkpoint(root / "v1", seed=2)
    write_delta(root / "v0", root / "v1", root / "d1", version="000001", base_version="000000")
    return {"v0": root / "v0", "d1": root / "d1"}


def _publish(target: Any, checkpoint: Path, identity: str, *more: str) -> tuple[int, Any, str]:
    code, out, err = run_cli(
        ["hotload", "publish", "--deployment", target.deployment_id, "--checkpoint", str(checkpoint),
         "--identity", identity, *more, *POLL]
    )  # fmt: skip
    return code, json.loads(out) if out.strip() else None, err


def _stored(stack: LocalStack, identity: str) -> list[str]:
    """Every object and unfinished multipart upload under ``hotload/<identity>/``."""
    s3, prefix = stack.s3_client(), f"hotload/{identity}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=stack.bucket, Prefix=prefix).get("Contents", [])]
    uploads = s3.list_multipart_uploads(Bucket=stack.bucket, Prefix=prefix).get("Uploads", [])
    return keys + [u["Key"] for u in uploads]


def _hot_loads(stack: LocalStack, target: Any, identity: str) -> list[dict[str, Any]]:
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        return [h.to_json() for h in api.list_hot_loads(target.deployment_id) if h.identity == identity]


def _baseline(target: Any, checkpoints: dict[str, Path], run: str) -> str:
    identity = f"{run}-v000000"
    code, hot, err = _publish(target, checkpoints["v0"], identity)
    assert code == 0 and hot["status"]["state"] == "COMPLETED", err
    return identity


def _refused(stack: LocalStack, target: Any, result: tuple[int, Any, str], identity: str) -> str:
    """Exit 1, nothing on stdout, one error line; nothing stored and no hot-load for ``identity``."""
    code, hot, err = result
    assert code == 1 and hot is None, err
    line = one_error_line(err)
    assert "--previous-identity" in line and f"nothing was stored under {identity!r}" in line
    assert _stored(stack, identity) == []
    assert _hot_loads(stack, target, identity) == []
    return line


def _published(target: Any, checkpoints: dict[str, Path], identity: str, previous: str) -> None:
    code, hot, err = _publish(target, checkpoints["d1"], identity, "--previous-identity", previous)
    assert code == 0, err
    assert hot["status"]["state"] == "COMPLETED" and hot["spec"]["identity"] == identity
    assert hot["spec"]["incremental_snapshot_metadata"]["previous_snapshot_identity"] == previous


def test_a_predecessor_that_never_completed_is_refused_before_the_upload(
    stack: LocalStack, target: Any, checkpoints: dict[str, Path]
) -> None:
    base = _baseline(target, checkpoints, "typo")
    line = _refused(
        stack, target, _publish(target, checkpoints["d1"], "typo-v000001", "--previous-identity", "typo-v00000"),
        "typo-v000001",
    )  # fmt: skip
    assert "previous identity 'typo-v00000'" in line and "never completed on deployment" in line
    assert f"the deployment's newest completed identity is {base!r}: name that one" in line
    _published(target, checkpoints, "typo-v000001", base)  # the same identity, once the input is right


def test_initial_as_a_predecessor_is_refused_saying_why(
    stack: LocalStack, target: Any, checkpoints: dict[str, Path]
) -> None:
    base = _baseline(target, checkpoints, "init")
    result = _publish(target, checkpoints["d1"], "init-v000001", "--previous-identity", "initial")
    line = _refused(stack, target, result, "init-v000001")
    assert "previous identity 'initial'" in line and "reserved name" in line and "base weights" in line
    _published(target, checkpoints, "init-v000001", base)


def test_a_predecessor_gone_from_the_bucket_is_refused(
    stack: LocalStack, target: Any, checkpoints: dict[str, Path]
) -> None:
    base = _baseline(target, checkpoints, "gone")
    s3, key = stack.s3_client(), f"hotload/{base}/{INDEX_NAME}"
    index = s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read()
    s3.delete_object(Bucket=stack.bucket, Key=key)
    result = _publish(target, checkpoints["d1"], "gone-v000001", "--previous-identity", base)
    line = _refused(stack, target, result, "gone-v000001")
    assert f"previous identity {base!r}" in line and "has no snapshot in the bucket" in line
    s3.put_object(Bucket=stack.bucket, Key=key, Body=index)  # the predecessor stored again
    _published(target, checkpoints, "gone-v000001", base)


def test_a_trigger_on_an_unknown_predecessor_creates_no_hot_load(stack: LocalStack, target: Any) -> None:
    code, out, err = run_cli(
        ["hotload", "trigger", "--deployment", target.deployment_id, "--identity", "never-v000001",
         "--previous-identity", "never-v000000", "--no-verify"]
    )  # fmt: skip
    assert code == 1 and not out.strip()
    line = one_error_line(err)
    assert "previous identity 'never-v000000' (--previous-identity" in line and "never completed" in line
    assert _hot_loads(stack, target, "never-v000001") == []


def _f32_copy(source: Path, dest: Path) -> Path:
    """``source``'s BF16 weights widened to F32 (the same values), its config.json (torch_dtype bfloat16) kept."""
    dest.mkdir()
    (dest / "config.json").write_bytes((source / "config.json").read_bytes())
    entries, blobs, offset = [], [], 0
    for name, tensor in sorted(load_full_dir(source).items()):
        assert tensor.dtype == "BF16"
        wide = (np.frombuffer(bytes(memoryview(tensor.data)), dtype=np.uint16).astype(np.uint32) << 16).tobytes()
        entries.append(TensorEntry(name, "F32", tuple(tensor.shape), offset, offset + len(wide)))
        blobs.append(wide)
        offset += len(wide)
    (dest / SINGLE_FILE_NAME).write_bytes(encode_header(entries) + b"".join(blobs))
    return dest


def test_a_full_directory_in_another_dtype_warns_as_the_in_memory_path_does(
    stack: LocalStack, target: Any, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    wide = _f32_copy(checkpoints["v0"], tmp_path / "f32")
    with pytest.warns(DtypeWarning, match="declares torch_dtype 'bfloat16': the model is served in BF16"):
        inspect_snapshot(wide)  # what publish, upload and `hotload inspect` of the directory run first
    code, out, err = run_cli(["hotload", "inspect", str(wide)])
    assert code == 0 and json.loads(out)["type"] == "FULL"
    warned = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "tensors are F32" in warned[0] and "served in BF16" in warned[0], err
    code, hot, err = _publish(target, wide, "wide-v000000", "--no-wait")
    assert code == 0 and hot["spec"]["type"] == "FULL", err  # warned, then published
    warned = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and str(wide) in warned[0] and "served in BF16" in warned[0], err


def test_a_run_asks_the_bucket_nothing_about_its_own_predecessors(
    stack: LocalStack, target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frameworks' path: each delta's check reuses the listing its chain count made, and what it stored."""
    heads: list[str] = []
    lists: list[str] = []
    real_exists, real_list = SnapshotStore.index_exists, InferenceClient.list_hot_loads

    def index_exists(store: SnapshotStore, identity: str) -> bool:
        heads.append(identity)
        return real_exists(store, identity)

    def list_hot_loads(client: InferenceClient, *args: Any, **kwargs: Any) -> Any:
        lists.append("list")
        return real_list(client, *args, **kwargs)

    monkeypatch.setattr(SnapshotStore, "index_exists", index_exists)
    monkeypatch.setattr(InferenceClient, "list_hot_loads", list_hot_loads)
    with InferenceClient(stack.token, base_url=stack.api_url) as api:
        loader = HotLoader(api, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=0.1)
        session = PublishSession(HotLoadSettings(target.deployment_id, "run", timeout=120.0), target=loader.target)
        base = dict(to_tensor_data(init_weights(seed=5)))
        files = {"config.json": json.dumps({"torch_dtype": "bfloat16"}).encode()}
        session.publish_tensors(session.begin(), base, extra_files=files)
        served = base
        counts: list[tuple[int, int]] = []
        for step in (1, 2):
            new = dict(served)
            name = sorted(new)[step]
            changed = np.frombuffer(new[name].data, dtype=np.uint8).copy()
            changed[::2] ^= 1
            new[name] = type(new[name])(new[name].dtype, new[name].shape, changed.tobytes())
            plan = session.begin()
            assert not plan.full
            heads.clear()
            before = len(lists)
            outcome = session.publish_tensors(plan, new, base=served)
            assert outcome.completed and outcome.incremental
            counts.append((len(heads), len(lists) - before))
            served = new
        assert all(head == 0 for head, _ in counts), counts  # no HEAD of a predecessor it stored itself
        # The check itself: the one listing the chain count made before it, and (for a predecessor
        # this process did not store) one HEAD of its index: a new loader, as another process is.
        other = HotLoader(api, target.deployment_id, s3=stack.s3_client(), timeout=120, poll_interval=0.1)
        heads.clear()
        before = len(lists)
        other.target.check_delta("run-v000003", str(session.served_identity))
        assert heads == [session.served_identity] and len(lists) - before == 1
        heads.clear()
        other.target.check_delta("run-v000003", str(session.served_identity))  # known now: no HEAD
        assert heads == []

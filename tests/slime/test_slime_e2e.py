"""slime against cwtrain-local: the hook publishes a simulated run, rollouts report what served them.

One stack (moto S3, control plane, gateway, two engine replicas) serves every test of the
module. A simulated slime run writes a delta root and five ``weight_vNNNNNN`` versions in
slime's delta format (built with the codec's ``write_delta`` from real tiny-model
checkpoints) and calls the hook the way slime does.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _reference_snapshot import assert_same_weights, bucket_reader, check_served, decode_chain
from slime_driver import slime_args

pytestmark = pytest.mark.e2e

torch = pytest.importorskip("torch")

RUN = "e2e"
INDEX = "model.safetensors.index.json"
EVERY = 3


@pytest.fixture(scope="module")
def stack(shared_stack: Any) -> Iterator[Any]:
    with shared_stack.view("slime-e2e", replicas=2) as local:
        yield local, local.deploy()


@pytest.fixture
def stack_env(stack: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    local, target = stack
    for key, value in local.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", target.deployment_id)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_FULL_EVERY", str(EVERY))
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "120")
    monkeypatch.setenv("CWTRAIN_ROLLOUT_BASE_URL", target.base_url)
    monkeypatch.setenv("CWTRAIN_ROLLOUT_MODEL", target.model)
    monkeypatch.setenv("CWTRAIN_ROLLOUT_API_KEY", local.token)
    monkeypatch.setattr("cwtrain.hotload.lifecycle.target.POLL_INTERVAL", 0.1)
    return target


def _loader(deployment_id: str) -> Any:
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.infra.client import InferenceClient

    return HotLoader(InferenceClient(), deployment_id, poll_interval=0.1)


def _checkpoint(directory: Path, weights: dict[str, Any]) -> Path:
    from cwtrain.local.engine.model import CHECKPOINT_FILE, weights_to_safetensors

    directory.mkdir(parents=True)
    (directory / CHECKPOINT_FILE).write_bytes(weights_to_safetensors(weights, {"format": "pt"}))
    return directory


def _trained(weights: dict[str, Any], step: int) -> dict[str, Any]:
    """One "training step": a few tensors move (none at all on step 4: an empty delta)."""
    if step == 4:
        return dict(weights)
    out = dict(weights)
    names = sorted(weights)
    for name in (names[step % len(names)], names[(3 * step) % len(names)]):
        out[name] = (weights[name].float() + 0.01 * step).to(weights[name].dtype)
    return out


class SimulatedSlime:
    """slime's delta updater, reduced to its files and hook calls (rank 0 and rank 1)."""

    def __init__(self, tmp: Path, hook_path: str) -> None:
        from slime.utils.misc import load_function

        from cwtrain.local.engine.model import write_base_checkpoint

        self.tmp = tmp
        self.hf = tmp / "hf"
        write_base_checkpoint(self.hf, seed=0)  # the deployment's base weights
        self.args = slime_args(tmp, self.hf, custom_update_weight_post_write_path=hook_path)
        self.root = Path(self.args.update_weight_disk_dir)
        self.hook = load_function(hook_path)
        from cwtrain.local.engine.model import load_checkpoint

        self.weights = load_checkpoint(self.hf)[1]
        self.previous = self.hf
        self.version = 0

    def call(self, directory: Path, ranks: range) -> Any:
        result = None
        for rank in ranks:
            outcome = self.hook(argparse.Namespace(**{**vars(self.args), "rank": rank}), str(directory), [])
            if rank == 0:
                result = outcome
        return result

    def baseline(self) -> Any:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        return self.call(self.root, range(1))

    def write_next(self) -> Path:
        from cwtrain.hotload.files.write import write_delta

        self.version += 1
        self.weights = _trained(self.weights, self.version)
        checkpoint = _checkpoint(self.tmp / "ckpt" / f"v{self.version}", self.weights)
        directory = self.root / f"weight_v{self.version:06d}"
        write_delta(
            self.previous, checkpoint, directory, version=f"{self.version:06d}", base_version=f"{self.version - 1:06d}"
        )
        self.previous = checkpoint
        return directory

    def step(self) -> Any:
        return self.call(self.write_next(), range(2))


def _served_by_both(loader: Any, identity: str) -> None:
    hot_load = loader.completed_hot_load(identity)
    assert hot_load is not None, identity
    replicas = loader.client.list_hot_load_replicas(hot_load.id)
    assert len(replicas) == 2 and all(r.caught_up(identity) for r in replicas), replicas
    assert loader.current_identity() == identity


def _rollout(args: argparse.Namespace, rollout_id: int) -> list[list[Any]]:
    from slime.rollout.data_source import DataSource
    from slime.utils.misc import load_function

    from cwtrain.integrations.slime.rollout import generate_rollout

    assert load_function(args.rollout_function_path) is generate_rollout
    source = DataSource(args, [("1+1=", "2"), ("abc", "d")])
    output = load_function(args.rollout_function_path)(args, rollout_id, source, evaluation=False)
    assert len(output.samples) == args.rollout_batch_size
    assert output.metrics["coreweave/samples"] == args.rollout_batch_size * args.n_samples_per_prompt
    return output.samples


def test_hook_publishes_a_slime_run_and_rollouts_report_the_served_version(
    slime_stubs: Path, tmp_path: Path, stack: Any, stack_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slime.observability.logging_utils import RECORDS

    from cwtrain.infra.enums import SnapshotType
    from cwtrain.integrations.slime.rollout import set_tokenizer
    from cwtrain.local.engine.model import Tokenizer

    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", RUN)
    set_tokenizer(Tokenizer())
    loader = _loader(stack_env.deployment_id)
    run = SimulatedSlime(tmp_path, "cwtrain.integrations.slime.hook")
    RECORDS.clear()

    local, target = stack
    metrics = [run.baseline()]
    _served_by_both(loader, f"{RUN}-v000000")
    check_served(local, target.deployment_id, target.path_prefix, f"{RUN}-v000000", run.weights)
    served = 0
    for step in range(1, 6):
        metrics.append(run.step())
        if step != 4:
            served = step
        identity = f"{RUN}-v{served:06d}"
        _served_by_both(loader, identity)
        # byte for byte by the tests' reference reader: the chain in the bucket and every replica
        # (step 4 changed nothing, so the trainer's weights are still version 3's)
        check_served(local, target.deployment_id, target.path_prefix, identity, run.weights)
        for group in _rollout(run.args, step):
            assert len(group) == run.args.n_samples_per_prompt
            for sample in group:
                assert sample.weight_versions[-1] == str(served)
                assert sample.status.name in ("COMPLETED", "TRUNCATED")
                assert sample.response_length == len(sample.tokens) - len(Tokenizer().encode(sample.prompt))
                assert sample.reward in (0.0, 1.0)
                assert sample.rollout_log_probs is not None and len(sample.rollout_log_probs) == sample.response_length

    kinds = {}
    for version in (0, 1, 2, 3, 5):
        hot_load = loader.completed_hot_load(f"{RUN}-v{version:06d}")
        kinds[version] = (hot_load.type, hot_load.previous_identity)
    assert kinds == {
        0: (SnapshotType.FULL, None),
        1: (SnapshotType.INCREMENTAL, f"{RUN}-v000000"),
        2: (SnapshotType.INCREMENTAL, f"{RUN}-v000001"),
        3: (SnapshotType.FULL, None),  # the chain is cut at F = 3, from the served copy
        5: (SnapshotType.INCREMENTAL, f"{RUN}-v000003"),  # v4 was empty: never published
    }
    assert loader.completed_hot_load(f"{RUN}-v000004") is None
    assert metrics[4]["hotload/skipped_empty"] == 1.0
    assert metrics[3]["hotload/chain_cut"] == 1.0
    assert metrics[1]["hotload/replicas_ready"] == 2.0 and metrics[1]["hotload/completed"] == 1.0
    assert loader.read_manifest(f"{RUN}-v000003")["version"] == "000003"

    # slime discards the hook's return value: the same metrics reached slime's logger, one record a version
    logged = {int(m["hotload/step"]): m for m, key in RECORDS if key == "hotload/step"}
    assert sorted(logged) == [0, 1, 2, 3, 4, 5]
    for version, (kind, chain, served) in {
        0: ("FULL", 0, 0),
        1: ("INCREMENTAL", 1, 1),
        2: ("INCREMENTAL", 2, 2),
        3: ("FULL", 0, 3),
        4: (None, 0, 3),
        5: ("INCREMENTAL", 1, 5),
    }.items():
        record = logged[version]
        assert record == metrics[version] | {"hotload/step": float(version)}, version
        assert (record["hotload/chain_length"], record["hotload/served_version"]) == (chain, served), version
        if kind is None:
            assert record["hotload/skipped_empty"] == 1.0 and record["hotload/published"] == 0.0
            continue
        assert record["hotload/incremental"] == float(kind == "INCREMENTAL"), version
        assert record["hotload/snapshot_bytes"] > 0
        assert record["hotload/publish_seconds"] >= record["hotload/hot_load_seconds"] > 0


@pytest.mark.slow
def test_actor_hook_overlaps_publish_with_the_next_step(
    slime_stubs: Path,
    tmp_path: Path,
    stack: Any,
    stack_env: Any,
    monkeypatch: pytest.MonkeyPatch,
    ray_session: Any,
) -> None:
    ray = ray_session  # the session's Ray (tests/conftest.py): starting one takes seconds
    from cwtrain.integrations.slime import drain
    from cwtrain.integrations.slime.actor import actor_name

    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "actor")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_FULL_EVERY", "0")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MIRROR", "0")
    loader = _loader(stack_env.deployment_id)
    try:
        run = SimulatedSlime(tmp_path, "cwtrain.integrations.slime.actor_hook")
        baseline = run.baseline()  # waited for: the first rollout must see it
        assert baseline["hotload/completed"] == 1.0
        _served_by_both(loader, "actor-v000000")

        returned_after: list[float] = []
        previous_metrics: list[Any] = []
        for _ in range(2):
            directory = run.write_next()
            started = time.perf_counter()
            previous_metrics.append(run.call(directory, range(2)))
            returned_after.append(time.perf_counter() - started)
            # "step k+1" runs now, while version k uploads and hot-loads in the actor
        assert previous_metrics[0] is None  # nothing was in flight before version 1
        first = previous_metrics[1]  # version 1's metrics arrive one step late
        publish_seconds = first["hotload/upload_seconds"] + first["hotload/hot_load_seconds"]
        assert returned_after[0] < publish_seconds, (returned_after, publish_seconds)
        assert drain(stack_env.deployment_id, timeout=120) == "actor-v000002"
        _served_by_both(loader, "actor-v000002")
        check_served(stack[0], stack_env.deployment_id, stack_env.path_prefix, "actor-v000002", run.weights)
    finally:  # the actor goes with this test (Ray stays): nothing can pick it up by name later
        name = actor_name(stack_env.deployment_id)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name))
        deadline = time.monotonic() + 60
        while True:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            assert time.monotonic() < deadline, f"the actor {name} outlived ray.kill"
            time.sleep(0.05)


def test_actor_hook_failure_surfaces_at_the_next_step(
    slime_stubs: Path, tmp_path: Path, stack_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwtrain.errors import CWTrainError
    from cwtrain.integrations.slime import HookConfig
    from cwtrain.integrations.slime.actor import ActorPublishClient, PublishingActor

    class InlineHandle:
        """The actor called in-process (same contract as a Ray handle: .remote() then ray.get)."""

        def __init__(self, actor: PublishingActor) -> None:
            self.actor = actor

        def __getattr__(self, name: str) -> Any:
            method = getattr(self.actor, name)

            class Remote:
                @staticmethod
                def remote(*args: Any) -> Any:
                    try:
                        return ("ok", method(*args))
                    except BaseException as exc:
                        return ("error", exc)

            return Remote

    monkeypatch.setattr(
        "cwtrain.integrations.slime.actor.ray_module",
        lambda: type("R", (), {"get": staticmethod(lambda ref, timeout=None: _unwrap(ref))}),
    )
    run = SimulatedSlime(tmp_path, "cwtrain.integrations.slime.hook")
    config = HookConfig.from_env(default_run_id="fail", full_every=0, state_dir=str(tmp_path / "state"))
    client = ActorPublishClient(config, actor=InlineHandle(PublishingActor(config)))
    client.submit(run.args, str(run.root))
    run.root.mkdir(exist_ok=True)
    bad = run.write_next()
    (bad / "model.safetensors.index.json").write_text('{"metadata": {"base_version": "000007"}, "weight_map": {}}')
    assert client.submit(run.args, str(bad)) is None  # handed over; the failure is not lost
    with pytest.raises(CWTrainError, match="in order"):
        client.submit(run.args, str(run.write_next()))


def _unwrap(ref: Any) -> Any:
    kind, value = ref
    if kind == "error":
        raise value
    return value


class ThreadCollective:
    """``world_size`` ranks as threads of this process (the collectives torch.distributed gives slime)."""

    def __init__(self, world_size: int) -> None:
        import threading

        self.world_size = world_size
        self._barrier = threading.Barrier(world_size)
        self._slots: list[Any] = [None] * world_size

    def rank_view(self, rank: int) -> Any:
        collective = self

        class View:
            world_size = collective.world_size

            def __init__(self) -> None:
                self.rank = rank

            def all_gather_object(self, obj: Any) -> list[Any]:
                collective._barrier.wait()
                collective._slots[rank] = obj
                collective._barrier.wait()
                out = list(collective._slots)
                collective._barrier.wait()
                return out

            def broadcast_object(self, obj: Any, src: int = 0) -> Any:
                return self.all_gather_object(obj)[src]

        return View()


def _objects(local: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = local.s3_client()
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return {
        o["Key"].rsplit("/", 1)[1]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        for o in listed.get("Contents", [])
    }


def test_live_tensor_actor_publishes_the_same_bytes_as_the_directory_path(
    slime_stubs: Path, tmp_path: Path, stack: Any, stack_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor
    from slime.ray.placement_group import create_training_models

    from cwtrain.integrations.slime import make_actor_cls

    local, target = stack
    loader = _loader(target.deployment_id)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_FULL_EVERY", "0")
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MIRROR", "0")

    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "dir")
    run = SimulatedSlime(tmp_path / "dir", "cwtrain.integrations.slime.hook")
    run.baseline()
    run.step()
    run.step()

    from slime.observability.logging_utils import RECORDS

    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", "live")
    RECORDS.clear()
    actor_cls = make_actor_cls(MegatronTrainRayActor)
    assert issubclass(actor_cls, MegatronTrainRayActor)
    args = slime_args(tmp_path / "live", run.hf)
    actor, critic = create_training_models(args, {}, None, actor_cls=actor_cls)
    assert critic is None and type(actor) is actor_cls
    from cwtrain.local.engine.model import load_checkpoint

    actor.weights = load_checkpoint(run.hf)[1]
    actor.update_weights()  # the baseline: --hf-checkpoint as live-v000000
    _served_by_both(loader, "live-v000000")
    for step in (1, 2):
        trained = _trained(actor.weights, step)
        for name, tensor in actor.weights.items():  # an optimizer step updates parameters in place
            tensor.copy_(trained[name])
        actor.update_weights()
        _served_by_both(loader, f"live-v{step:06d}")
        check_served(local, target.deployment_id, target.path_prefix, f"live-v{step:06d}", actor.weights)
    logged = [m for m, key in RECORDS if key == "hotload/step"]
    assert [(m["hotload/step"], m["hotload/served_version"]) for m in logged] == [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)]
    assert logged[2]["hotload/incremental"] == 1.0 and logged[2]["hotload/chain_length"] == 2.0
    assert logged[2]["hotload/publish_seconds"] >= logged[2]["hotload/hot_load_seconds"] > 0

    for version in (1, 2):
        expected = _objects(local, target.bucket, f"{target.path_prefix}/dir-v{version:06d}")
        got = _objects(local, target.bucket, f"{target.path_prefix}/live-v{version:06d}")
        assert sorted(got) == sorted(expected) and len(got) >= 2
        for name, data in expected.items():
            assert got[name] == data.replace(b'"dir-v', b'"live-v'), name


def test_every_rank_encodes_its_tensors_and_rank_zero_commits(
    tmp_path: Path, stack: Any, stack_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import threading

    from cwtrain.integrations.slime import HookConfig
    from cwtrain.integrations.slime.tensors import TensorPublisher
    from cwtrain.local.engine.model import load_checkpoint, write_base_checkpoint

    local, target = stack
    write_base_checkpoint(tmp_path / "hf", seed=0)
    weights = load_checkpoint(tmp_path / "hf")[1]
    names = sorted(weights)
    owned = {0: names[::2], 1: names[1::2]}  # each rank holds half the tensors
    args = slime_args(tmp_path, tmp_path / "hf")
    config = HookConfig.from_env(default_run_id="ranks", full_every=3, state_dir=str(tmp_path / "state"))
    collective = ThreadCollective(2)

    def moved(base: dict[str, Any], which: list[str], by: float) -> dict[str, Any]:
        return {n: (t.float() + by).to(t.dtype) if n in which else t for n, t in base.items()}

    one = moved(weights, [names[0]], 0.01)  # only rank 0's tensors change
    two = moved(one, [names[1], names[2]], 0.02)  # both ranks' tensors change
    steps = [weights, one, two, moved(two, [names[3]], 0.03)]
    metrics: dict[int, list[Any]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            publisher = TensorPublisher(config, collective.rank_view(rank))
            for step in steps:
                metrics[rank].append(publisher.publish(args, ((n, step[n]) for n in owned[rank])))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert metrics[1] == [None] * 4 and all(m is not None for m in metrics[0])
    loader = _loader(target.deployment_id)
    _served_by_both(loader, "ranks-v000003")
    check_served(local, target.deployment_id, target.path_prefix, "ranks-v000003", steps[3])
    read = bucket_reader(local.s3_client(), target.bucket, target.path_prefix)
    for version in (1, 2):  # the deltas before the cut, both ranks' shards, decode to the steps' weights too
        assert_same_weights(decode_chain(read, f"ranks-v{version:06d}"), steps[version], f"ranks-v{version:06d}")
    delta = _objects(local, target.bucket, f"{target.path_prefix}/ranks-v000002")
    index = json.loads(delta[INDEX])
    assert index["metadata"]["base_version"] == "ranks-v000001"
    assert sorted(set(index["weight_map"].values())) == [
        "model-00000-of-00002.safetensors",
        "model-00001-of-00002.safetensors",
    ]
    assert set(index["weight_map"]) < set(names)
    first = json.loads(_objects(local, target.bucket, f"{target.path_prefix}/ranks-v000001")[INDEX])
    assert set(first["weight_map"].values()) == {"model-00000-of-00001.safetensors"}  # only rank 0 had changes
    full = _objects(local, target.bucket, f"{target.path_prefix}/ranks-v000003")  # 3 % F == 0: a FULL cut
    full_index = json.loads(full[INDEX])
    assert sorted(full_index["weight_map"]) == names
    # the cut carries --hf-checkpoint's side files, as a FULL snapshot must (config.json first)
    hf = tmp_path / "hf"
    side = sorted(p.name for p in hf.iterdir() if p.is_file() and not p.name.startswith("model"))
    assert "config.json" in side and all(full[name] == (hf / name).read_bytes() for name in side)
    assert "config.json" not in delta
    assert loader.completed_hot_load("ranks-v000003").previous_identity is None
    assert loader.read_manifest("ranks-v000003")["tensors"].keys() == set(names)
    from cwtrain.hotload.format.checksum import adler32_hex
    from cwtrain.local.engine.model import to_tensor_data

    expected = {n: adler32_hex(t.data) for n, t in to_tensor_data(steps[2]).items()}
    assert loader.read_manifest("ranks-v000002")["tensors"] == expected  # a delta's manifest: all tensors

"""Every publisher behaves alike on the shared local stack (issue 23, "Done when").

One test, parametrized over every way cwtrain publishes a version, each driven through the
framework's own entry point with the framework's stand-in:

* ``slime-disk`` — slime's post-write hook (``cwtrain.integrations.slime.hook``) on slime's
  delta directories (the baseline call with the delta root, then ``weight_v000001``);
* ``slime-live`` — slime's live-tensor path, :class:`~cwtrain.integrations.slime.tensors.TensorPublisher`
  with a world of one;
* ``miles`` — miles' post-save hook (``cwtrain.integrations.miles.post_save_hook``) on an HF
  export with miles' ``.complete`` marker (its first call publishes the baseline too), with
  miles' tracking stand-in (tests/miles/stubs) as the run's logger;
* ``nemo-rl`` — the NeMo-RL synchronizer with one in-process policy worker (tests/nemo_rl/standin);
* ``demo`` — the demo's way: :meth:`cwtrain.hotload.PublishSession.publish_tensors`.

Each publishes the same weights as the same versions under a run id of its own (identities
are immutable, so the same identity cannot be published twice), all run ids the same length
(so the indexes, which name the identities, have the same size). Settings come from the
``CWTRAIN_HOTLOAD_*`` variables, read by each publisher the way it reads them in a real run.

What each must show:

* **READY waited**: the deployment is made not-READY (``STATUS_UPDATING``) just before version 1;
  the hot-load is refused, the publisher waits for READY (once the wait is logged the status
  goes back to READY) and the version completes.
* **``CWTRAIN_HOTLOAD_VERIFY`` honoured**: with it on, ``hotload/replicas_verified`` is the
  number of replicas for every version; with it off, 0.
* **One deadline**: with ``CWTRAIN_HOTLOAD_TIMEOUT=T`` and a deployment that stays not-READY,
  the publish fails after about ``T`` seconds, never two budgets' worth, and where the
  publisher reports the failed outcome (NeMo-RL's metrics sink, the demo's session sink),
  ``hotload/publish_seconds`` is at most ``T``.
* **The same metrics**: the same ``hotload/*`` names from every publisher, and for version 1
  (the same delta snapshot, byte for byte, from every publisher) the same values, timings
  excepted; version 0 comes from a directory for the three slime/miles hooks and from tensors
  for NeMo-RL and the demo, so only its source-independent values must agree (and
  ``replay_bytes``, which counts version 0's bytes, is checked per publisher against the
  snapshots it stored).

The served bytes are checked too, with the tests' reference reader (tests/_reference_snapshot.py).

With the defaults (no ``CWTRAIN_HOTLOAD_VERIFY``, the mirror on), a replica that reports version
1 loaded but keeps version 0 fails that version in every publisher, which brings every replica
back to version 0, and the next version is FULL and served by every replica (fault row
``defaults-converge``); with a shard of version 1 corrupted in the bucket and version 2's
hot-load failing, every publisher goes back to version 0, whose chain can be replayed, not to
version 1 (``way-back-checked``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _reference_snapshot import check_served

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
torch = pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parents[1]
for _helper in (TESTS / "slime", TESTS / "nemo_rl" / "standin"):  # slime_driver; NeMo-RL's stand-ins
    if str(_helper) not in sys.path:
        sys.path.insert(0, str(_helper))
MILES_STUBS = TESTS / "miles" / "stubs"

PUBLISHERS = ("slime-disk", "slime-live", "miles", "nemo-rl", "demo")
REPLICAS = 2
#: Metrics that are durations: they differ from run to run.
TIMINGS = frozenset(
    f"hotload/{name}"
    for name in (
        "mirror_seconds",
        "stage_seconds",
        "upload_seconds",
        "hot_load_seconds",
        "publish_seconds",
        "trainer_wait_seconds",
    )
)
#: Version 0's metrics that depend on where the FULL snapshot came from: the HF directory as it
#: is (the hooks' baseline) or the tensors encoded with checksums and the side files (NeMo-RL, demo).
SOURCE_DEPENDENT = frozenset({"hotload/snapshot_bytes", "hotload/wire_bytes"})
#: What a cold replica replays holds the chain's FULL root, so it differs with version 0's source
#: at every version (each publisher's own is checked against its snapshots instead).
CHAIN_DEPENDENT = frozenset({"hotload/replay_bytes"})
WAIT_MESSAGE = "waiting for it to be READY"

#: The metrics each publisher reported for each version, across the parametrized runs.
REPORTED: dict[str, dict[int, dict[str, float]]] = {}


# ---------------------------------------------------------------------------- weights


def _trained(weights: dict[str, Any], step: int) -> dict[str, Any]:
    """One training step: two tensors move."""
    out = dict(weights)
    names = sorted(weights)
    for name in (names[step % len(names)], names[(3 * step + 1) % len(names)]):
        out[name] = (weights[name].float() + 0.01 * step).to(weights[name].dtype)
    return out


def _write_checkpoint(directory: Path, weights: dict[str, Any], hf: Path) -> Path:
    """An HF checkpoint directory of ``weights``: the base's config and tokenizer files beside them."""
    from cwtrain.local.engine.model import CHECKPOINT_FILE, weights_to_safetensors

    directory.mkdir(parents=True)
    for side in hf.iterdir():
        if side.is_file() and side.name != CHECKPOINT_FILE:
            shutil.copy(side, directory / side.name)
    (directory / CHECKPOINT_FILE).write_bytes(weights_to_safetensors(weights, {"format": "pt"}))
    return directory


# ---------------------------------------------------------------------------- the publishers


class Publisher:
    """One publisher driven through its framework's entry point: ``baseline()``, then ``step(weights)``.

    Each returns the ``hotload/*`` records of the versions it handled, as the framework's
    channel reports them (hook return values, the run's logger, a metrics sink).
    """

    def __init__(self, tmp: Path, hf: Path, base: dict[str, Any]) -> None:
        self.tmp, self.hf, self.base = tmp, hf, base
        self.version = 0
        #: The records of the last call, failed ones included, where the channel reports
        #: failed versions too (a metrics sink); ``None`` where it reports successes only.
        self.reported: list[dict[str, float]] | None = None

    def baseline(self) -> list[dict[str, float]]:
        raise NotImplementedError

    def step(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the publisher holds."""


class SlimeDisk(Publisher):
    def __init__(self, tmp: Path, hf: Path, base: dict[str, Any]) -> None:
        from slime_driver import slime_args

        super().__init__(tmp, hf, base)
        self.args = slime_args(tmp, hf)
        self.root = Path(self.args.update_weight_disk_dir)
        self.previous = hf

    def call(self, directory: Path) -> list[dict[str, float]]:
        from cwtrain.integrations.slime import hook

        metrics = hook(argparse.Namespace(**{**vars(self.args), "rank": 0}), str(directory), [])
        return [metrics] if metrics is not None else []

    def baseline(self) -> list[dict[str, float]]:
        self.root.mkdir(parents=True)
        return self.call(self.root)

    def step(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        from cwtrain.hotload import write_delta

        self.version += 1
        checkpoint = _write_checkpoint(self.tmp / "ckpt" / f"v{self.version}", weights, self.hf)
        directory = self.root / f"weight_v{self.version:06d}"
        write_delta(
            self.previous, checkpoint, directory, version=f"{self.version:06d}", base_version=f"{self.version - 1:06d}"
        )
        self.previous = checkpoint
        return self.call(directory)


class SlimeLive(Publisher):
    def __init__(self, tmp: Path, hf: Path, base: dict[str, Any]) -> None:
        from slime_driver import slime_args

        from cwtrain.hotload import SingleProcess
        from cwtrain.integrations.slime import HookConfig
        from cwtrain.integrations.slime.tensors import TensorPublisher

        super().__init__(tmp, hf, base)
        self.args = slime_args(tmp, hf)
        config = HookConfig.from_env(default_run_id="unused").with_state_dir(self.args)
        self.publisher = TensorPublisher(config, SingleProcess())

    def baseline(self) -> list[dict[str, float]]:
        metrics = self.publisher.publish(self.args, self.base.items())
        return [metrics] if metrics is not None else []

    def step(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        metrics = self.publisher.publish(self.args, weights.items())
        return [metrics] if metrics is not None else []

    def close(self) -> None:
        if self.publisher._publisher is not None:
            self.publisher.publisher.close()


class Miles(Publisher):
    def __init__(self, tmp: Path, hf: Path, base: dict[str, Any]) -> None:
        from slime_driver import slime_args

        super().__init__(tmp, hf, base)
        args = vars(slime_args(tmp, hf))
        del args["update_weight_mode"], args["update_weight_transport"]
        args.update(
            update_weight_transfer_mode="disk-delta",  # miles' flags: its logger is miles' tracking
            custom_megatron_post_save_hook_path="cwtrain.integrations.miles.post_save_hook",
            save=str(tmp / "ckpt"),
            save_hf=str(tmp / "hf_exports" / "iter_{rollout_id}"),
            use_wandb=True,  # a backend for the tracking stand-in to record in
        )
        self.args = argparse.Namespace(**args)
        _drop("miles")
        sys.path.insert(0, str(MILES_STUBS))
        from miles.utils.tracking_utils import tracking

        self.tracking = tracking
        tracking.reset()

    def baseline(self) -> list[dict[str, float]]:
        return []  # miles' first post-save call publishes the baseline before the export

    def step(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        from cwtrain.integrations.miles import post_save_hook

        self.version += 1
        rollout_id = self.version - 1  # the hook publishes rollout_id + 1
        export = _write_checkpoint(Path(self.args.save_hf.format(rollout_id=rollout_id)), weights, self.hf)
        (export / ".complete").write_text("")
        seen = len(self.tracking.RECORDS)
        post_save_hook(self.args, rollout_id, f"{self.args.save}/iter_{rollout_id:07d}", str(export))
        return [
            {k: v for k, v in metrics.items() if k != "hotload/step"} for metrics, _, _ in self.tracking.RECORDS[seen:]
        ]

    def close(self) -> None:
        sys.path.remove(str(MILES_STUBS))
        _drop("miles")


class _InProcessPolicy:
    """NeMo-RL's ``Policy`` as the synchronizer drives it, its one worker in this process."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers

    def run_all_workers_single_data(self, method_name: str, /, **kwargs: Any) -> list[Any]:
        return [getattr(worker, method_name)(**kwargs) for worker in self.workers]


class NemoRL(Publisher):
    def __init__(self, tmp: Path, hf: Path, base: dict[str, Any], target: Any, token: str) -> None:
        from cwtrain_test_workers import HalfWorker  # type: ignore[import-not-found]

        from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
        from cwtrain.integrations.nemo_rl.synchronizer import HotLoadWeightSynchronizer
        from cwtrain.local.engine.model import Tokenizer

        super().__init__(tmp, hf, base)
        config = {
            "coreweave_cfg": {"base_url": target.base_url, "model": target.model, "api_key": token},
        }  # the hot-load settings from the CWTRAIN_HOTLOAD_* variables, as a recipe passes them
        self.records: list[dict[str, float]] = []
        self.worker = HalfWorker(0, 1, base)
        generation = CoreWeaveGeneration(config, Tokenizer())
        self.sync = HotLoadWeightSynchronizer(
            _InProcessPolicy([self.worker]), generation, config, hf_checkpoint=hf, metrics_sink=self.records.append
        )

    def _sync(self) -> list[dict[str, float]]:
        seen = len(self.records)
        try:
            self.sync.sync_weights()
        finally:
            self.reported = self.records[seen:]
        return self.records[seen:]

    def baseline(self) -> list[dict[str, float]]:
        return self._sync()

    def step(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        self.worker.mine = {name: tensor.clone() for name, tensor in weights.items()}
        return self._sync()

    def close(self) -> None:
        from cwtrain.integrations.nemo_rl.refit import grpo_hooks

        self.sync.shutdown()
        grpo_hooks().uninstall()  # NeMo-RL's functions back, where a test armed the sample canary


class Demo(Publisher):
    def __init__(self, tmp: Path, hf: Path, base: dict[str, Any]) -> None:
        from cwtrain.hotload import HotLoadSettings, PublishSession

        super().__init__(tmp, hf, base)
        self.records: list[dict[str, float]] = []
        self.session = PublishSession(
            HotLoadSettings.from_env(default_run_id="unused"), sink=lambda o: self.records.append(o.metrics())
        )
        self.served: dict[str, Any] | None = None
        self.config = {"config.json": (hf / "config.json").read_bytes()}

    def _publish(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        seen = len(self.records)
        try:
            plan = self.session.begin()
            outcome = self.session.publish_tensors(plan, weights, base=self.served, extra_files=self.config)
            if outcome.published:
                self.served = weights
        finally:
            self.reported = self.records[seen:]
        return self.records[seen:]

    def baseline(self) -> list[dict[str, float]]:
        return self._publish(self.base)

    def step(self, weights: dict[str, Any]) -> list[dict[str, float]]:
        return self._publish(weights)

    def close(self) -> None:
        self.session.close()


def _drop(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


# ---------------------------------------------------------------------------- the stack


@pytest.fixture(scope="module")
def world(shared_stack: Any) -> Iterator[tuple[Any, Any]]:
    with shared_stack.view("every-publisher", replicas=REPLICAS) as local:
        yield local, local.deploy(seed=0)


class NotReady:
    """The deployment's status set to ``STATUS_UPDATING`` until :meth:`ready` (as a rollout of its spec would)."""

    def __init__(self, local: Any, deployment_id: str) -> None:
        self.state = local.state
        self.deployment_id = deployment_id

    def _set(self, status: str, message: str) -> None:
        with self.state.lock:
            self.state.deployments[self.deployment_id].set_status(status, message)

    def __enter__(self) -> NotReady:
        self._set("STATUS_UPDATING", "updating (a test holds it)")
        return self

    def ready(self) -> None:
        self._set("STATUS_READY", f"{REPLICAS}/{REPLICAS} replicas ready")

    def __exit__(self, *exc: object) -> None:
        self.ready()


class _WaitSeen(logging.Handler):
    """Sets ``event`` when a publisher logs that it waits for READY."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.event = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if WAIT_MESSAGE in message:
            self.messages.append(message)
            self.event.set()


@pytest.fixture
def publish_env(world: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The stack's variables, the publishers' settings, fresh process-level runtimes."""
    from cwtrain.integrations.miles import reset as reset_miles
    from cwtrain.integrations.slime import reset as reset_slime

    local, target = world
    for key in list(os.environ):
        if key.startswith("CWTRAIN_") or key == "RANK":
            monkeypatch.delenv(key)
    for key, value in local.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_DEPLOYMENT_ID", target.deployment_id)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_FULL_EVERY", "0")  # no cuts: version 1 is a delta for everyone
    monkeypatch.setenv("CWTRAIN_HOTLOAD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("cwtrain.hotload.lifecycle.target.POLL_INTERVAL", 0.1)
    reset_slime()
    reset_miles()
    yield local, target
    reset_slime()
    reset_miles()


def _publisher(kind: str, tmp: Path, world: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Publisher:
    from cwtrain.integrations.miles import reset as reset_miles
    from cwtrain.integrations.slime import reset as reset_slime
    from cwtrain.local.engine.model import load_checkpoint, write_base_checkpoint

    reset_slime()  # a new run: the hooks' process-level publishers start over
    reset_miles()
    local, target = world
    run_id = f"xp-{kind.replace('-', '')[:5]:<5}".replace(" ", "x") + "-" + uuid.uuid4().hex[:6]
    monkeypatch.setenv("CWTRAIN_HOTLOAD_RUN_ID", run_id)
    hf = tmp / "hf"
    write_base_checkpoint(hf, seed=0)  # the weights the deployment serves as ``initial``
    base = load_checkpoint(hf)[1]
    if kind == "slime-disk":
        return SlimeDisk(tmp, hf, base)
    if kind == "slime-live":
        return SlimeLive(tmp, hf, base)
    if kind == "miles":
        return Miles(tmp, hf, base)
    if kind == "nemo-rl":
        return NemoRL(tmp, hf, base, target, local.token)
    return Demo(tmp, hf, base)


def _run_id() -> str:
    return os.environ["CWTRAIN_HOTLOAD_RUN_ID"]


# ---------------------------------------------------------------------------- the test


@pytest.mark.parametrize("kind", PUBLISHERS)
def test_every_publisher_waits_for_ready_verifies_keeps_one_deadline_and_reports_the_same_metrics(
    kind: str, publish_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cwtrain.errors import CWTrainError
    from cwtrain.hotload import PublishOutcome

    local, target = publish_env
    schema = set(PublishOutcome(version=0).metrics())
    waits = _WaitSeen()
    logger = logging.getLogger("cwtrain")
    level = logger.level
    logger.setLevel(logging.INFO)  # the wait for READY is logged at INFO
    logger.addHandler(waits)
    try:
        # 1. CWTRAIN_HOTLOAD_VERIFY on; version 1 meets a deployment that is not READY for a moment.
        monkeypatch.setenv("CWTRAIN_HOTLOAD_VERIFY", "1")
        monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "120")
        publisher = _publisher(kind, tmp_path / "verified", publish_env, monkeypatch)
        run_id = _run_id()
        try:
            records = publisher.baseline()
            w1 = _trained(publisher.base, 1)
            with NotReady(local, target.deployment_id) as not_ready:
                release = threading.Thread(target=lambda: (waits.event.wait(30), time.sleep(0.3), not_ready.ready()))
                release.start()
                records += publisher.step(w1)
                release.join()
        finally:
            publisher.close()
        assert waits.messages and target.deployment_id in waits.messages[0], "the publisher never waited for READY"
        by_version = {int(r["hotload/version"]): {k: v for k, v in r.items() if k != "hotload/step"} for r in records}
        assert sorted(by_version) == [0, 1], records
        for version, metrics in by_version.items():
            assert set(metrics) == schema, (version, set(metrics) ^ schema)
            assert metrics["hotload/completed"] == 1.0 and metrics["hotload/published"] == 1.0, (version, metrics)
            assert metrics["hotload/replicas_verified"] == REPLICAS, (version, metrics)  # VERIFY honoured
            assert metrics["hotload/replicas_ready"] == metrics["hotload/replicas_total"] == REPLICAS
            assert metrics["hotload/served_version"] == version and metrics["hotload/failed"] == 0.0
        stored = local.s3_client().list_objects_v2(
            Bucket=target.bucket, Prefix=f"{target.path_prefix}/{run_id}-v000001/"
        )
        assert by_version[1]["hotload/snapshot_bytes"] == sum(o["Size"] for o in stored["Contents"])
        full, delta = by_version[0]["hotload/snapshot_bytes"], by_version[1]["hotload/snapshot_bytes"]
        assert (by_version[0]["hotload/replay_bytes"], by_version[1]["hotload/replay_bytes"]) == (full, full + delta)
        check_served(local, target.deployment_id, target.path_prefix, f"{run_id}-v000001", w1, bucket=target.bucket)
        REPORTED[kind] = by_version

        # 2. CWTRAIN_HOTLOAD_VERIFY off: the replicas are not checked.
        monkeypatch.setenv("CWTRAIN_HOTLOAD_VERIFY", "0")
        publisher = _publisher(kind, tmp_path / "unverified", publish_env, monkeypatch)
        try:
            records = publisher.baseline() + publisher.step(_trained(publisher.base, 2))
        finally:
            publisher.close()
        assert [r["hotload/replicas_verified"] for r in records] == [0.0, 0.0], records
        assert all(r["hotload/completed"] == 1.0 for r in records)

        # 3. One deadline: a deployment that stays not-READY fails the publish once the timeout is spent.
        timeout = 3.0
        monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", str(timeout))
        publisher = _publisher(kind, tmp_path / "deadline", publish_env, monkeypatch)
        try:
            with NotReady(local, target.deployment_id):
                started = time.monotonic()
                with pytest.raises(CWTrainError, match="READY"):
                    publisher.baseline() + publisher.step(_trained(publisher.base, 3))
                elapsed = time.monotonic() - started
        finally:
            publisher.close()
        assert timeout * 0.9 <= elapsed < timeout + 2.0, (
            f"{kind} failed after {elapsed:.1f} s with a {timeout:g} s timeout"
        )
        reported = publisher.reported
        if reported is not None:  # the publishers whose sink sees the failed outcome
            assert [r["hotload/failed"] for r in reported] == [1.0], reported
            assert reported[0]["hotload/publish_seconds"] <= timeout + 0.05, reported
    finally:
        logger.removeHandler(waits)
        logger.setLevel(level)


COMPARED = [
    pytest.param(kind, version, id=f"{kind}-v{version}") for kind in PUBLISHERS if kind != "demo" for version in (0, 1)
]


@pytest.mark.parametrize(("kind", "version"), COMPARED)
def test_the_publishers_report_the_same_values_for_the_same_snapshot(kind: str, version: int) -> None:
    """Each publisher's metrics of a version against the demo's, timings excepted.

    Version 1 is the same delta snapshot, byte for byte, from every publisher; version 0 is
    FULL from different sources, so its sizes are left out (``snapshot_bytes``, ``wire_bytes``),
    and so is ``replay_bytes``, which counts version 0's bytes at every version.
    """
    if kind not in REPORTED or "demo" not in REPORTED:
        pytest.skip(f"needs the runs of {kind} and the demo (test_every_publisher_...)")
    ignored = TIMINGS | CHAIN_DEPENDENT | (SOURCE_DEPENDENT if version == 0 else frozenset())
    mine, theirs = REPORTED[kind][version], REPORTED["demo"][version]
    differ = [
        f"{name}: {value:g}, the demo's {theirs[name]:g}"
        for name, value in sorted(mine.items())
        if name not in ignored and value != theirs[name]
    ]
    assert not differ, f"{kind} v{version}: " + "; ".join(differ)


def _serving(local: Any, deployment_id: str) -> set[str | None]:
    """What every replica of the deployment serves now, as the service lists them."""
    from cwtrain.infra import InferenceClient

    with InferenceClient(local.token, base_url=local.api_url) as client:
        newest = max(client.list_hot_loads(deployment_id), key=lambda h: h.created_at.timestamp())
        return {r.current_snapshot_identity for r in client.list_hot_load_replicas(newest.id)}


@pytest.mark.faults
@pytest.mark.fault_row("defaults-converge")
@pytest.mark.parametrize("kind", PUBLISHERS)
def test_with_the_defaults_every_publisher_brings_a_split_fleet_back_to_one_identity(
    kind: str, publish_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica reports version 1 loaded but keeps version 0, with CWTRAIN_HOTLOAD_VERIFY off (the default)."""
    from cwtrain.hotload import follow

    local, target = publish_env
    monkeypatch.setattr(follow, "CATCH_UP_SECONDS", 1.0)  # the replica left behind never catches up here
    for default in ("CWTRAIN_HOTLOAD_VERIFY", "CWTRAIN_HOTLOAD_FULL_EVERY"):  # the defaults: no verify, a mirror
        monkeypatch.delenv(default, raising=False)
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "60")
    publisher = _publisher(kind, tmp_path / "split", publish_env, monkeypatch)
    run_id = _run_id()
    try:
        records = publisher.baseline()
        local.faults.replicas.stay_behind(0, deployment_id=target.deployment_id, identity=f"{run_id}-v000001")
        records += publisher.step(_trained(publisher.base, 1))
        by_version = {int(r["hotload/version"]): r for r in records}
        failed = by_version[1]
        assert (failed["hotload/failed"], failed["hotload/reactivated"], failed["hotload/served_version"]) == (1, 1, 0)
        assert failed["hotload/converged"] == 0.0, failed
        assert _serving(local, target.deployment_id) == {f"{run_id}-v000000"}  # one identity the trainer knows
        after = {int(r["hotload/version"]): r for r in publisher.step(_trained(publisher.base, 2))}
        (version,) = after
        assert after[version]["hotload/chain_cut"] == 1.0 and after[version]["hotload/converged"] == 1.0
        assert _serving(local, target.deployment_id) == {f"{run_id}-v{version:06d}"}
    finally:
        publisher.close()


@pytest.mark.faults
@pytest.mark.fault_row("way-back-checked")
@pytest.mark.parametrize("kind", PUBLISHERS)
def test_every_publisher_goes_back_only_to_a_chain_that_can_be_replayed(
    kind: str, publish_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard of the served delta corrupted, then a hot-load that fails: back to the intact FULL."""
    local, target = publish_env
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MIRROR", "1")  # a FULL after the failure, with FULL_EVERY=0
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "60")
    publisher = _publisher(kind, tmp_path / "way-back", publish_env, monkeypatch)
    run_id = _run_id()
    try:
        publisher.baseline()
        delta = publisher.step(_trained(publisher.base, 1))[-1]  # miles' first call publishes the baseline too
        assert delta["hotload/incremental"] == 1.0 and delta["hotload/completed"] == 1.0, delta
        s3 = local.s3_client()
        prefix = f"{target.path_prefix}/{run_id}-v000001/"
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=target.bucket, Prefix=prefix)["Contents"]]
        local.faults.flip_byte(target.bucket, next(k for k in keys if k.endswith(".safetensors")), offset=-1)
        local.faults.replicas.fail_load(0, deployment_id=target.deployment_id)  # the next hot-load
        failed = publisher.step(_trained(publisher.base, 2))[-1]
        assert (failed["hotload/failed"], failed["hotload/reactivated"]) == (1.0, 1.0), failed
        assert failed["hotload/served_version"] == 0, failed  # v1's chain cannot be replayed: the FULL
        assert _serving(local, target.deployment_id) == {f"{run_id}-v000000"}
        after = publisher.step(_trained(publisher.base, 3))[-1]
        assert after["hotload/chain_cut"] == 1.0 and after["hotload/completed"] == 1.0, after
        assert _serving(local, target.deployment_id) == {f"{run_id}-v{int(after['hotload/version']):06d}"}
    finally:
        publisher.close()


# ---------------------------------------------------------------------------- the sample canary, per framework

CANARY_PROMPTS = ("the quick brown fox", "hello there", "one two three", "so it goes")


def _stepped(weights: dict[str, Any], step: int) -> dict[str, Any]:
    """A training step that moves every tensor (seeded): log-probs move well past the canary's bound between steps."""
    gen = torch.Generator().manual_seed(step)
    return {
        name: (t.float() + 0.02 * step * torch.randn(t.shape, generator=gen)).to(t.dtype) for name, t in weights.items()
    }


def _trainer_logprobs(weights: dict[str, Any], ids: Any) -> Any:
    """NeMo-RL's convention: ``out[:, t]`` is the log-prob the trainer's weights give token ``t`` (0 at position 0)."""
    from cwtrain.local.engine.model import forward

    params = {name: tensor.float() for name, tensor in weights.items()}
    with torch.no_grad():
        logits = forward(params, ids)
        token = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros((ids.shape[0], 1)), token], dim=1)


def _nemo_judged(publisher: Any, weights: dict[str, Any]) -> tuple[list[float], list[dict[str, float]]]:
    """A batch as ``grpo_train`` builds it, judged by its masking step: (sample mask after, records)."""
    import nemo_rl.algorithms.grpo as grpo  # the stand-in module, its masking function rebound by arm_canary()

    from cwtrain.local.engine.model import Tokenizer

    generation = publisher.sync.generation
    prompts = [Tokenizer().encode(text) for text in CANARY_PROMPTS for _ in range(2)]  # two rows per prompt
    lengths = [len(p) for p in prompts]
    ids = torch.zeros((len(prompts), max(lengths)), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
    out = generation.generate({"input_ids": ids, "input_lengths": torch.tensor(lengths)})
    ends = out["unpadded_sequence_lengths"]
    token_mask = torch.zeros(out["output_ids"].shape)
    for row, (start, end) in enumerate(zip(lengths, ends.tolist(), strict=True)):
        token_mask[row, start:end] = 1
    train_data = {
        "input_ids": out["output_ids"],
        "input_lengths": ends,
        "token_mask": token_mask,
        "sample_mask": torch.ones(len(prompts)),
        "generation_logprobs": out["logprobs"],
        "prev_logprobs": _trainer_logprobs(weights, out["output_ids"]),
    }
    seen = len(publisher.records)
    result = grpo.compute_and_apply_seq_logprob_error_masking(train_data, torch.zeros(len(prompts)), None)
    assert result["seen_sample_mask"] == train_data["sample_mask"].tolist()  # NeMo-RL's own masking ran after ours
    return train_data["sample_mask"].tolist(), publisher.records[seen:]


def _arm_nemo(publisher: Any) -> None:
    from cwtrain.integrations.nemo_rl.refit import grpo_hooks

    generation = publisher.sync.generation
    generation.cfg.update(max_new_tokens=8, temperature=1.0)
    assert grpo_hooks().arm_canary(generation, {"loss_fn": {}, "grpo": {}}, generation.cfg) is not None


SLIME_STUBS = TESTS / "slime" / "stubs"


def _family(publisher: Any) -> str:
    return "miles" if isinstance(publisher, Miles) else "slime"


def _arm_slime_family(publisher: Any) -> None:
    """What the actor has imported when it calls ``init_hook`` on every train rank; then the hook itself."""
    from cwtrain.integrations.slime import init_hook
    from cwtrain.integrations.slime.rollout import set_tokenizer
    from cwtrain.local.engine.model import Tokenizer

    family = _family(publisher)
    if family == "slime":
        _drop("slime")
        sys.path.insert(0, str(SLIME_STUBS))
        publisher.stubs = SLIME_STUBS
    importlib.import_module(SLIME_LOG_MODULE[family])
    set_tokenizer(Tokenizer())  # the trainer's tokenizer: prompts go as its ids
    publisher.args = argparse.Namespace(
        **{**vars(publisher.args), "rollout_batch_size": 4, "n_samples_per_prompt": 2, "rollout_max_response_len": 8}
    )
    init_hook(publisher.args)


#: Where each framework's actor looks ``log_rollout_data`` up (the stand-ins' layout: slime's newer one).
SLIME_LOG_MODULE = {"slime": "slime.observability.train_metric_utils", "miles": "miles.backends.megatron_utils.actor"}


def _slime_family_judged(publisher: Any, weights: dict[str, Any]) -> tuple[list[bool], list[dict[str, float]]]:
    """A rollout through the rollout glue, then the batch as the actor hands it to ``log_rollout_data``."""
    from cwtrain.integrations.slime.rollout import run_sync, sample_groups_into
    from cwtrain.local.engine.model import token_logprobs

    family = _family(publisher)
    args = publisher.args
    source = importlib.import_module(f"{family}.rollout.data_source").DataSource(
        args, [(p, None) for p in CANARY_PROMPTS]
    )
    groups = source.get_samples(args.rollout_batch_size)
    run_sync(sample_groups_into(args, groups, rm=importlib.import_module(f"{family}.rollout.rm_hub"), version=None))
    samples = [sample for group in groups for sample in group]
    params = {name: tensor.float() for name, tensor in weights.items()}
    trainer = [
        token_logprobs(params, s.tokens[: -s.response_length], s.tokens[-s.response_length :]) for s in samples
    ]  # what slime's forward-only pass computes before the loss (rollout_data["log_probs"])
    rollout_data = {
        "tokens": [torch.tensor(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [torch.tensor(s.loss_mask or [1] * s.response_length, dtype=torch.int) for s in samples],
        "rollout_log_probs": [torch.tensor(s.rollout_log_probs) for s in samples],
        "log_probs": [torch.tensor(t) for t in trainer],
        "sample_indices": [s.index * 10 + i for i, s in enumerate(samples)],
    }
    logged = _logged(family)
    seen = len(logged)
    log_module = importlib.import_module(SLIME_LOG_MODULE[family])
    log_module.log_rollout_data(publisher.version, args, rollout_data)
    assert log_module.CALLS[-1][1] is rollout_data  # the framework's own function ran after the canary
    records = [dict(r[0]) for r in logged[seen:]]
    return [bool(int(m.sum())) for m in rollout_data["loss_masks"]], records


def _logged(family: str) -> list[Any]:
    if family == "miles":
        from miles.utils.tracking_utils import tracking

        return tracking.RECORDS
    from slime.observability.logging_utils import RECORDS

    return RECORDS


CANARY_FRAMEWORKS = {
    "nemo-rl": (_arm_nemo, _nemo_judged),
    "slime-disk": (_arm_slime_family, _slime_family_judged),
    "slime-live": (_arm_slime_family, _slime_family_judged),
    "miles": (_arm_slime_family, _slime_family_judged),
}


@pytest.mark.faults
@pytest.mark.fault_row("framework-canary")
@pytest.mark.parametrize("kind", sorted(CANARY_FRAMEWORKS))
def test_every_framework_refuses_wrong_served_weights_from_its_own_logprobs(
    kind: str, publish_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Correct weights pass; a replica serving corrupted, then previous, weights under the new identity is refused
    from the log-probs the framework computes for its loss, the fleet goes back, and those samples leave the batch."""
    local, target = publish_env
    monkeypatch.setenv("CWTRAIN_HOTLOAD_MIRROR", "1")  # a FULL after the refusal, with FULL_EVERY=0
    monkeypatch.setenv("CWTRAIN_HOTLOAD_TIMEOUT", "60")
    for name, value in (("BASE_URL", target.base_url), ("MODEL", target.model), ("API_KEY", local.token)):
        monkeypatch.setenv(f"CWTRAIN_ROLLOUT_{name}", value)  # the rollout side's endpoint (slime, miles)
    arm, judged = CANARY_FRAMEWORKS[kind]
    publisher = _publisher(kind, tmp_path / "canary", publish_env, monkeypatch)
    run_id = _run_id()
    gaps: dict[str, float] = {}
    try:
        last = max((int(r["hotload/version"]) for r in publisher.baseline()), default=-1)  # miles: none yet
        arm(publisher)
        for step, wrong in ((1, None), (2, "corrupt"), (3, "previous")):
            identity = f"{run_id}-v{last + 1:06d}"
            if wrong is not None:  # the next version's hot-load completes on every replica; replica 0 serves wrongly
                local.faults.replicas.serve_wrong_weights(0, weights=wrong, identity=identity)
            weights = _stepped(publisher.base, step)
            stepped = publisher.step(weights)
            published = stepped[-1]
            assert published["hotload/completed"] == 1.0 and published["hotload/failed"] == 0.0, published
            assert published["hotload/chain_cut"] == (1.0 if wrong == "previous" else 0.0), published  # FULL after
            kept, records = judged(publisher, weights)
            verdict = next(r for r in records if "hotload/canary_gap" in r)
            gaps[wrong or "correct"] = verdict["hotload/canary_gap"]
            last = max(int(r["hotload/version"]) for r in [*stepped, *records] if "hotload/version" in r)
            if wrong is None:
                assert all(kept) and verdict["hotload/canary_passed"] == 1.0, (kept, verdict)
                assert _serving(local, target.deployment_id) == {f"{run_id}-v{int(published['hotload/version']):06d}"}
                continue
            refusal = next(r for r in records if r.get("hotload/failed") == 1.0)
            assert (
                refusal["hotload/reactivated"] == 1.0 and refusal["hotload/canary_gap"] == verdict["hotload/canary_gap"]
            )
            assert not any(kept), kept  # every sample of the refused identity left the batch
            assert _serving(local, target.deployment_id) == {f"{run_id}-v{int(refusal['hotload/served_version']):06d}"}
            assert int(refusal["hotload/served_version"]) < last  # back to a version the trainer published before
        print(f"\n{kind} sample canary gaps: " + ", ".join(f"{k} {v:.4f}" for k, v in gaps.items()))
        assert gaps["correct"] <= 0.05 < min(gaps["corrupt"], gaps["previous"]), gaps
    finally:
        publisher.close()
        if getattr(publisher, "stubs", None) is not None:
            sys.path.remove(str(publisher.stubs))
            _drop("slime")

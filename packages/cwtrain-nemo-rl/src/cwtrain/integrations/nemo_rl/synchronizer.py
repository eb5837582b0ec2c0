"""``HotLoadWeightSynchronizer``: NeMo-RL's refit, done by checkpoint hot-load.

Each :meth:`~HotLoadWeightSynchronizer.sync_weights` publishes one version ``N``
(snapshot-format.md §10): FULL with checksums when ``N = 0``, when nothing was published
yet in this process, after a failed hot-load, or when ``N % full_every == 0``; else an XOR
delta against the previous export. Every policy worker encodes and uploads its share
from the tensors on its device (:mod:`cwtrain.integrations.nemo_rl.publish`); the driver
commits the index, creates the hot-load (waiting for the deployment to be READY and for
any running hot-load first), waits until every replica serves the identity
(``CWTRAIN_HOTLOAD_VERIFY`` also checks each replica), writes
``<state_dir>/served_identity`` atomically and uploads the manifest (spec §8.1). An empty
delta publishes nothing and the version still advances.

Like NeMo-RL's ``WeightSynchronizer.sync_weights``, the sync returns ``None`` (``grpo_train``
would discard anything else). Its ``hotload/*`` metrics (``version``, ``incremental``,
``export_seconds``, ``upload_seconds``, ``hot_load_seconds``, ``wire_bytes``, ...) are kept
in :attr:`HotLoadWeightSynchronizer.last_metrics` and handed to ``metrics_sink``, which the
setup wrapper points at the run's logger
(:class:`~cwtrain.integrations.nemo_rl.metrics.RunLogger`). With ``grpo_train``'s timer the
whole sync is timed as ``prepare_for_generation/transfer_and_update_weights``, the label
NeMo-RL's own refit uses (logged under ``timing/train``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from cwtrain.errors import ConfigError, SnapshotError
from cwtrain.hotload.format.identity import version_identity
from cwtrain.hotload.loader import HotLoader
from cwtrain.hotload.publish.cadence import ChainCadence
from cwtrain.hotload.publish.manifest import snapshot_manifest
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy, SnapshotType
from cwtrain.integrations.frameworks import NEMO_RL, require
from cwtrain.integrations.nemo_rl.config import HotLoadSettings
from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
from cwtrain.integrations.nemo_rl.protocols import WorkerGroup
from cwtrain.integrations.nemo_rl.publish import PublishPlan, ShareResult, commit_index, hf_side_files
from cwtrain.integrations.nvext import write_served_identity

# NeMo-RL's base class, loaded at import (NeMo-RL is not importable where cwtrain is type-checked).
WeightSynchronizer: Any = require(NEMO_RL, "nemo_rl.weight_sync.interfaces").WeightSynchronizer

__all__ = ["REFIT_TIMER_LABEL", "HotLoadWeightSynchronizer", "run_on_all_workers"]

log = logging.getLogger(__name__)

#: The timer label of NeMo-RL's own refit, reused so the sync shows where NeMo-RL's would.
REFIT_TIMER_LABEL = "prepare_for_generation/transfer_and_update_weights"


def run_on_all_workers(policy: WorkerGroup, method: str, **kwargs: Any) -> list[Any]:
    """``policy.run_all_workers_single_data(method, **kwargs)`` with Ray futures resolved."""
    results = list(policy.run_all_workers_single_data(method, **kwargs))
    ray = sys.modules.get("ray")  # Ray futures exist only where Ray was imported
    if ray is not None and results and isinstance(results[0], ray.ObjectRef):
        return list(ray.get(results))
    return results


class HotLoadWeightSynchronizer(WeightSynchronizer):  # type: ignore[misc]
    """Publishes the policy's weights to the deployment after every step.

    Args:
        policy: NeMo-RL's ``Policy`` (its workers must be cwtrain's, see
            :mod:`cwtrain.integrations.nemo_rl.worker`).
        generation: the :class:`~cwtrain.integrations.nemo_rl.generation.CoreWeaveGeneration`.
        generation_config: ``policy.generation`` (NeMo-RL's signature; the settings are
            the ones ``generation`` read from it).
        hf_checkpoint: the HF checkpoint directory of the base model (its ``config.json``
            and tokenizer files go beside FULL snapshots).
        loader: a :class:`~cwtrain.hotload.loader.HotLoader` (default from the config).
        metrics_sink: called with each sync's ``hotload/*`` metrics (also after a failed
            hot-load); the setup wrapper passes the run logger's ``record``.
    """

    def __init__(
        self,
        policy: WorkerGroup,
        generation: CoreWeaveGeneration,
        generation_config: Mapping[str, Any],
        *,
        hf_checkpoint: str | os.PathLike[str],
        loader: HotLoader | None = None,
        metrics_sink: Callable[[Mapping[str, float]], None] | None = None,
    ) -> None:
        self.settings: HotLoadSettings = generation.settings.hotload
        if loader is None:
            if not self.settings.deployment_id:
                raise ConfigError(
                    "no deployment to publish to: set policy.generation.coreweave_cfg.deployment_id "
                    "or CWTRAIN_HOTLOAD_DEPLOYMENT_ID"
                )
            from cwtrain.infra import InferenceClient

            loader = HotLoader(
                InferenceClient(), deployment_id=self.settings.deployment_id, timeout=self.settings.timeout
            )
        self.policy = policy
        self.generation = generation
        self.loader = loader
        self.hf_checkpoint = Path(hf_checkpoint)
        self.version = 0
        self._stale = True
        self.cadence = ChainCadence(self.settings.full_every)  # FULL first: nothing published in this process
        self._served: str | None = None
        self.metrics_sink = metrics_sink
        #: The ``hotload/*`` metrics of the last sync (empty before any).
        self.last_metrics: dict[str, float] = {}
        generation.weight_synchronizer = self

    # ------------------------------------------------------------ NeMo-RL API

    @property
    def is_stale(self) -> bool:
        """Whether the deployment serves older weights than the policy holds."""
        return self._stale

    def mark_stale(self) -> None:
        """The policy took an optimizer step."""
        self._stale = True

    def init_communicator(self) -> None:
        """Nothing to set up: weights travel through object storage."""

    def shutdown(self) -> None:
        """Nothing to tear down."""

    @property
    def served_identity(self) -> str | None:
        """The identity the replicas serve since the last sync (``None`` before any)."""
        return self._served

    def identity_for(self, version: int) -> str:
        """``<run_id>-v{N:06d}`` (:func:`cwtrain.hotload.format.identity.version_identity`)."""
        return version_identity(self.settings.run_id, version)

    def sync_weights(self, *, timer: object | None = None, kv_scales: Mapping[str, float] | None = None) -> None:
        """Publish the current weights as the next version and wait until they are served.

        Args:
            timer: ``grpo_train``'s ``Timer`` (the sync is timed under :data:`REFIT_TIMER_LABEL`).
            kv_scales: FP8 KV-cache scales; any is refused.

        Raises:
            NotImplementedError: FP8 KV-cache scales (not supported by hot-load).
            HotLoadFailedError: the hot-load failed (the next sync publishes FULL).
        """
        if kv_scales:
            raise NotImplementedError("kv_scales are not supported by the coreweave backend (hot-load)")
        metrics: dict[str, float] = {}
        try:
            with _timed(timer, REFIT_TIMER_LABEL):
                self._sync(metrics)
        finally:
            self.last_metrics = metrics
            if self.metrics_sink is not None and metrics:
                self.metrics_sink(dict(metrics))

    def _sync(self, metrics: dict[str, float]) -> None:
        start = time.monotonic()
        version = self.version
        full = self.cadence.is_full(version)
        identity = self.identity_for(version)
        store = self.loader.store
        plan = PublishPlan(
            identity=identity,
            full=full,
            previous_identity=None if full else self._served,
            bucket=store.bucket,
            path_prefix=store.path_prefix,
            upload_workers=self.settings.upload_workers,
        )
        metrics.update({"hotload/version": float(version), "hotload/incremental": float(not full)})
        results: list[ShareResult] = run_on_all_workers(self.policy, "cwtrain_publish_share", plan=plan)
        export_done = time.monotonic()
        uri = commit_index(results, plan, s3=self.loader.s3, extra_files=self._side_files() if full else None)
        metrics.update(
            {
                "hotload/export_seconds": export_done - start,
                "hotload/tensors_changed": float(sum(r.tensors_changed for r in results)),
                "hotload/wire_bytes": float(sum(r.payload_bytes for r in results)),
                "hotload/snapshot_bytes": float(sum(r.payload_bytes for r in results)),
            }
        )
        if uri is None:  # an empty delta: nothing to hot-load, the bytes served are the same
            run_on_all_workers(self.policy, "cwtrain_commit_share")
            self.version += 1
            self._stale = False
            metrics["hotload/skipped_empty"] = 1.0
            return
        upload_done = time.monotonic()
        try:
            hot_load = self.loader.trigger(
                identity,
                snapshot_type=SnapshotType.FULL if full else SnapshotType.INCREMENTAL,
                previous_identity=plan.previous_identity,
                prompt_cache_policy=self._cache_policy(),
                timeout=self.settings.timeout,
            )
            if self.settings.wait:
                hot_load = self.loader.wait(hot_load.id, timeout=self.settings.timeout)
                if self.settings.verify:
                    self.loader.verify_served(hot_load.id, identity)
        except BaseException:
            run_on_all_workers(self.policy, "cwtrain_discard_share")
            self.cadence.failed()
            metrics["hotload/failed"] = 1.0
            raise
        run_on_all_workers(self.policy, "cwtrain_commit_share")
        self._served = identity
        self.cadence.published(full=full)
        self._stale = False
        self.version += 1
        if self.settings.state_dir:
            write_served_identity(self.settings.state_dir, identity)
        self._write_manifest(identity, results)
        metrics.update(
            {
                "hotload/upload_seconds": upload_done - export_done,
                "hotload/hot_load_seconds": time.monotonic() - upload_done,
                "hotload/completed": float(hot_load.state == HotLoadState.COMPLETED),
                "hotload/chain_cut": float(full and version > 0),
            }
        )

    # ------------------------------------------------------------ helpers

    def _cache_policy(self) -> PromptCachePolicy | None:
        value = self.settings.prompt_cache_policy
        return PromptCachePolicy.parse(value) if value else None

    def _side_files(self) -> dict[str, bytes]:
        files = hf_side_files(self.hf_checkpoint)
        if "config.json" not in files:
            raise SnapshotError(f"{self.hf_checkpoint}/config.json is missing: a FULL snapshot needs it")
        return files

    def _write_manifest(self, identity: str, results: list[ShareResult]) -> None:
        checksums: dict[str, str] = {}
        for result in results:
            checksums.update(result.checksums)
        manifest = snapshot_manifest(identity, self.loader.deployment_id, self.settings.run_id, checksums)
        try:
            self.loader.upload_manifest(identity, manifest)
        except Exception as exc:  # a manifest only helps resume; never fail the step for it
            log.warning("could not write the manifest of %s: %s", identity, exc)


def _timed(timer: object | None, label: str) -> Any:
    """``timer.time(label)`` for NeMo-RL's ``Timer``, else a no-op context."""
    time_it = getattr(timer, "time", None)
    return time_it(label) if callable(time_it) else nullcontext()

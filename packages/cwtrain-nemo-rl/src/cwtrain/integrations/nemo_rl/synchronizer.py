"""``HotLoadWeightSynchronizer``: NeMo-RL's refit, done by checkpoint hot-load.

Each :meth:`~HotLoadWeightSynchronizer.sync_weights` publishes one version ``N``
(snapshot-format.md §10) through core's ``PublishSession``, the cycle every publisher
shares: FULL with checksums when ``N = 0``, when nothing was published yet in this
process, after a failed publish, or when the cadence cuts the chain; else an XOR delta
against what the replicas serve. The steps are core's distributed share protocol
(:func:`cwtrain.hotload.publish_shares`), each one call on every policy worker through the
driver (``policy.run_all_workers_single_data``: :class:`WorkerRanks` is the transport):
every worker encodes its share from the tensors on its device (core's ``RankShare``, through
:mod:`~cwtrain.integrations.nemo_rl.worker_mixin`) and reports its shard bytes; with
``full_every: auto`` (the default) the session weighs the delta (a share of 90 % of the last
FULL, or a chain past two FULLs' bytes, makes it FULL) and the workers then build a FULL share
from their served copies (nothing is gathered or encoded twice); every worker stores its
share; the session commits the index (with the HF checkpoint's config and tokenizer files
for FULL), creates the hot-load (waiting for the deployment to be READY and for any running
hot-load first), waits until every replica serves the identity (``CWTRAIN_HOTLOAD_VERIFY``
also checks each replica), writes ``<state_dir>/served_identity`` atomically and uploads the
manifest (spec §8.1), all within one budget of ``hotload_timeout`` seconds; the workers then
commit (or, after a failure, discard) their new served copies. A failed version's identity is
not used again (it may hold objects of the failed attempt): the sync after a failure
publishes ``N + 1``, FULL. An empty delta publishes nothing and the version still advances.
The generation's samplers learn each version the fleet serves (the session's follower) and
each version whose hot-load was created and then failed or was refused (the session's
``on_burned``): a burned version, whose samples they re-request
(:meth:`~cwtrain.integrations.nemo_rl.generation.CoreWeaveGeneration.note_burned`).
The version comes from the session, not a count of this process's syncs: a restarted run
(same run id) reads what the fleet holds of it at its first sync and publishes the version
after the last one any of its processes attempted, FULL (the new workers' weights are not
known to equal the served ones); deltas follow on it.

Like NeMo-RL's ``WeightSynchronizer.sync_weights``, the sync returns ``None`` (``grpo_train``
would discard anything else). Its ``hotload/*`` metrics are the session's, the same names
and meanings for every publisher (``version``, ``incremental``, ``stage_seconds``,
``upload_seconds``, ``hot_load_seconds``, ``wire_bytes``, ``snapshot_bytes``, ...: see
``PublishOutcome``); they are kept in :attr:`HotLoadWeightSynchronizer.last_metrics` and
handed to ``metrics_sink`` (failed publishes included), which the setup wrapper points at
the run's logger (:class:`~cwtrain.integrations.nemo_rl.metrics.RunLogger`). With
``grpo_train``'s timer the whole sync is timed as
``prepare_for_generation/transfer_and_update_weights``, the label NeMo-RL's own refit uses
(logged under ``timing/train``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from cwtrain.errors import ConfigError, SnapshotError
from cwtrain.hotload import (
    HotLoader,
    HotLoadSettings,
    PublishOutcome,
    PublishSession,
    SharePlan,
    ShareResult,
    publish_shares,
    side_files,
)
from cwtrain.integrations.frameworks import require
from cwtrain.integrations.nemo_rl.framework import NEMO_RL
from cwtrain.integrations.nemo_rl.generation import CoreWeaveGeneration
from cwtrain.integrations.nemo_rl.protocols import WorkerGroup
from cwtrain.integrations.rollout import SampleCanary

# NeMo-RL's base class, loaded at import (NeMo-RL is not importable where cwtrain is type-checked).
WeightSynchronizer: Any = require(NEMO_RL, "nemo_rl.weight_sync.interfaces").WeightSynchronizer

__all__ = ["REFIT_TIMER_LABEL", "HotLoadWeightSynchronizer", "WorkerRanks", "run_on_all_workers"]

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
        loader: a ``HotLoader`` (default: built from the settings on first use).
        metrics_sink: called with each sync's ``hotload/*`` metrics (also after a failed
            publish); the setup wrapper passes the run logger's ``record``.

    Attributes:
        session: the ``PublishSession`` that publishes every version.
        sample_canary: judges each served version from ``grpo_train``'s log-probs (``None``: not armed).
        last_metrics: the ``hotload/*`` metrics of the last sync (empty before any).
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
        if loader is None and not self.settings.deployment_id:
            raise ConfigError(
                "no deployment to publish to: set policy.generation.coreweave_cfg.deployment_id "
                "or CWTRAIN_HOTLOAD_DEPLOYMENT_ID"
            )
        self.policy = policy
        self.generation = generation
        self.hf_checkpoint = Path(hf_checkpoint)
        self.metrics_sink = metrics_sink
        self.last_metrics: dict[str, float] = {}
        # the generation's samplers fence their samples by the newest version the fleet serves,
        # and by the burned ones
        self.session = PublishSession(
            self.settings,
            target=loader.target if loader is not None else None,
            sink=self._record,
            followers=[lambda _run, version: generation.note_published(version)],
            on_burned=[lambda _run, version: generation.note_burned(version)],
        )
        #: judges each served version from ``grpo_train``'s own log-probs (the setup wrapper arms it;
        #: :mod:`~cwtrain.integrations.nemo_rl.canary`)
        self.sample_canary: SampleCanary | None = None
        self._stale = True
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
        """Close the API client the session built (a given loader's is the caller's)."""
        self.session.close()

    @property
    def version(self) -> int:
        """The version the next sync publishes: the session's (a failed one is not tried again; after a
        restart, the one after the last any process of the run attempted, read from the fleet on first use)."""
        return self.session.next_version()

    @property
    def served_identity(self) -> str | None:
        """The identity the replicas serve since the last sync (``None`` before any)."""
        return self.session.served_identity

    def identity_for(self, version: int) -> str:
        """``<run_id>-v{N:06d}``."""
        return self.session.identity(version)

    def sync_weights(self, *, timer: object | None = None, kv_scales: Mapping[str, float] | None = None) -> None:
        """Publish the current weights as the next version and wait until they are served.

        Args:
            timer: ``grpo_train``'s ``Timer`` (the sync is timed under :data:`REFIT_TIMER_LABEL`).
            kv_scales: FP8 KV-cache scales; any is refused.

        Raises:
            NotImplementedError: FP8 KV-cache scales (not supported by hot-load).
            CWTrainError: publishing failed (``HotLoadFailedError`` for a failed hot-load);
                the next sync publishes FULL.
        """
        if kv_scales:
            raise NotImplementedError("kv_scales are not supported by the coreweave backend (hot-load)")
        with _timed(timer, REFIT_TIMER_LABEL):
            self._sync()

    def _sync(self) -> None:
        # the session's next version: a failed one's identity is not tried again (its objects may be stored),
        # and a restarted run goes on after the last version any of its processes attempted
        plan = self.session.begin()
        outcome = publish_shares(self.session, plan, WorkerRanks(self.policy), files=self._side_files)
        if not outcome.failed:  # a failed one (the fleet brought back) makes the next sync FULL
            self._stale = False

    # ------------------------------------------------------------ helpers

    def _record(self, outcome: PublishOutcome) -> None:
        self.last_metrics = outcome.metrics()
        if self.metrics_sink is not None:
            self.metrics_sink(dict(self.last_metrics))

    def _side_files(self) -> dict[str, bytes]:
        files = side_files(self.hf_checkpoint)
        if "config.json" not in files:
            raise SnapshotError(f"{self.hf_checkpoint}/config.json is missing: a FULL snapshot needs it")
        return files


class WorkerRanks:
    """Core's share protocol over NeMo-RL's driver: each step is one call on every policy worker.

    The workers' methods are :class:`~cwtrain.integrations.nemo_rl.worker_mixin.HotLoadWorkerMixin`'s.
    """

    def __init__(self, policy: WorkerGroup) -> None:
        self.policy = policy

    def encode(self, plan: SharePlan) -> list[ShareResult]:
        """Every worker encodes its share (the gathering generator runs on every rank)."""
        return run_on_all_workers(self.policy, "cwtrain_encode_share", plan=plan)

    def cut(self, plan: SharePlan) -> list[ShareResult]:
        """Every worker builds its FULL share from its served copy."""
        return run_on_all_workers(self.policy, "cwtrain_cut_share", plan=plan)

    def store(self, plan: SharePlan, counts: list[int]) -> list[ShareResult]:
        """Every worker uploads its share (its shard names are fixed by the tensor sizes: ``counts`` are not needed)."""
        del counts
        return run_on_all_workers(self.policy, "cwtrain_store_share", plan=plan)

    def settle(self, served: bool, error: str | None) -> None:
        """Every worker commits (served) or discards its new served copy."""
        del error  # the driver raises it; the workers wait for the next call
        if served:
            run_on_all_workers(self.policy, "cwtrain_commit_share")
            return
        try:
            run_on_all_workers(self.policy, "cwtrain_discard_share")
        except Exception as exc:  # the publish's error is the one to raise
            log.warning("could not tell the workers to discard the version: %s", exc)


def _timed(timer: object | None, label: str) -> Any:
    """``timer.time(label)`` for NeMo-RL's ``Timer``, else a no-op context."""
    time_it = getattr(timer, "time", None)
    return time_it(label) if callable(time_it) else nullcontext()

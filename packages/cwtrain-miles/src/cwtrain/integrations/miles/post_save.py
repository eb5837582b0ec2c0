"""The post-save alternative: publish each ``--save-hf`` export after miles saves a checkpoint.

``--custom-megatron-post-save-hook-path cwtrain.integrations.miles.post_save_hook`` makes miles
call ``post_save_hook(args, rollout_id, checkpoint_dir, hf_checkpoint_dir)`` on rank 0 after
each save (``--save`` and ``--save-hf`` are required). Use it when weights should reach the
deployment only at checkpoints rather than at every ``update_weights``.

Version ``rollout_id + 1`` is published: the first call publishes ``--hf-checkpoint`` as the
baseline ``<run>-v000000``; each export then becomes an XOR delta over the previous published
export, encoded from the two checkpoints in one pass with nothing staged on disk (empty
deltas skipped), or a FULL snapshot of the export itself when the cadence cuts the chain:
with ``CWTRAIN_HOTLOAD_FULL_EVERY=auto`` (the default) the delta is encoded in memory and
weighed before anything is uploaded (at least 90 % of the last FULL, or a chain past two
FULLs' bytes, publishes the export's directory FULL instead; nothing is encoded twice). A
fixed ``FULL_EVERY`` counts the exports published, not rollout ids: with
``--save-interval 20`` and ``FULL_EVERY=20`` every 20th export is FULL, not every one. The
previous export directory must still exist at the next save (miles keeps them). The cycle of
each version is core's :class:`~cwtrain.hotload.PublishSession`.

What miles hands over, and what the hook does with it:

* ``hf_checkpoint_dir=None`` with ``--save-hf`` set: the critic's save (PPO; miles calls the
  hook on the critic's rank 0 too, without an HF export). Nothing to publish.
* an export without miles' ``.complete`` marker: the export failed (miles logs the error,
  keeps training and still calls the hook). Not published; the next complete export is
  published over the last one that was.

miles discards the hook's return value, so the metrics also go to the run's logger: miles'
tracking (:data:`~cwtrain.integrations.miles.dialect.MILES_DIALECT`).

**After a restart** (the same run id, resumed from a checkpoint): the baseline call keeps what
the fleet serves when it is a later version of the run (nothing rolls it back), and the first
export is published FULL from its directory, as the version after the last one any process of
the run attempted when ``rollout_id + 1`` is not above it (a checkpoint older than the last
export published); deltas follow on it. Each rollout's export is still handed over once.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

from cwtrain.errors import ConfigError
from cwtrain.hotload import HotLoader, HotLoadSettings, PublishOutcome, PublishSession
from cwtrain.integrations.slime import SlimeRuntime, default_run_id, is_rank_zero, log_metrics, state_dir_for

from .dialect import MILES_DIALECT
from .runtime import MilesRuntime

__all__ = ["COMPLETE_MARKER", "PostSavePublisher", "post_save_hook"]

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
"""The file miles writes into an HF export once it is complete (``miles.utils.hf_config``)."""


class PostSavePublisher:
    """Publishes miles' HF exports as consecutive weight versions.

    Args:
        settings: the run's hot-load settings.
        loader: the :class:`~cwtrain.hotload.HotLoader` to use (default: built from ``settings``).

    Attributes:
        session: the run's publish session.
        exports_published: exports handed to the session so far (the FULL cadence's count).
        last_asked: the version this process last asked the session for (``rollout_id + 1``;
            0 before any export): a rollout's export is handed over once.
    """

    def __init__(self, settings: HotLoadSettings, loader: HotLoader | None = None) -> None:
        self.session = PublishSession(settings, target=loader.target if loader is not None else None)
        SlimeRuntime.current().note_session(self.session)  # the sample canary refuses through it
        self._previous: Path | None = None
        self.exports_published = 0
        self.last_asked = 0

    @classmethod
    def from_env(cls, args: argparse.Namespace) -> PostSavePublisher:
        """One for this run: the settings from the environment, the state directory from ``args``.

        Raises:
            ConfigError: no state directory (``CWTRAIN_HOTLOAD_STATE_DIR``,
                ``--update-weight-disk-dir`` or ``--save``), or a malformed variable.
        """
        settings = HotLoadSettings.from_env(default_run_id=default_run_id(args))
        if not settings.state_dir:
            root = getattr(args, "update_weight_disk_dir", None) or getattr(args, "save", None)
            if not root:
                raise ConfigError("set CWTRAIN_HOTLOAD_STATE_DIR (no --update-weight-disk-dir or --save)")
            settings = replace(settings, state_dir=state_dir_for(str(root)))
        return cls(settings)

    @property
    def run_id(self) -> str:
        """The run id of the identities published."""
        return self.session.run_id

    def __call__(self, args: argparse.Namespace, rollout_id: int, hf_checkpoint_dir: str) -> dict[str, float]:
        """Publish the export of ``rollout_id``; returns the metrics of :meth:`publish`, merged."""
        merged: dict[str, float] = {}
        for record in self.publish(args, rollout_id, hf_checkpoint_dir):
            merged.update(record)
        return merged

    def publish(self, args: argparse.Namespace, rollout_id: int, hf_checkpoint_dir: str) -> list[dict[str, float]]:
        """Publish the export of ``rollout_id`` (the baseline first, on the first call).

        An export without the ``.complete`` marker is not published (see the module docstring).

        Returns:
            one ``hotload/*`` record per version handled: the baseline's (first call only),
            then this export's.
        """
        session = self.session
        records: list[dict[str, float]] = []
        if self._previous is None:
            records.append(session.publish_baseline(str(args.hf_checkpoint)).metrics())
            self._previous = Path(str(args.hf_checkpoint))
        version = int(rollout_id) + 1
        if version <= self.last_asked:  # the session's numbers may differ after a restart: see the module docstring
            raise ConfigError(
                f"rollout {rollout_id} is not after rollout {self.last_asked - 1}, whose export was handed over already: "
                "each export is published once, in order"
            )
        export = Path(hf_checkpoint_dir)
        if not (export / COMPLETE_MARKER).is_file():
            log.error(
                "miles' HF export %s has no %s marker: the export failed (miles logged why); not publishing it, "
                "the replicas keep %s",
                export,
                COMPLETE_MARKER,
                session.served_identity,
            )
            skipped = PublishOutcome(
                version,
                served_version=session.served_version if session.served_version is not None else -1,
                chain_length=session.cadence.deltas_in_chain,
            )
            records.append({**skipped.metrics(), "hotload/skipped_incomplete": 1.0})
            return records
        plan = session.begin(version, cadence_position=self.exports_published + 1)
        self.last_asked = version
        outcome = session.publish_diff(plan, export, self._previous)
        records.append(outcome.metrics())
        self.exports_published += 1
        if not outcome.failed:  # a failed one (the fleet brought back) makes the next version FULL anyway
            self._previous = export
        return records


def post_save_hook(
    args: argparse.Namespace, rollout_id: int, checkpoint_dir: str, hf_checkpoint_dir: str | None
) -> dict[str, float] | None:
    """miles' ``--custom-megatron-post-save-hook-path`` hook.

    The run's :class:`PostSavePublisher` is kept by the process's
    :class:`~cwtrain.integrations.miles.runtime.MilesRuntime`.

    Args:
        args: miles' namespace (the actor's, or the critic's).
        rollout_id: the rollout step just saved.
        checkpoint_dir: the Megatron checkpoint (not read).
        hf_checkpoint_dir: the HF export of this save (``--save-hf``); ``None`` for the critic.

    Returns:
        ``hotload/*`` metrics on the publishing rank (also logged to the run's logger), else ``None``.

    Raises:
        ConfigError: ``--save-hf`` is not set.
    """
    del checkpoint_dir
    if not is_rank_zero(args):
        return None
    if not hf_checkpoint_dir:
        if getattr(args, "save_hf", None):  # the critic's save: miles exports only the actor
            log.debug("no HF export with this save (the critic's, rollout %s): nothing to publish", rollout_id)
            return None
        raise ConfigError(
            "the post-save hook publishes the HF export of each save: pass --save-hf DIR_WITH_{rollout_id}"
        )
    publisher = MilesRuntime.current().post_save(lambda: PostSavePublisher.from_env(args))
    merged: dict[str, float] = {}
    for record in publisher.publish(args, rollout_id, hf_checkpoint_dir):
        log_metrics(args, record, run_id=publisher.run_id, dialect=MILES_DIALECT)
        merged.update(record)
    return merged

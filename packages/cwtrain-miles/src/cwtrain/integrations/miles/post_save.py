"""The post-save alternative: publish each ``--save-hf`` export after miles saves a checkpoint.

``--custom-megatron-post-save-hook-path cwtrain.integrations.miles.post_save_hook`` makes miles
call ``post_save_hook(args, rollout_id, checkpoint_dir, hf_checkpoint_dir)`` on rank 0 after
each save (``--save`` and ``--save-hf`` are required). Use it when weights should reach the
deployment only at checkpoints rather than at every ``update_weights``.

Version ``rollout_id + 1`` is published: the first call publishes ``--hf-checkpoint`` as the
baseline ``<run>-v000000``; each export then becomes an XOR delta over the previous published
export, written into the state directory in slime's delta format and published like any
other version (empty deltas skipped). ``CWTRAIN_HOTLOAD_FULL_EVERY`` counts the exports
published, not rollout ids: with ``--save-interval 20`` and ``FULL_EVERY=20`` every 20th
export is FULL, not every one. The previous export directory must still exist at the next
save (miles keeps them).

What miles hands over, and what the hook does with it:

* ``hf_checkpoint_dir=None`` with ``--save-hf`` set: the critic's save (PPO; miles calls the
  hook on the critic's rank 0 too, without an HF export). Nothing to publish.
* an export without miles' ``.complete`` marker: the export failed (miles logs the error,
  keeps training and still calls the hook). Not published; the next complete export is
  published over the last one that was.

miles discards the hook's return value, so the metrics also go to the run's logger
(:mod:`cwtrain.integrations.slime.tracking`).
"""

from __future__ import annotations

import argparse
import logging
import shutil
from dataclasses import replace
from pathlib import Path

from cwtrain.errors import ConfigError
from cwtrain.integrations.slime import SlimePublisher, default_run_id, is_rank_zero
from cwtrain.integrations.slime.config import HookConfig, state_dir_for
from cwtrain.integrations.slime.tracking import log_metrics

from .runtime import MilesRuntime

__all__ = ["COMPLETE_MARKER", "PostSavePublisher", "post_save_hook"]

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
"""The file miles writes into an HF export once it is complete (``miles.utils.hf_config``)."""


class PostSavePublisher:
    """Publishes miles' HF exports as consecutive weight versions.

    Args:
        publisher: the :class:`SlimePublisher` doing the hot-loads (its state directory holds
            the delta staging).

    Attributes:
        exports_published: exports handed to the publisher so far (the FULL cadence's count).
    """

    def __init__(self, publisher: SlimePublisher) -> None:
        self.publisher = publisher
        self._previous: Path | None = None
        self.exports_published = 0

    @classmethod
    def from_env(cls, args: argparse.Namespace) -> PostSavePublisher:
        """One for this run: the hook's settings from the environment, the state directory from ``args``.

        Raises:
            ConfigError: no state directory (``CWTRAIN_HOTLOAD_STATE_DIR``,
                ``--update-weight-disk-dir`` or ``--save``), or a malformed variable.
        """
        config = HookConfig.from_env(default_run_id=default_run_id(args))
        if not config.state_dir:
            root = getattr(args, "update_weight_disk_dir", None) or getattr(args, "save", None)
            if not root:
                raise ConfigError("set CWTRAIN_HOTLOAD_STATE_DIR (no --update-weight-disk-dir or --save)")
            config = replace(config, state_dir=state_dir_for(str(root)))
        return cls(SlimePublisher(config))

    @property
    def run_id(self) -> str:
        """The run id of the identities published."""
        return self.publisher.config.run_id

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
        from cwtrain.hotload.files.write import write_delta

        records: list[dict[str, float]] = []
        if self._previous is None:
            records.append(self.publisher.publish_baseline(args))
            self._previous = Path(str(args.hf_checkpoint))
        version = int(rollout_id) + 1
        base_version = self.publisher.last_version
        if version <= base_version:
            raise ConfigError(f"rollout {rollout_id} was already published as version {base_version}")
        export = Path(hf_checkpoint_dir)
        if not (export / COMPLETE_MARKER).is_file():
            log.error(
                "miles' HF export %s has no %s marker: the export failed (miles logged why); not publishing it, "
                "the replicas keep %s",
                export,
                COMPLETE_MARKER,
                self.publisher.served_identity,
            )
            records.append(self.publisher.state_metrics({"skipped_incomplete": 1.0}, version))
            return records
        staging = self.publisher.state_dir / "post-save" / f"weight_v{version:06d}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        write_delta(self._previous, export, staging, version=f"{version:06d}", base_version=f"{base_version:06d}")
        try:
            records.append(
                self.publisher.publish_version(args, staging, version, cadence_position=self.exports_published + 1)
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.exports_published += 1
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
        log_metrics(args, record, run_id=publisher.run_id)
        merged.update(record)
    return merged

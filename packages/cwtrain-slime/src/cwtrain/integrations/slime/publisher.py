"""``SlimePublisher``: turns slime's weight versions on disk into hot-loads.

One publisher lives on the publishing process (rank 0, or the publishing Ray actor) for
the whole run. It is called with slime's delta root (the baseline call) and then with
each ``weight_vNNNNNN`` directory:

========================================== ==================================================
call                                       published as
========================================== ==================================================
root (baseline)                            ``<run>-v000000`` FULL from ``--hf-checkpoint``;
                                           skipped when a COMPLETED one with a matching
                                           manifest exists, or when the replicas serve a
                                           later version of the run (resume: see below)
``weight_vN`` the cadence cuts             ``<run>-vN`` FULL from the served copy (the
                                           mirror) after applying and verifying the delta
                                           (by count, or with ``auto`` when the delta's
                                           files weigh too much against the last FULL)
``weight_vN`` with an empty ``weight_map`` nothing; the next delta goes against the last
                                           published version, whose bytes are identical
other ``weight_vN``                        ``<run>-vN`` INCREMENTAL over the last published
                                           version (what the replicas serve)
``weight_vN`` in full mode                 ``<run>-vN`` FULL from the directory itself
========================================== ==================================================

The cycle of each version (the cadence, one time budget, READY → trigger → wait → verify,
the served-identity file, the manifest, the ``hotload/*`` metrics) is core's
:class:`~cwtrain.hotload.PublishSession`; what stays here is slime's: its directories, its
delta format's version order, and the mirror of what is served. After a failed publish the
replicas keep serving the previous identity, so the session makes the next version FULL,
published from the mirror (the chain is cut) instead of as a delta over bytes that never
arrived.

**A resumed run** (the same run id, slime restarted): slime captures its baseline again and
numbers its versions from 1. The baseline call leaves a later version of the run served (the
fleet is not rolled back unless ``CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME`` asks); each
``weight_vN`` whose number is not above the run's last attempt is published as the session's
next version (its order is still checked by slime's numbers), and the first one is FULL from
the mirror. Without a mirror no FULL can be published, so the baseline call refuses to go on.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cwtrain.errors import ConfigError, CWTrainError, SnapshotError, SnapshotNotFoundError
from cwtrain.hotload import (
    INDEX_NAME,
    PublishOutcome,
    PublishSession,
    TensorSource,
    checkpoint_checksums,
    read_index_file,
)

from .config import HookConfig, check_delta_args
from .dialect import dialect_of

if TYPE_CHECKING:
    from cwtrain.hotload import HotLoader, WeightMirror

__all__ = ["VERSION_DIR", "SlimePublisher", "version_of"]

log = logging.getLogger(__name__)

VERSION_DIR = re.compile(r"^weight_v(\d{6,})$")


def version_of(version_dir: str | os.PathLike[str]) -> int | None:
    """The version N of a ``weight_vNNNNNN`` directory, or ``None`` for anything else (the root)."""
    match = VERSION_DIR.match(Path(os.fspath(version_dir).rstrip("/\\")).name)
    return int(match.group(1)) if match else None


def _read_index(directory: Path) -> dict[str, object]:
    try:
        return read_index_file(directory / INDEX_NAME)
    except SnapshotNotFoundError:
        raise SnapshotError(
            f"{directory} has no {INDEX_NAME}: slime writes it last; was the hook called early?"
        ) from None


class SlimePublisher:
    """Publishes a slime run's weight versions to one deployment (a fork's too, by its dialect).

    Args:
        config: the hook's settings.
        loader: the :class:`~cwtrain.hotload.HotLoader` to use; built from ``config`` on
            first use when ``None``.

    Attributes:
        session: the run's publish session (the served identity, the cadence, the loader).
    """

    def __init__(self, config: HookConfig, loader: HotLoader | None = None) -> None:
        self.config = config
        self.session = PublishSession(config, target=loader.target if loader is not None else None)
        self._mirror: WeightMirror | None = None
        self._version = -1  # last version seen (published or skipped)

    @property
    def served_identity(self) -> str | None:
        """The identity the replicas serve (or will, once the last hot-load completes); ``None`` before the baseline."""
        return self.session.served_identity

    @property
    def last_version(self) -> int:
        """The last version seen, published or skipped (``-1`` before the baseline)."""
        return self._version

    def close(self) -> None:
        """Drop the mirror and close the session (the publisher cannot be used afterwards)."""
        self._mirror = None
        self.session.close()

    def __call__(self, args: argparse.Namespace, version_dir: str) -> dict[str, float]:
        """Publish what slime just wrote: the baseline for the root, else the version directory."""
        version = version_of(version_dir)
        if version is None:
            return self.publish_baseline(args).metrics()
        return self.publish_version(args, version_dir, version).metrics()

    # ------------------------------------------------------------------ baseline

    def publish_baseline(self, args: argparse.Namespace) -> PublishOutcome:
        """Publish ``--hf-checkpoint`` as ``<run>-v000000`` (FULL) and seed the served copy.

        Raises:
            ConfigError: slime's delta flags cannot be hot-loaded.
            CWTrainError: the baseline is required but missing, or publishing failed.
        """
        if not self.config.state_dir:
            self.config = self.config.with_state_dir(args)
            self.session.settings = self.config
        if _delta_mode(args):
            check_delta_args(args)
        hf_dir = Path(str(getattr(args, "hf_checkpoint", "") or ""))
        if not str(hf_dir) or not hf_dir.is_dir():
            raise CWTrainError(f"--hf-checkpoint {hf_dir} is not a directory: the baseline is published from it")
        plan = self.session.plan_baseline()  # reads what the fleet holds of the run (a restarted trainer's)
        served = self.session.served_version
        if served is not None and served > 0 and not self.config.rollback_on_resume and not self.config.use_mirror:
            raise ConfigError(
                f"run {self.config.run_id!r} resumes while the deployment serves {self.session.served_identity}: the "
                "restart's first version is published FULL from the served copy, and none is kept. Turn "
                "CWTRAIN_HOTLOAD_MIRROR on, or set CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME=1 to point the fleet back at "
                "the baseline and go on with deltas from it"
            )
        started = time.perf_counter()
        checksums = dict(checkpoint_checksums(hf_dir))  # the baseline's manifest and the mirror's
        plan.measure(stage_seconds=time.perf_counter() - started)
        if self.config.use_mirror:
            from cwtrain.hotload import WeightMirror

            started = time.perf_counter()
            # in host memory: one copy of the served weights, never a second model on disk
            self._mirror = WeightMirror.create(hf_dir, None, version="000000", checksums=checksums)
            plan.measure(mirror_seconds=time.perf_counter() - started)
        outcome = self.session.publish_baseline(hf_dir, checksums=checksums, plan=plan)
        self._version = 0
        return outcome

    # ------------------------------------------------------------------ versions

    def publish_version(
        self,
        args: argparse.Namespace,
        version_dir: str | os.PathLike[str],
        version: int,
        *,
        cadence_position: int | None = None,
    ) -> PublishOutcome:
        """Publish ``weight_v{version:06d}`` (FULL cut, delta, or nothing for an empty delta).

        Args:
            args: the framework's namespace.
            version_dir: the version's directory (a delta, or a full checkpoint in full mode).
            version: its version number (the identity's suffix).
            cadence_position: the count the FULL cadence goes by (default ``version``).

        Raises:
            SnapshotError: the directory is malformed or out of order.
            MirrorError: the delta does not apply to the served copy.
            CWTrainError: upload or hot-load failed (the next version is then published FULL).
        """
        directory = Path(os.fspath(version_dir))
        if not _delta_mode(args) and not _is_delta_dir(directory):
            self._version = version  # full mode: no baseline call, no chain
            return self.session.publish_directory(self.session.begin(version, full=True), directory)
        if self._version < 0:
            raise CWTrainError(
                f"{directory.name} arrived before the baseline: the hook must see slime's delta root first "
                "(slime calls it on rank 0 at the first update_weights)"
            )
        index = _read_index(directory)
        metadata = index["metadata"]
        weight_map = index["weight_map"]
        assert isinstance(metadata, dict) and isinstance(weight_map, dict)
        base = str(metadata.get("base_version", ""))
        if not base.isdigit() or int(base) != self._version or version <= self._version:
            raise SnapshotError(
                f"{directory} is version {version} over base_version {base!r}, but the last version seen is "
                f"{self._version:06d}: versions must arrive in order, each over the previous one"
            )
        plan = self.session.begin(version, cadence_position=cadence_position)
        mirror = self._mirror
        if mirror is not None:
            started = time.perf_counter()
            report = mirror.apply_delta(directory)
            plan.measure(
                mirror_seconds=time.perf_counter() - started,
                tensors_changed=report.tensors_changed,
                tensors_verified=report.tensors_verified,
                bytes_changed=report.bytes_changed,
            )  # else the upload reports the delta's tensors and their raw bytes
        self._version = version
        if mirror is None:
            if plan.full:
                raise CWTrainError(
                    f"{plan.identity} must be published FULL (chain cut) but no served copy is kept: "
                    "turn CWTRAIN_HOTLOAD_MIRROR on"
                )
            return self.session.publish_directory(plan, directory) if weight_map else self.session.skip(plan)
        # a cut is published from the served copy, with the base checkpoint's small files (its config.json)
        served = TensorSource(mirror.tensors, full_files=mirror.files)
        if plan.full:
            return self.session.publish(plan, served, checksums=mirror.checksums)
        if not weight_map:
            mirror.advance(f"{version:06d}")
            return self.session.skip(plan)
        # auto: the delta is weighed by its files (as uploaded) against the last FULL, and cut from the served copy
        return self.session.publish_directory(plan, directory, checksums=mirror.checksums, full=served)


def _is_delta_dir(directory: Path) -> bool:
    """Whether ``directory`` holds a delta (its index metadata names a delta encoding)."""
    try:
        metadata = _read_index(directory)["metadata"]
    except SnapshotError:
        return False  # a lone model.safetensors, or no index: a full checkpoint
    return isinstance(metadata, dict) and "delta_encoding" in metadata


def _delta_mode(args: argparse.Namespace) -> bool:
    """Whether ``args`` select the disk-delta updater (slime: ``--update-weight-mode delta``; a fork: its dialect's)."""
    return dialect_of(args).delta_mode(args)

"""``SlimePublisher``: turns slime's/miles' weight versions on disk into hot-loads.

One publisher lives on the publishing process (rank 0, or the publishing Ray actor) for
the whole run. It is called with slime's delta root (the baseline call) and then with
each ``weight_vNNNNNN`` directory:

========================================== ==================================================
call                                       published as
========================================== ==================================================
root (baseline)                            ``<run>-v000000`` FULL from ``--hf-checkpoint``;
                                           skipped when a COMPLETED one with a matching
                                           manifest exists (resume)
``weight_vN``, ``F > 0`` and ``N % F == 0`` ``<run>-vN`` FULL from the served copy (the
                                           mirror) after applying and verifying the delta
``weight_vN`` with an empty ``weight_map`` nothing; the next delta goes against the last
                                           published version, whose bytes are identical
other ``weight_vN``                        ``<run>-vN`` INCREMENTAL over the last published
                                           version (what the replicas serve)
``weight_vN`` in full mode                 ``<run>-vN`` FULL from the directory itself
========================================== ==================================================

``F`` is ``CWTRAIN_HOTLOAD_FULL_EVERY``. After a failed publish the replicas keep serving
the previous identity, so the next version is published FULL from the mirror (the chain is
cut) instead of as a delta over bytes that never arrived. Each published identity gets a
manifest (snapshot-format.md section 8.1) when the full tensor checksums are known.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cwtrain.errors import CWTrainError, SnapshotError, SnapshotNotFoundError
from cwtrain.hotload.format.identity import version_identity
from cwtrain.hotload.format.index import INDEX_NAME, read_index_file
from cwtrain.hotload.publish.cadence import ChainCadence
from cwtrain.hotload.publish.manifest import snapshot_manifest
from cwtrain.infra.enums import HotLoadState
from cwtrain.integrations.nvext import write_served_identity

from .config import HookConfig, check_delta_args

if TYPE_CHECKING:
    from cwtrain.hotload.files.mirror import DeltaReport, WeightMirror
    from cwtrain.hotload.format.tensors import TensorData
    from cwtrain.hotload.loader import HotLoader, ProgressEvent
    from cwtrain.infra.enums import PromptCachePolicy
    from cwtrain.infra.models import HotLoad, HotLoadReplica

__all__ = ["METRIC_PREFIX", "VERSION_DIR", "PublishingLoader", "SlimePublisher", "build_loader", "version_of"]

log = logging.getLogger(__name__)

METRIC_PREFIX = "hotload/"
VERSION_DIR = re.compile(r"^weight_v(\d{6,})$")


def version_of(version_dir: str | os.PathLike[str]) -> int | None:
    """The version N of a ``weight_vNNNNNN`` directory, or ``None`` for anything else (the root)."""
    match = VERSION_DIR.match(Path(os.fspath(version_dir).rstrip("/\\")).name)
    return int(match.group(1)) if match else None


POLL_INTERVAL = 1.0
"""Seconds between hot-load polls of the hook's loader (a hot-load takes seconds to minutes)."""


class PublishingLoader(Protocol):
    """What :class:`SlimePublisher` uses of a :class:`~cwtrain.hotload.loader.HotLoader`.

    ``HotLoader`` has these methods with these signatures; a stand-in (tests, a custom
    publishing path) needs nothing more.
    """

    def publish(
        self,
        checkpoint: Path | Mapping[str, TensorData],
        identity: str,
        *,
        previous_identity: str | None = None,
        prompt_cache_policy: PromptCachePolicy | str | None = None,
        workers: int = 8,
        wait: bool = True,
        timeout: float | None = None,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> HotLoad:
        """Upload a snapshot directory (or tensors, with ``extra_files``) as ``identity`` and create its hot-load."""
        ...

    def wait(
        self,
        hot_load_id: str,
        *,
        timeout: float | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> HotLoad:
        """Poll until the hot-load ends and every replica serves its identity."""
        ...

    def verify_served(self, hot_load_id: str, identity: str) -> list[HotLoadReplica]:
        """Every replica READY on ``identity``."""
        ...

    def completed_hot_load(self, identity: str) -> HotLoad | None:
        """The newest COMPLETED hot-load of ``identity``, if any."""
        ...

    def current_identity(self) -> str:
        """The identity of the newest COMPLETED hot-load, else ``"initial"``."""
        ...

    def rollback(self, identity: str, *, wait: bool = True, timeout: float | None = None) -> HotLoad:
        """Re-activate ``identity`` (a new hot-load copying its newest COMPLETED one)."""
        ...

    def upload_manifest(self, identity: str, manifest_json: Mapping[str, Any]) -> str:
        """Write the manifest of ``identity`` create-only; returns its URI."""
        ...

    def read_manifest(self, identity: str) -> dict[str, Any] | None:
        """The manifest of ``identity``, or ``None`` when absent."""
        ...


def build_loader(config: HookConfig) -> HotLoader:
    """A :class:`~cwtrain.hotload.loader.HotLoader` for ``config`` (token from the environment)."""
    from cwtrain.hotload.loader import HotLoader
    from cwtrain.infra.client import InferenceClient

    client = InferenceClient(
        base_url=config.api_base_url,
        headers=dict(config.api_headers) or None,
        verify=not config.api_insecure,
    )
    return HotLoader(client, config.deployment_id, timeout=config.timeout, poll_interval=POLL_INTERVAL)


def _read_index(directory: Path) -> dict[str, Any]:
    try:
        return read_index_file(directory / INDEX_NAME)
    except SnapshotNotFoundError:
        raise SnapshotError(
            f"{directory} has no {INDEX_NAME}: slime writes it last; was the hook called early?"
        ) from None


class SlimePublisher:
    """Publishes a slime/miles run's weight versions to one deployment.

    Args:
        config: the hook's settings.
        loader: the :class:`~cwtrain.hotload.loader.HotLoader` (or any
            :class:`PublishingLoader`) to use; built from ``config`` on first use when ``None``.

    Attributes:
        served_identity: the identity the replicas serve (or will, once the last hot-load
            completes); ``None`` before the baseline.
        served_version: its version number.
    """

    def __init__(self, config: HookConfig, loader: PublishingLoader | None = None) -> None:
        self.config = config
        self._loader = loader
        self._mirror: WeightMirror | None = None
        self.served_identity: str | None = None
        self.served_version: int | None = None
        self._version = -1  # last version seen (published or skipped)
        self.cadence = ChainCadence(config.full_every)

    # ------------------------------------------------------------------ plumbing

    @property
    def loader(self) -> PublishingLoader:
        """The hot-loader (built on first use)."""
        if self._loader is None:
            self._loader = build_loader(self.config)
        return self._loader

    @property
    def state_dir(self) -> Path:
        """The local working directory (mirror, FULL staging, served identity)."""
        if not self.config.state_dir:
            raise CWTrainError("SlimePublisher needs config.state_dir (HookConfig.with_state_dir(args) fills it)")
        return Path(self.config.state_dir)

    @property
    def last_version(self) -> int:
        """The last version seen, published or skipped (``-1`` before the baseline)."""
        return self._version

    def identity(self, version: int) -> str:
        """``<run>-v{version:06d}``."""
        return version_identity(self.config.run_id, version)

    def close(self) -> None:
        """Drop the mirror and the loader (the publisher cannot be used afterwards)."""
        self._mirror = None
        self._loader = None

    def __call__(self, args: argparse.Namespace, version_dir: str) -> dict[str, float]:
        """Publish what slime just wrote: the baseline for the root, else the version directory."""
        version = version_of(version_dir)
        if version is None:
            return self.publish_baseline(args)
        return self.publish_version(args, version_dir, version)

    # ------------------------------------------------------------------ baseline

    def publish_baseline(self, args: argparse.Namespace) -> dict[str, float]:
        """Publish ``--hf-checkpoint`` as ``<run>-v000000`` (FULL) and seed the served copy.

        Skipped when a COMPLETED hot-load of that identity exists and its manifest holds the
        same tensor checksums (a resumed run); then the replicas are pointed back at it if
        they serve something else. With ``publish_baseline=False`` the identity must exist.

        Raises:
            ConfigError: slime's delta flags cannot be hot-loaded.
            CWTrainError: the baseline is required but missing, or publishing failed.
        """
        if self.config.state_dir == "":
            self.config = self.config.with_state_dir(args)
        if _delta_mode(args):
            check_delta_args(args)
        hf_dir = Path(str(getattr(args, "hf_checkpoint", "") or ""))
        if not str(hf_dir) or not hf_dir.is_dir():
            raise CWTrainError(f"--hf-checkpoint {hf_dir} is not a directory: the baseline is published from it")
        identity = self.identity(0)
        metrics: dict[str, float] = {"baseline_skipped": 0.0, "chain_cut": 1.0, "incremental": 0.0}

        started = time.perf_counter()
        from cwtrain.hotload.files.write import checkpoint_checksums

        checksums = dict(checkpoint_checksums(hf_dir))
        metrics["stage_seconds"] = time.perf_counter() - started

        existing = self.loader.completed_hot_load(identity)
        if self.config.publish_baseline and (existing is None or not self._manifest_matches(identity, checksums)):
            self._publish(hf_dir, identity, previous=None, metrics=metrics)
            self.write_manifest(identity, 0, checksums)
        else:
            if existing is None:
                raise CWTrainError(
                    f"CWTRAIN_HOTLOAD_PUBLISH_BASELINE is off but {identity} was never hot-loaded on deployment "
                    f"{self.config.deployment_id}: publish it first or turn CWTRAIN_HOTLOAD_PUBLISH_BASELINE on"
                )
            metrics["baseline_skipped"] = 1.0
            log.info("baseline %s already completed with the same weights; not published again", identity)
            if self.loader.current_identity() != identity:
                self._record(
                    self.loader.rollback(identity, wait=self.config.wait, timeout=self.config.timeout), metrics
                )
        self.record_served(identity, 0)
        self._version = 0
        self.cadence.published(full=True)
        self.state_metrics(metrics, 0)

        if self.config.use_mirror:
            started = time.perf_counter()
            from cwtrain.hotload.files.mirror import WeightMirror

            # in host memory: one copy of the served weights, never a second model on disk
            self._mirror = WeightMirror.create(hf_dir, None, version="000000", checksums=checksums)
            metrics["mirror_seconds"] = time.perf_counter() - started
        return _prefixed(metrics)

    # ------------------------------------------------------------------ versions

    def publish_version(
        self,
        args: argparse.Namespace,
        version_dir: str | os.PathLike[str],
        version: int,
        *,
        cadence_position: int | None = None,
    ) -> dict[str, float]:
        """Publish ``weight_v{version:06d}`` (FULL cut, delta, or nothing for an empty delta).

        Args:
            args: slime's or miles' namespace.
            version_dir: the version's directory (a delta, or a full checkpoint in full mode).
            version: its version number (the identity's suffix).
            cadence_position: the count the FULL cadence goes by (default ``version``); a
                caller whose versions skip numbers (miles' post-save hook) passes how many
                versions it has published, so ``CWTRAIN_HOTLOAD_FULL_EVERY`` counts publishes.

        Raises:
            SnapshotError: the directory is malformed or out of order.
            MirrorError: the delta does not apply to the served copy.
            CWTrainError: upload or hot-load failed (the next version is then published FULL).
        """
        directory = Path(os.fspath(version_dir))
        if not _delta_mode(args) and not _is_delta_dir(directory):
            return self._publish_full_dir(directory, version)  # full mode: no baseline call, no chain
        if self.served_identity is None:
            raise CWTrainError(
                f"{directory.name} arrived before the baseline: the hook must see slime's delta root first "
                "(slime calls it on rank 0 at the first update_weights)"
            )
        index = _read_index(directory)
        base = str(index["metadata"].get("base_version", ""))
        if not base.isdigit() or int(base) != self._version or version <= self._version:
            raise SnapshotError(
                f"{directory} is version {version} over base_version {base!r}, but the last version seen is "
                f"{self._version:06d}: versions must arrive in order, each over the previous one"
            )
        weight_map: dict[str, str] = index["weight_map"]
        identity = self.identity(version)
        metrics: dict[str, float] = {"chain_cut": 0.0, "incremental": 0.0, "skipped_empty": 0.0}

        mirror = self._mirror
        if mirror is not None:
            started = time.perf_counter()
            report = mirror.apply_delta(directory)
            metrics["mirror_seconds"] = time.perf_counter() - started
            metrics.update(_report_metrics(report))
        else:
            metrics["tensors_changed"] = float(len(weight_map))
        self._version = version

        if self.cadence.is_full(cadence_position if cadence_position is not None else version):
            if mirror is None:
                raise CWTrainError(
                    f"{identity} must be published FULL (chain cut) but no served copy is kept: "
                    "turn CWTRAIN_HOTLOAD_MIRROR on"
                )
            self._publish_from_mirror(mirror, identity, version, metrics)
            return self.state_metrics(metrics, version)
        if not weight_map:
            metrics["skipped_empty"] = 1.0
            log.info("%s is an empty delta: nothing to publish; replicas keep %s", identity, self.served_identity)
            if mirror is not None:
                mirror.advance(f"{version:06d}")
            return self.state_metrics(metrics, version)
        previous = self.served_identity
        self._publish(directory, identity, previous=previous, metrics=metrics)
        metrics["incremental"] = 1.0
        self.record_served(identity, version)
        if mirror is not None:
            self.write_manifest(identity, version, mirror.checksums)
        return self.state_metrics(metrics, version)

    def _publish_from_mirror(
        self, mirror: WeightMirror, identity: str, version: int, metrics: dict[str, float]
    ) -> None:
        """A FULL snapshot (chain cut) straight from the served copy in memory; nothing staged on disk."""
        self._publish(mirror.tensors, identity, previous=None, metrics=metrics, extra_files=mirror.files)
        metrics["chain_cut"] = 1.0
        self.record_served(identity, version)
        self.write_manifest(identity, version, mirror.checksums)

    def _publish_full_dir(self, directory: Path, version: int) -> dict[str, float]:
        """Full mode: each version directory is a complete HF checkpoint."""
        identity = self.identity(version)
        metrics: dict[str, float] = {"chain_cut": 1.0, "incremental": 0.0}
        self._publish(directory, identity, previous=None, metrics=metrics)
        self.record_served(identity, version)
        self._version = version
        return self.state_metrics(metrics, version)

    # ------------------------------------------------------------------ hot-load

    def _publish(
        self,
        source: Path | Mapping[str, TensorData],
        identity: str,
        *,
        previous: str | None,
        metrics: dict[str, float],
        extra_files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Upload ``source`` (a directory, or tensors for a FULL with their ``extra_files``) as ``identity``; hot-load; wait when configured."""
        config = self.config
        loader = self.loader
        deadline = time.monotonic() + config.timeout
        try:
            started = time.perf_counter()
            hot_load = loader.publish(
                source,
                identity,
                previous_identity=previous,
                prompt_cache_policy=config.prompt_cache_policy,
                wait=False,
                timeout=config.timeout,
                workers=config.upload_workers,
                extra_files=extra_files,
            )
            metrics["upload_seconds"] = time.perf_counter() - started
            metrics["snapshot_bytes"] = float(_source_bytes(source))
            started = time.perf_counter()
            if config.wait:
                progress: list[ProgressEvent] = []
                hot_load = loader.wait(
                    hot_load.id, timeout=max(1.0, deadline - time.monotonic()), on_progress=progress.append
                )
                if progress:
                    metrics["replicas_ready"] = float(progress[-1].ready)
                    metrics["replicas_total"] = float(progress[-1].total)
                if config.verify:
                    metrics["replicas_verified"] = float(len(loader.verify_served(hot_load.id, identity)))
            metrics["hot_load_seconds"] = time.perf_counter() - started
            metrics["publish_seconds"] = metrics["upload_seconds"] + metrics["hot_load_seconds"]
        except BaseException:
            # The replicas keep what they served: cut the chain on the next version.
            self.cadence.failed()
            raise
        self.cadence.published(full=previous is None)
        self._record(hot_load, metrics)

    def state_metrics(self, metrics: dict[str, float], version: int) -> dict[str, float]:
        """``metrics`` (unprefixed names) with ``version``, the served version and the chain length, prefixed.

        The keys :mod:`~cwtrain.integrations.slime.tracking` logs every record with.
        """
        metrics["version"] = float(version)
        metrics["served_version"] = float(self.served_version if self.served_version is not None else -1)
        metrics["chain_length"] = float(self.cadence.deltas_in_chain)
        return _prefixed(metrics)

    @staticmethod
    def _record(hot_load: HotLoad, metrics: dict[str, float]) -> None:
        metrics["completed"] = 1.0 if hot_load.state is HotLoadState.COMPLETED else 0.0

    def record_served(self, identity: str, version: int) -> None:
        """Remember that the replicas serve ``identity`` (version ``version``) from now on.

        Also written to ``<state_dir>/served_identity`` (identity + newline, replaced
        atomically: :func:`cwtrain.integrations.nvext.write_served_identity`), where the
        rollout function and the prompt-cache salt read it; a failed write only warns.
        """
        self.served_identity = identity
        self.served_version = version
        try:
            write_served_identity(self.state_dir, identity)
        except OSError as exc:  # informational only
            log.warning("could not record the served identity in %s: %s", self.config.state_dir, exc)

    # ------------------------------------------------------------------ manifests

    def write_manifest(self, identity: str, version: int, checksums: Mapping[str, str]) -> None:
        """Write the manifest of ``identity`` (snapshot-format.md section 8.1); a failure only warns.

        Args:
            identity: the published identity.
            version: its version (recorded as six digits, ``"000012"``).
            checksums: the Adler-32 of every tensor of the full weights at ``identity``.
        """
        config = self.config
        manifest = snapshot_manifest(identity, config.deployment_id, config.run_id, checksums, f"{version:06d}")
        try:
            self.loader.upload_manifest(identity, manifest)
        except Exception as exc:  # manifests only help resumes: warn, never fail the step
            log.warning("could not write the manifest of %s: %s", identity, exc)

    def _manifest_matches(self, identity: str, checksums: Mapping[str, str]) -> bool:
        try:
            manifest = self.loader.read_manifest(identity)
        except Exception as exc:
            log.warning("could not read the manifest of %s (%s); publishing it again", identity, exc)
            return False
        return manifest is not None and dict(manifest.get("tensors") or {}) == dict(checksums)


def _is_delta_dir(directory: Path) -> bool:
    """Whether ``directory`` holds a delta (its index metadata names a delta encoding)."""
    try:
        metadata = _read_index(directory)["metadata"]
    except SnapshotError:
        return False  # a lone model.safetensors, or no index: a full checkpoint
    return "delta_encoding" in metadata


def _delta_mode(args: argparse.Namespace) -> bool:
    """slime ``--update-weight-mode delta`` or miles ``--update-weight-transfer-mode disk-delta``."""
    return (
        getattr(args, "update_weight_mode", None) == "delta"
        or getattr(args, "update_weight_transfer_mode", None) == "disk-delta"
    )


def _source_bytes(source: Path | Mapping[str, TensorData]) -> int:
    if isinstance(source, Path):
        return sum(p.stat().st_size for p in source.iterdir() if p.is_file())
    return sum(tensor.nbytes for tensor in source.values())


def _report_metrics(report: DeltaReport) -> dict[str, float]:
    return {
        "tensors_changed": float(report.tensors_changed),
        "tensors_verified": float(report.tensors_verified),
        "bytes_changed": float(report.bytes_changed),
    }


def _prefixed(metrics: Mapping[str, float]) -> dict[str, float]:
    return {METRIC_PREFIX + key: float(value) for key, value in metrics.items()}

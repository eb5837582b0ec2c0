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

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cwtrain.errors import CWTrainError, SnapshotError
from cwtrain.hotload.chain import ChainCadence

from .config import HookConfig, check_delta_args, identity_for

if TYPE_CHECKING:
    from cwtrain.hotload.loader import HotLoader

__all__ = ["METRIC_PREFIX", "VERSION_DIR", "SlimePublisher", "build_loader", "version_of"]

log = logging.getLogger(__name__)

METRIC_PREFIX = "hotload/"
VERSION_DIR = re.compile(r"^weight_v(\d{6,})$")
INDEX_NAME = "model.safetensors.index.json"
SERVED_IDENTITY_FILE = "served_identity"


def version_of(version_dir: str | os.PathLike[str]) -> int | None:
    """The version N of a ``weight_vNNNNNN`` directory, or ``None`` for anything else (the root)."""
    match = VERSION_DIR.match(Path(os.fspath(version_dir).rstrip("/\\")).name)
    return int(match.group(1)) if match else None


POLL_INTERVAL = 1.0
"""Seconds between hot-load polls of the hook's loader (a hot-load takes seconds to minutes)."""


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
    path = directory / INDEX_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SnapshotError(
            f"{directory} has no {INDEX_NAME}: slime writes it last; was the hook called early?"
        ) from None
    except ValueError as exc:
        raise SnapshotError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SnapshotError(f"{path} is not a JSON object")
    return data


class SlimePublisher:
    """Publishes a slime/miles run's weight versions to one deployment.

    Args:
        config: the hook's settings.
        loader: the :class:`~cwtrain.hotload.loader.HotLoader` to use; built from ``config`` on
            first use when ``None``.

    Attributes:
        served_identity: the identity the replicas serve (or will, once the last hot-load
            completes); ``None`` before the baseline.
        served_version: its version number.
    """

    def __init__(self, config: HookConfig, loader: HotLoader | None = None) -> None:
        self.config = config
        self._loader = loader
        self._mirror: Any = None
        self.served_identity: str | None = None
        self.served_version: int | None = None
        self._version = -1  # last version seen (published or skipped)
        self.cadence = ChainCadence(config.full_every)

    # ------------------------------------------------------------------ plumbing

    @property
    def loader(self) -> HotLoader:
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

    def identity(self, version: int) -> str:
        """``<run>-v{version:06d}``."""
        return identity_for(self.config.run_id, version)

    def close(self) -> None:
        """Drop the mirror and the loader (the publisher cannot be used afterwards)."""
        self._mirror = None
        self._loader = None

    def __call__(self, args: Any, version_dir: str) -> dict[str, float]:
        """Publish what slime just wrote: the baseline for the root, else the version directory."""
        version = version_of(version_dir)
        if version is None:
            return self.publish_baseline(args)
        return self.publish_version(args, version_dir, version)

    # ------------------------------------------------------------------ baseline

    def publish_baseline(self, args: Any) -> dict[str, float]:
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
        from cwtrain.hotload.delta import checkpoint_checksums

        checksums = dict(checkpoint_checksums(hf_dir))
        metrics["stage_seconds"] = time.perf_counter() - started

        existing = self.loader.completed_hot_load(identity)
        if self.config.publish_baseline and (existing is None or not self._manifest_matches(identity, checksums)):
            self._publish(hf_dir, identity, previous=None, metrics=metrics)
            self._write_manifest(identity, "000000", checksums)
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
        self._served(identity, 0)
        self._version = 0
        self.cadence.published(full=True)

        if self.config.use_mirror:
            started = time.perf_counter()
            from cwtrain.hotload.mirror import WeightMirror

            # in host memory: one copy of the served weights, never a second model on disk
            self._mirror = WeightMirror.create(hf_dir, None, version="000000", checksums=checksums)
            metrics["mirror_seconds"] = time.perf_counter() - started
        return _prefixed(metrics)

    # ------------------------------------------------------------------ versions

    def publish_version(self, args: Any, version_dir: str | os.PathLike[str], version: int) -> dict[str, float]:
        """Publish ``weight_v{version:06d}`` (FULL cut, delta, or nothing for an empty delta).

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
        metadata = index.get("metadata") or {}
        base = str(metadata.get("base_version", ""))
        if not base.isdigit() or int(base) != self._version or version <= self._version:
            raise SnapshotError(
                f"{directory} is version {version} over base_version {base!r}, but the last version seen is "
                f"{self._version:06d}: versions must arrive in order, each over the previous one"
            )
        weight_map = index.get("weight_map") or {}
        identity = self.identity(version)
        metrics: dict[str, float] = {"chain_cut": 0.0, "incremental": 0.0, "skipped_empty": 0.0}

        if self._mirror is not None:
            started = time.perf_counter()
            report = self._mirror.apply_delta(directory)
            metrics["mirror_seconds"] = time.perf_counter() - started
            metrics.update(_report_metrics(report))
        else:
            metrics["tensors_changed"] = float(len(weight_map))
        self._version = version

        if self.cadence.is_full(version):
            if self._mirror is None:
                raise CWTrainError(
                    f"{identity} must be published FULL (chain cut) but no served copy is kept: "
                    "turn CWTRAIN_HOTLOAD_MIRROR on"
                )
            self._publish_from_mirror(identity, version, metrics)
            return _prefixed(metrics)
        if not weight_map:
            metrics["skipped_empty"] = 1.0
            log.info("%s is an empty delta: nothing to publish; replicas keep %s", identity, self.served_identity)
            if self._mirror is not None:
                self._mirror.advance(f"{version:06d}")
            return _prefixed(metrics)
        previous = self.served_identity
        self._publish(directory, identity, previous=previous, metrics=metrics)
        metrics["incremental"] = 1.0
        self._served(identity, version)
        if self._mirror is not None:
            self._write_manifest(identity, f"{version:06d}", self._mirror_checksums())
        return _prefixed(metrics)

    def _publish_from_mirror(self, identity: str, version: int, metrics: dict[str, float]) -> None:
        """A FULL snapshot (chain cut) straight from the served copy in memory; nothing staged on disk."""
        self._publish(self._mirror.tensors, identity, previous=None, metrics=metrics)
        metrics["chain_cut"] = 1.0
        self._served(identity, version)
        self._write_manifest(identity, f"{version:06d}", self._mirror_checksums())

    def _publish_full_dir(self, directory: Path, version: int) -> dict[str, float]:
        """Full mode: each version directory is a complete HF checkpoint."""
        identity = self.identity(version)
        metrics: dict[str, float] = {"chain_cut": 1.0, "incremental": 0.0}
        self._publish(directory, identity, previous=None, metrics=metrics)
        self._served(identity, version)
        self._version = version
        return _prefixed(metrics)

    # ------------------------------------------------------------------ hot-load

    def _publish(
        self, source: Path | Mapping[str, Any], identity: str, *, previous: str | None, metrics: dict[str, float]
    ) -> None:
        """Upload ``source`` (a directory, or tensors for a FULL) as ``identity``; hot-load; wait when configured."""
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
            )
            metrics["upload_seconds"] = time.perf_counter() - started
            metrics["snapshot_bytes"] = float(_source_bytes(source))
            started = time.perf_counter()
            if config.wait:
                progress: list[Any] = []
                hot_load = loader.wait(
                    hot_load.id, timeout=max(1.0, deadline - time.monotonic()), on_progress=progress.append
                )
                if progress:
                    metrics["replicas_ready"] = float(progress[-1].ready)
                    metrics["replicas_total"] = float(progress[-1].total)
                if config.verify:
                    metrics["replicas_verified"] = float(len(loader.verify_served(hot_load.id, identity)))
            metrics["hot_load_seconds"] = time.perf_counter() - started
        except BaseException:
            # The replicas keep what they served: cut the chain on the next version.
            self.cadence.failed()
            raise
        self.cadence.published(full=previous is None)
        self._record(hot_load, metrics)

    def _record(self, hot_load: Any, metrics: dict[str, float]) -> None:
        state = getattr(getattr(hot_load, "state", None), "name", None)
        metrics["completed"] = 1.0 if state == "COMPLETED" else 0.0

    def _served(self, identity: str, version: int) -> None:
        self.served_identity = identity
        self.served_version = version
        try:
            path = self.state_dir / SERVED_IDENTITY_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(identity, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:  # informational only
            log.warning("could not record the served identity in %s: %s", self.config.state_dir, exc)

    # ------------------------------------------------------------------ manifests

    def _mirror_checksums(self) -> Mapping[str, str] | None:
        checksums = getattr(self._mirror, "checksums", None)
        if callable(checksums):
            checksums = checksums()
        return checksums if isinstance(checksums, Mapping) else None

    def manifest(self, identity: str, version: str, checksums: Mapping[str, str]) -> dict[str, Any]:
        """The manifest of ``identity`` (snapshot-format.md section 8.1)."""
        return {
            "checksum_format": "adler32",
            "deployment_id": self.config.deployment_id,
            "identity": identity,
            "run_id": self.config.run_id,
            "tensors": dict(sorted(checksums.items())),
            "version": version,
        }

    def _write_manifest(self, identity: str, version: str, checksums: Mapping[str, str] | None) -> None:
        if checksums is None:
            return
        try:
            self.loader.upload_manifest(identity, self.manifest(identity, version, checksums))
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
        metadata = _read_index(directory).get("metadata") or {}
    except SnapshotError:
        return False  # a lone model.safetensors, or no index: a full checkpoint
    return isinstance(metadata, dict) and "delta_encoding" in metadata


def _delta_mode(args: Any) -> bool:
    """slime ``--update-weight-mode delta`` or miles ``--update-weight-transfer-mode disk-delta``."""
    return (
        getattr(args, "update_weight_mode", None) == "delta"
        or getattr(args, "update_weight_transfer_mode", None) == "disk-delta"
    )


def _source_bytes(source: Path | Mapping[str, Any]) -> int:
    if isinstance(source, Path):
        return sum(p.stat().st_size for p in source.iterdir() if p.is_file())
    return sum(int(getattr(t, "nbytes", 0) or 0) for t in source.values())


def _report_metrics(report: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, names in (
        ("tensors_changed", ("tensors_changed", "changed")),
        ("tensors_verified", ("tensors_verified", "verified")),
        ("bytes_changed", ("bytes_changed", "changed_bytes")),
    ):
        for name in names:
            value = getattr(report, name, None)
            if value is not None:
                out[key] = float(len(value) if isinstance(value, list | tuple | set | frozenset | dict) else value)
                break
    return out


def _prefixed(metrics: Mapping[str, float]) -> dict[str, float]:
    return {METRIC_PREFIX + key: float(value) for key, value in metrics.items()}

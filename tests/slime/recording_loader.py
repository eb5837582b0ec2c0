"""``RecordingLoader``: stands where ``HotLoader`` does in decision tests and records what would be published.

It implements :class:`~cwtrain.integrations.slime.publisher.PublishingLoader` (mypy checks the
signatures) and answers with core's own models: :class:`~cwtrain.infra.models.HotLoad`,
:class:`~cwtrain.infra.models.HotLoadReplica` and
:class:`~cwtrain.hotload.loader.ProgressEvent`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cwtrain.hotload.format.index import INDEX_NAME
from cwtrain.hotload.format.tensors import TensorData
from cwtrain.hotload.loader import ProgressEvent
from cwtrain.infra.enums import HotLoadState, PromptCachePolicy, ReplicaState, SnapshotType
from cwtrain.infra.models import HotLoad, HotLoadReplica, IncrementalSnapshotMetadata
from cwtrain.integrations.slime.publisher import PublishingLoader

#: ``(identity, type, previous identity, sorted file names, index dict)`` of one publish.
Published = tuple[str, str, str | None, list[str], dict[str, Any]]


def _hot_load(hot_load_id: str, identity: str, previous: str | None, state: HotLoadState) -> HotLoad:
    return HotLoad(
        id=hot_load_id,
        deployment_id="dep-1",
        identity=identity,
        type=SnapshotType.INCREMENTAL if previous else SnapshotType.FULL,
        incremental_snapshot_metadata=IncrementalSnapshotMetadata(previous) if previous else None,
        state=state,
    )


def _replica(name: str, identity: str) -> HotLoadReplica:
    return HotLoadReplica(name=name, state=ReplicaState.READY, current_snapshot_identity=identity)


class RecordingLoader(PublishingLoader):
    """Stands where ``HotLoader`` does for decision tests: records what would be published.

    ``published`` holds ``(identity, type, previous identity, sorted file names, index dict)``.
    Set ``fail_next`` to make the next upload raise. Two replicas serve every completed hot-load.
    """

    def __init__(self) -> None:
        self.published: list[Published] = []
        self.manifests: dict[str, dict[str, Any]] = {}
        self.completed: dict[str, HotLoad] = {}
        self.current = "initial"
        self.fail_next: BaseException | None = None
        self.rollbacks: list[str] = []

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
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        kind = SnapshotType.INCREMENTAL if previous_identity else SnapshotType.FULL
        if isinstance(checkpoint, Path):
            files = sorted(p.name for p in checkpoint.iterdir() if p.is_file())
            index_path = checkpoint / INDEX_NAME
            index: dict[str, Any] = json.loads(index_path.read_text()) if index_path.exists() else {}
        else:  # tensors in memory (a FULL cut from the served copy)
            files = ["<tensors>", *sorted(extra_files or {})]
            index = {"tensors": sorted(checkpoint)}
        self.published.append((identity, kind.name, previous_identity, files, index))
        return _hot_load(f"hl-{len(self.published)}", identity, previous_identity, HotLoadState.IN_PROGRESS)

    def wait(
        self,
        hot_load_id: str,
        *,
        timeout: float | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> HotLoad:
        identity, _, previous, _, _ = self.published[-1]
        hot_load = _hot_load(hot_load_id, identity, previous, HotLoadState.COMPLETED)
        self.completed[identity] = hot_load
        self.current = identity
        if on_progress is not None:
            on_progress(ProgressEvent.of(hot_load, [_replica("r0", identity), _replica("r1", identity)], 0.0))
        return hot_load

    def verify_served(self, hot_load_id: str, identity: str) -> list[HotLoadReplica]:
        return [_replica("r0", identity), _replica("r1", identity)]

    def completed_hot_load(self, identity: str) -> HotLoad | None:
        return self.completed.get(identity)

    def current_identity(self) -> str:
        return self.current

    def rollback(self, identity: str, *, wait: bool = True, timeout: float | None = None) -> HotLoad:
        self.rollbacks.append(identity)
        self.current = identity
        return self.completed[identity]

    def upload_manifest(self, identity: str, manifest_json: Mapping[str, Any]) -> str:
        self.manifests[identity] = dict(manifest_json)
        return f"s3://bucket/_manifests/{identity}.json"

    def read_manifest(self, identity: str) -> dict[str, Any] | None:
        return self.manifests.get(identity)

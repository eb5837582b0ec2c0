"""``RecordingLoader``: stands where ``HotLoader`` does in decision tests and records what would be published."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class _HotLoad:
    def __init__(self, id: str, identity: str, kind: str, previous: str | None) -> None:
        from cwtrain.infra.enums import HotLoadState

        self.id = id
        self.identity = identity
        self.type = kind
        self.previous_identity = previous
        self.state = HotLoadState.COMPLETED


class RecordingLoader:
    """Stands where ``HotLoader`` does for decision tests: records what would be published.

    ``published`` holds ``(identity, type, previous identity, sorted file names, index dict)``.
    Set ``fail_next`` to make the next upload raise.
    """

    def __init__(self) -> None:
        self.published: list[tuple[str, str, str | None, list[str], dict[str, Any]]] = []
        self.manifests: dict[str, dict[str, Any]] = {}
        self.completed: dict[str, _HotLoad] = {}
        self.current = "initial"
        self.fail_next: BaseException | None = None
        self.rollbacks: list[str] = []

    def publish(
        self,
        source: Any,
        identity: str,
        *,
        previous_identity: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _HotLoad:
        import json

        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        kind = "INCREMENTAL" if previous_identity else "FULL"
        if isinstance(source, (str, Path)):
            directory = Path(source)
            files = sorted(p.name for p in directory.iterdir() if p.is_file())
            index_path = directory / "model.safetensors.index.json"
            index = json.loads(index_path.read_text()) if index_path.exists() else {}
        else:  # tensors in memory (a FULL cut from the served copy)
            files = ["<tensors>"]
            index = {"tensors": sorted(source)}
        self.published.append((identity, kind, previous_identity, files, index))
        return _HotLoad(f"hl-{len(self.published)}", identity, kind, previous_identity)

    def wait(self, hot_load_id: str, *, timeout: float | None = None, on_progress: Any = None, **kw: Any) -> _HotLoad:
        entry = self.published[-1]
        hot_load = _HotLoad(hot_load_id, entry[0], entry[1], entry[2])
        self.completed[entry[0]] = hot_load
        self.current = entry[0]
        if on_progress is not None:
            on_progress(type("Event", (), {"ready": 2, "total": 2})())
        return hot_load

    def verify_served(self, hot_load_id: str, identity: str) -> list[Any]:
        return [object(), object()]

    def completed_hot_load(self, identity: str) -> _HotLoad | None:
        return self.completed.get(identity)

    def current_identity(self) -> str:
        return self.current

    def rollback(self, identity: str, **kwargs: Any) -> _HotLoad:
        self.rollbacks.append(identity)
        self.current = identity
        return self.completed[identity]

    def upload_manifest(self, identity: str, manifest: dict[str, Any]) -> str:
        self.manifests[identity] = manifest
        return f"s3://bucket/_manifests/{identity}.json"

    def read_manifest(self, identity: str) -> dict[str, Any] | None:
        return self.manifests.get(identity)

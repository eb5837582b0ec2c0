"""``RecordingLoader``: a real ``HotLoader`` on the in-memory API stand-in and the test's S3 bucket.

Publishers drive core's publish session through it unchanged: snapshots are encoded,
uploaded to the session's moto server and hot-loaded on the API stand-in
(``tests/core/fakeapi.py``, hot-loads complete on the next poll). What was published is read
back from both: ``published`` lists ``(identity, type, previous identity, sorted file names,
index dict)`` of every identity's first hot-load, ``rollbacks`` the identities hot-loaded
again, ``manifests`` the manifests stored in the bucket.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))

from fakeapi import FakeAPI, error_response

from cwtrain.hotload import INDEX_NAME, HotLoader

#: ``(identity, type, previous identity, sorted file names, index dict)`` of one publish.
Published = tuple[str, str, str | None, list[str], dict[str, Any]]

PREFIX = "hotload"


class RecordingLoader(HotLoader):
    """A real :class:`~cwtrain.hotload.HotLoader` on the API stand-in and a moto bucket; reads back what was published.

    Args:
        s3: a boto3 client of the test's S3 server.
        bucket: an empty bucket on it (the deployment's ``hotLoad.bucket``).
        deployment_id: the deployment's id.
    """

    def __init__(self, s3: Any, bucket: str, deployment_id: str = "dep-1") -> None:
        self.fake = FakeAPI()
        self.fake.add_gateway()
        self.fake.add_deployment(deployment_id)
        self.fake.deployments[deployment_id]["spec"]["hotLoad"].update(bucket=bucket, pathPrefix=PREFIX)
        self.fake.steps_to_complete = 1
        self.boto = s3
        self.bucket = bucket
        super().__init__(self.fake.client(), deployment_id, s3=s3, timeout=30.0, poll_interval=0.0)

    # ------------------------------------------------------------------ faults

    def fail_next_hot_load(self, message: str) -> None:
        """The next hot-load request is refused (HTTP 400 ``invalid_argument``) with ``message``."""
        self.fake.inject("POST", r"/hotLoads$", error_response(400, "invalid_argument", message))

    def serve(self, identity: str) -> None:
        """The deployment has since hot-loaded another identity (a completed hot-load of it, newest)."""
        self.fake.add_hot_load(f"moved-{len(self.fake.hot_loads)}", identity, deployment=self.deployment_id)

    # ------------------------------------------------------------------ what was published

    def _created(self) -> list[dict[str, Any]]:
        return [
            hot_load["spec"]
            for hot_load in self.fake.hot_loads.values()
            if hot_load["spec"].get("deploymentId") == self.deployment_id
            and not hot_load["spec"]["id"].startswith("moved-")
        ]  # fmt: skip

    @property
    def published(self) -> list[Published]:
        """Every identity's first hot-load, in order, with the objects stored under it."""
        seen: set[str] = set()
        out: list[Published] = []
        for spec in self._created():
            identity = spec["identity"]
            if identity in seen:
                continue
            seen.add(identity)
            kind = str(spec.get("type", "")).removeprefix("SNAPSHOT_TYPE_")
            previous = (spec.get("incrementalSnapshotMetadata") or {}).get("previousSnapshotIdentity")
            files = self.files(identity)
            index = json.loads(self.read(identity, INDEX_NAME)) if INDEX_NAME in files else {}
            out.append((identity, kind, previous, files, index))
        return out

    @property
    def rollbacks(self) -> list[str]:
        """Identities hot-loaded again after their first hot-load."""
        seen: set[str] = set()
        again: list[str] = []
        for spec in self._created():
            identity = spec["identity"]
            (again.append(identity) if identity in seen else seen.add(identity))
        return again

    @property
    def manifests(self) -> dict[str, dict[str, Any]]:
        """The manifests stored in the bucket, by identity."""
        listed = self.boto.list_objects_v2(Bucket=self.bucket, Prefix=f"{PREFIX}/_manifests/").get("Contents", [])
        out: dict[str, dict[str, Any]] = {}
        for item in listed:
            identity = item["Key"].rsplit("/", 1)[1].removesuffix(".json")
            out[identity] = json.loads(self.boto.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read())
        return out

    def files(self, identity: str) -> list[str]:
        """The names of the objects stored under ``identity``."""
        listed = self.boto.list_objects_v2(Bucket=self.bucket, Prefix=f"{PREFIX}/{identity}/").get("Contents", [])
        return sorted(item["Key"].rsplit("/", 1)[1] for item in listed)

    def read(self, identity: str, name: str) -> bytes:
        """One stored object's bytes."""
        body: bytes = self.boto.get_object(Bucket=self.bucket, Key=f"{PREFIX}/{identity}/{name}")["Body"].read()
        return body

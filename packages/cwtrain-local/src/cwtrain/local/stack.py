"""``LocalStack``: the whole remote side of cwtrain on loopback, as one context manager.

Starts, in order: moto's S3 server (:class:`~cwtrain.local.harness.objectstore.MotoS3Server`) with
a bucket, a TCP proxy in front of it (so faults can cut uploads), the control plane
(:class:`~cwtrain.local.controlplane.server.ControlPlaneServer`) and the reconciler that runs
engine replicas and one inference gateway per gateway resource. Everything stops on exit,
also after an exception or Ctrl-C, and an ``atexit`` hook kills whatever is left::

    from cwtrain.local import LocalStack

    with LocalStack(replicas=2) as stack:
        os.environ.update(stack.env())        # COREWEAVE_API_URL, COREWEAVE_API_TOKEN, AWS_*, CW_S3_ENDPOINT
        target = stack.deploy()               # base weights, a gateway, a hot-load deployment; READY
        print(target.deployment_id, target.base_url, target.model)
        stack.faults.api.fail_next(1)         # see cwtrain.local.harness.faults

The control plane accepts ``stack.token`` (admin) and ``stack.viewer_token`` (reads only);
the gateway accepts ``stack.token`` as its ``coreWeaveAuth`` key. Replicas accept only
``stack.replica_token`` (a token of their own, given to them in their environment): the
supervisor and the gateways send it, and nothing reaches a replica without it.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import secrets
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from cwtrain.errors import LifecycleError, UsageError
from cwtrain.hotload import INDEX_NAME, SINGLE_FILE_NAME, generated_index_bytes, header_of_bytes
from cwtrain.jsondoc import load_json
from cwtrain.local.controlplane.server import API_PREFIX, ControlPlaneServer
from cwtrain.local.controlplane.state import ControlPlaneState
from cwtrain.local.controlplane.supervisor import Supervisor
from cwtrain.local.engine.gateway import GatewayServer
from cwtrain.local.engine.processes import DEFAULT_REPLICA_COMMAND
from cwtrain.local.harness.faults import APIFaults, Faults, S3Proxy
from cwtrain.local.harness.objectstore import DEFAULT_REGION, MotoS3Server

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_MODEL_NAME",
    "DeployedModel",
    "LocalStack",
    "deployment_request",
    "gateway_request",
]

log = logging.getLogger("cwtrain.local.stack")

DEFAULT_BUCKET = "cwtrain-local"
DEFAULT_MODEL_NAME = "cwtrain-tiny"


@dataclass(frozen=True)
class DeployedModel:
    """What :meth:`LocalStack.deploy` created.

    Attributes:
        gateway_id: the gateway.
        deployment_id: the hot-load deployment.
        model: ``spec.model.name``, the OpenAI model name.
        base_url: the rollout base URL (gateway endpoint + ``/v1``).
        bucket: the hot-load bucket.
        path_prefix: the hot-load path prefix.
    """

    gateway_id: str
    deployment_id: str
    model: str
    base_url: str
    bucket: str
    path_prefix: str


def gateway_request(name: str, zone: str) -> dict[str, Any]:
    """A CreateGatewayRequest body (no ``id``): one zone, ``coreWeaveAuth``, OpenAI body routing."""
    return {
        "name": name,
        "zones": [zone],
        "coreWeaveAuth": {},
        "bodyBasedRouting": {"apiType": "API_TYPE_OPENAI"},
    }


def deployment_request(
    name: str,
    *,
    gateway_id: str,
    model: str,
    bucket: str,
    base_path: str,
    replicas: int,
    hot_load_prefix: str | None,
) -> dict[str, Any]:
    """A CreateDeploymentRequest body (no ``id``) for the tiny model on the local engine.

    Args:
        name: the deployment's name.
        gateway_id: the gateway it is attached to.
        model: ``spec.model.name`` (the OpenAI model name).
        bucket: where the base weights and the snapshots live.
        base_path: the base checkpoint's path in ``bucket``.
        replicas: ``autoscaling.min`` and ``max``.
        hot_load_prefix: the ``hotLoad.pathPrefix`` (``TRANSITION_MODE_ASYNC``); ``None``: no hot-load.
    """
    spec: dict[str, Any] = {
        "name": name,
        "gatewayIds": [gateway_id],
        "runtime": {"engine": "dynamo-vllm", "version": "1.2.3", "engineConfig": {}, "engineEnv": {}},
        "resources": {"instanceType": "CPU_LOCAL", "gpuCount": 1},
        "model": {"name": model, "bucket": bucket, "path": base_path},
        "autoscaling": {"min": replicas, "max": replicas, "concurrency": 64},
        "traffic": {"weight": 100},
    }
    if hot_load_prefix is not None:
        spec["hotLoad"] = {"bucket": bucket, "pathPrefix": hot_load_prefix, "transitionMode": "TRANSITION_MODE_ASYNC"}
    return spec


class LocalStack:
    """Object store, control plane, gateways and engine replicas on loopback.

    Args:
        replicas: replicas of a deployment made by :meth:`deploy` (``autoscaling.min``).
        port: control plane port (a free one when ``None``).
        token: the admin API token (random when ``None``).
        bucket: the bucket created at start.
        hot_load_enabled: the organisation flag; off refuses hot-load deployments.
        cancel_implemented: ``False`` answers ``:cancel`` with ``unimplemented`` like the service today.
        s3_proxy: put the fault-injecting proxy between clients and moto.
        replica_command: argv prefix starting a replica (default ``python -m cwtrain.local.engine.replica``).
        hot_load_timeout: seconds after which an unfinished hot-load fails.
        workdir: where replica logs go (a temporary directory, removed at exit, when ``None``).
        hot_load_delay: seconds every hot-load lasts more on every replica (they stay UPDATING
            before the swap; a cancel ends the wait): a slow hot-load on purpose, to try
            ``cwtrain hotload cancel`` and ``wait`` by hand (``cwtrain local up --slow-hot-load``).
        s3_keys: ``(access key id, secret key)``, the one pair the object store accepts (the
            stack's own, :attr:`MotoS3Server.credentials`, when ``None``).
    """

    def __init__(
        self,
        replicas: int = 2,
        port: int | None = None,
        *,
        token: str | None = None,
        bucket: str = DEFAULT_BUCKET,
        hot_load_enabled: bool = True,
        cancel_implemented: bool = True,
        s3_proxy: bool = True,
        replica_command: Sequence[str] = DEFAULT_REPLICA_COMMAND,
        hot_load_timeout: float = 600.0,
        workdir: str | Path | None = None,
        hot_load_delay: float = 0.0,
        s3_keys: tuple[str, str] | None = None,
    ) -> None:
        if replicas < 1:
            raise UsageError(f"LocalStack(replicas={replicas}): replicas must be at least 1")
        self.replicas = replicas
        self._port = port or 0
        self.token = token or "cwl-" + secrets.token_urlsafe(24)
        self.viewer_token = "cwl-viewer-" + secrets.token_urlsafe(16)
        self.replica_token = "cwl-replica-" + secrets.token_urlsafe(24)
        self.bucket = bucket
        self.region = DEFAULT_REGION
        self._hot_load_enabled = hot_load_enabled
        self._cancel_implemented = cancel_implemented
        self._use_proxy = s3_proxy
        self._replica_command = list(replica_command)
        self._hot_load_timeout = hot_load_timeout
        if hot_load_delay < 0:
            raise UsageError(f"LocalStack(hot_load_delay={hot_load_delay}): the delay cannot be negative")
        self._hot_load_delay = hot_load_delay
        self._s3_keys = s3_keys
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path()
        self._moto: MotoS3Server | None = None
        self._proxy: S3Proxy | None = None
        self._api: ControlPlaneServer | None = None
        self._supervisor: Supervisor | None = None
        self._direct_s3: Any = None
        self._cleanups: list[Callable[[], None]] = []
        self._faults: Faults | None = None
        self.state: ControlPlaneState | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalStack:
        """Start every component; on failure, stop what started and re-raise."""
        if self._api is not None:
            return self
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self._own_workdir:
            self.workdir = Path(tempfile.mkdtemp(prefix="cwtrain-local-"))
            self._cleanups.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._s3_keys is None:
            moto = self._moto = MotoS3Server().start()
        else:
            access_key, secret_key = self._s3_keys
            moto = self._moto = MotoS3Server(access_key=access_key, secret_key=secret_key).start()
        self._cleanups.append(moto.stop)
        self._direct_s3 = moto.client()
        self._direct_s3.create_bucket(Bucket=self.bucket, CreateBucketConfiguration={"LocationConstraint": self.region})
        if self._use_proxy:
            proxy = self._proxy = S3Proxy(moto.port).start()
            self._cleanups.append(proxy.stop)
        state = self.state = ControlPlaneState(
            hot_load_enabled=self._hot_load_enabled,
            cancel_implemented=self._cancel_implemented,
            object_exists=self._object_exists,
        )
        faults = APIFaults()
        api = self._api = ControlPlaneServer(
            state, [self.token], viewer_tokens=[self.viewer_token], port=self._port, faults=faults
        ).start()
        self._cleanups.append(api.stop)
        supervisor = self._supervisor = Supervisor(
            state,
            s3_endpoint=moto.endpoint_url,
            s3_env=moto.credentials,
            workdir=self.workdir,
            replica_command=self._replica_command,
            start_gateway=self._start_gateway,
            hot_load_timeout=self._hot_load_timeout,
            replica_token=self.replica_token,
            hot_load_delay=self._hot_load_delay,
        ).start()
        self._cleanups.append(supervisor.stop)
        self._faults = Faults(faults, self._proxy, supervisor, self._direct_s3)

    def stop(self) -> None:
        """Stop everything that started, newest first; safe to call twice."""
        cleanups, self._cleanups = self._cleanups, []
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Exception:
                log.exception("local stack: cleanup failed")
        self._api = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start_gateway(self, gateway_id: str) -> tuple[str, Callable[[], None]]:
        server = GatewayServer(
            gateway_id, self._route, frozenset({self.token}), replica_token=self.replica_token
        ).start()
        return server.url, server.stop

    def _route(self, gateway_id: str) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
        state, supervisor = self.state, self._supervisor
        if state is None or supervisor is None:
            return None, {}
        with state.lock:
            gateway = state.gateways.get(gateway_id)
            if gateway is None or gateway.status != "STATUS_READY":
                return None, {}
            attached = [
                (d.id, str(d.spec["model"]["name"]))
                for d in state.deployments.values()
                if gateway_id in d.spec["gatewayIds"] and d.status != "STATUS_DELETING"
            ]
            spec = dict(gateway.spec)
        return spec, {model: supervisor.routes(deployment_id) for deployment_id, model in attached}

    def _object_exists(self, bucket: str, key: str) -> bool:
        try:
            self._direct_s3.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (403, 404):
                return False
            raise
        return True

    # ------------------------------------------------------------------ access

    def _need(self, value: Any, what: str) -> Any:
        if value is None:
            raise UsageError(f"the local stack is not running; {what} exists only between start() and stop()")
        return value

    @property
    def api_url(self) -> str:
        """The control plane origin (``COREWEAVE_API_URL``)."""
        return str(self._need(self._api, "api_url").url)

    @property
    def s3_endpoint(self) -> str:
        """The S3 endpoint clients use (through the fault proxy when enabled)."""
        if self._proxy is not None:
            return self._proxy.endpoint_url
        return str(self._need(self._moto, "s3_endpoint").endpoint_url)

    @property
    def faults(self) -> Faults:
        """Fault injection hooks (see :mod:`cwtrain.local.harness.faults`)."""
        return self._need(self._faults, "faults")  # type: ignore[no-any-return]

    @property
    def supervisor(self) -> Supervisor:
        """The reconciler running replicas and gateways."""
        return self._need(self._supervisor, "supervisor")  # type: ignore[no-any-return]

    def env(self) -> dict[str, str]:
        """The environment variables to export to use this stack."""
        moto = self._need(self._moto, "env()")
        return {
            "COREWEAVE_API_URL": self.api_url,
            "COREWEAVE_API_TOKEN": self.token,
            "AWS_REGION": self.region,
            "CW_S3_ENDPOINT": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": moto.credentials["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": moto.credentials["AWS_SECRET_ACCESS_KEY"],
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
            "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
            "CWTRAIN_LOCAL_BUCKET": self.bucket,
        }

    def s3_client(self, **kwargs: Any) -> Any:
        """A boto3 S3 client for this stack's endpoint (path-style, static keys)."""
        moto = self._need(self._moto, "s3_client()")
        client = moto.client(**kwargs)
        if self._proxy is None:
            return client
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            region_name=self.region,
            aws_access_key_id=moto.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=moto.credentials["AWS_SECRET_ACCESS_KEY"],
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"max_attempts": 3, "mode": "standard"},
            ),
            **kwargs,
        )

    # ----------------------------------------------------------------- helpers

    def seed_base_model(self, path: str = "base/tiny", *, seed: int = 0, bucket: str | None = None) -> str:
        """Upload the tiny model's base weights as a FULL checkpoint; returns its ``s3://`` URI.

        Writes ``config.json``, ``model.safetensors`` and the generated index under
        ``s3://<bucket>/<path>/``. Same seed, same bytes.
        """
        from cwtrain.local.engine.model import write_base_checkpoint

        bucket = bucket or self.bucket
        prefix = path.strip("/")
        with tempfile.TemporaryDirectory(prefix="cwtrain-base-") as tmp:
            write_base_checkpoint(tmp, seed=seed)
            files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
        weights = files[SINGLE_FILE_NAME]
        files[INDEX_NAME] = generated_index_bytes(header_of_bytes(weights, source=f"{prefix}/{SINGLE_FILE_NAME}"))
        s3 = self._direct_s3
        for name, data in files.items():
            s3.upload_fileobj(io.BytesIO(data), bucket, f"{prefix}/{name}")
        return f"s3://{bucket}/{prefix}/"

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> tuple[int, Any]:
        """One control plane call: ``(HTTP status, decoded JSON)``; ``path`` is relative to the API prefix."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.api_url + API_PREFIX + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token or self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, load_json(raw) if raw else {}
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, load_json(raw) if raw else {}

    def _expect(self, status: int, payload: Any, what: str) -> Any:
        if status != 200:
            raise LifecycleError(f"{what} failed: HTTP {status}: {payload}")
        return payload

    def wait_ready(self, kind: str, resource_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Poll ``/{kind}s/{id}`` until ``STATUS_READY``; ``LifecycleError`` on FAILED or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            status, payload = self.api("GET", f"/{kind}s/{resource_id}")
            resource = self._expect(status, payload, f"GET {kind} {resource_id}")[kind]
            value = resource["status"]["status"]
            if value == "STATUS_READY":
                return resource  # type: ignore[no-any-return]
            if value == "STATUS_FAILED" or time.monotonic() > deadline:
                logs = "\n".join(
                    p.read_text(errors="replace")[-2000:] for p in sorted(self.workdir.glob("replica-*.log"))[-2:]
                )
                raise LifecycleError(f"{kind} {resource_id} is {value}: {resource['status']}\nreplica logs:\n{logs}")
            time.sleep(0.05)

    def deploy(
        self,
        *,
        name: str = "tiny",
        model: str = DEFAULT_MODEL_NAME,
        replicas: int | None = None,
        seed: int = 0,
        path_prefix: str = "hotload",
        hot_load: bool = True,
        gateway_id: str | None = None,
        timeout: float = 180.0,
    ) -> DeployedModel:
        """Seed base weights, create a gateway (unless given) and a deployment, wait for READY."""
        base_path = f"base/{name}"
        self.seed_base_model(base_path, seed=seed)
        if gateway_id is None:
            body = {"id": str(uuid.uuid4()), **gateway_request(f"{name}-gateway", self.region)}
            gateway_id = self._expect(*self.api("POST", "/gateways", body), "create gateway")["gateway"]["spec"]["id"]
        gateway = self.wait_ready("gateway", str(gateway_id), timeout)
        spec = {
            "id": str(uuid.uuid4()),
            **deployment_request(
                name,
                gateway_id=str(gateway_id),
                model=model,
                bucket=self.bucket,
                base_path=base_path,
                replicas=replicas or self.replicas,
                hot_load_prefix=path_prefix if hot_load else None,
            ),
        }
        created = self._expect(*self.api("POST", "/deployments", spec), "create deployment")
        deployment_id = created["deployment"]["spec"]["id"]
        self.wait_ready("deployment", deployment_id, timeout)
        return DeployedModel(
            gateway_id=str(gateway_id),
            deployment_id=deployment_id,
            model=model,
            base_url=gateway["status"]["endpoints"][0].rstrip("/") + "/v1",
            bucket=self.bucket,
            path_prefix=path_prefix if hot_load else "",
        )

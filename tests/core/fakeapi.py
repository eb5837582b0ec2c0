"""A small stateful stand-in of the v1alpha1 inference API for unit tests (httpx.MockTransport).

It keeps gateways, deployments and hot-loads in memory and follows the contract's
rules that the client and ``HotLoader`` rely on: client-chosen ids, ``already_exists``,
single-flight (``failed_precondition`` "already in progress"), hot-loads that advance
one state per GET (PENDING → IN_PROGRESS → COMPLETED, or FAILED for identities listed
in ``fail_identities``), replicas that catch up on completion, hot-loads refused while the
deployment is neither READY nor ERROR, and pagination. Tests
queue raw responses with :meth:`FakeAPI.inject` to simulate faults.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

import httpx

from cwtrain.infra import InferenceClient

PREFIX = "/v1alpha1/inference"
_clock = itertools.count(1)


def _now() -> str:
    # Monotonic fake times: one second apart, so "newest" is well defined.
    n = next(_clock)
    return f"2026-01-01T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z"


class FakeAPI:
    """In-memory API state plus an httpx handler."""

    def __init__(self, *, replicas: int = 2, page_size: int | None = None) -> None:
        self.gateways: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.hot_loads: dict[str, dict[str, Any]] = {}
        self.replicas: dict[str, list[dict[str, Any]]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.injected: list[tuple[str, str, Callable[[httpx.Request], httpx.Response]]] = []
        self.fail_identities: set[str] = set()
        self.replica_count = replicas
        self.page_size = page_size
        self.steps_to_complete = 2
        self.serving = "initial"
        self.deleting: dict[str, int] = {}

    # -- helpers for tests

    def client(self, **kwargs: Any) -> InferenceClient:
        api = InferenceClient("test-token-123456", base_url="https://api.test", transport=self.transport(), **kwargs)
        api.sleep = lambda seconds: None
        return api

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def inject(self, method: str, path_regex: str, response: Callable[[httpx.Request], httpx.Response]) -> None:
        """Answer the next matching request with ``response`` instead of the state."""
        self.injected.append((method, path_regex, response))

    def add_gateway(self, gid: str = "gw-1", *, zone: str = "US-EAST-04A", endpoint: str = "gw1.example.com") -> str:
        self.gateways[gid] = {
            "spec": {"id": gid, "name": f"name-{gid}", "zones": [zone], "coreWeaveAuth": {}},
            "status": {"status": "STATUS_READY", "endpoints": [endpoint] if endpoint else []},
        }
        return gid

    def add_deployment(self, did: str = "dep-1", *, status: str = "STATUS_READY", hot_load: bool = True) -> str:
        spec: dict[str, Any] = {
            "id": did,
            "name": f"name-{did}",
            "gatewayIds": ["gw-1"],
            "runtime": {"engine": "dynamo-vllm", "version": "1.2.3"},
            "model": {"name": "tiny-model", "bucket": "weights", "path": "base"},
        }
        if hot_load:
            spec["hotLoad"] = {"bucket": "weights", "pathPrefix": "hotload", "transitionMode": "TRANSITION_MODE_ASYNC"}
        self.deployments[did] = {"spec": spec, "status": {"status": status, "conditions": []}}
        return did

    def add_hot_load(
        self, hid: str, identity: str, *, state: str = "COMPLETED", deployment: str = "dep-1", **spec: Any
    ) -> None:
        self.hot_loads[hid] = {
            "spec": {"id": hid, "deploymentId": deployment, "identity": identity, "type": "SNAPSHOT_TYPE_FULL", **spec},
            "status": {"state": f"HOT_LOAD_STATE_{state}", "createdAt": _now()},
            "_steps": 99,
        }
        self.replicas[hid] = self._replica_list(identity if state == "COMPLETED" else self.serving, "READY")

    def _replica_list(self, identity: str, state: str, reason: str = "") -> list[dict[str, Any]]:
        return [
            {
                "name": f"replica-{i}",
                "zone": "US-EAST-04A",
                "state": state,
                "currentSnapshotIdentity": identity,
                "errorReason": reason,
            }
            for i in range(self.replica_count)
        ]

    # -- the handler

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix(PREFIX)
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, path, body))
        for i, (method, pattern, response) in enumerate(self.injected):
            if method == request.method and re.fullmatch(pattern, path):
                del self.injected[i]
                return response(request)
        if request.headers.get("Authorization") != "Bearer test-token-123456":
            return _error(401, "unauthenticated", "bad token")
        return self._route(request, path, body)

    def _route(self, request: httpx.Request, path: str, body: Any) -> httpx.Response:
        method, q = request.method, request.url.params
        if path == "/gateways/parameters":
            return _ok({"zones": ["US-EAST-04A"]})
        if path == "/deployments/parameters":
            return _ok(
                {
                    "gatewayIds": q.get_list("gatewayIds") or list(self.gateways),
                    "runtimeParameters": {
                        "runtimeVersions": {"dynamo-vllm": {"versions": ["1.2.3"]}},
                        "runtimeConfigOptions": {"dynamo-vllm": {"allowedKeys": ["max-model-len"]}},
                    },
                    "resourceParameters": {"instanceTypes": ["H100_80GB_SXM5"]},
                }
            )
        for kind, store in (("gateway", self.gateways), ("deployment", self.deployments)):
            if path == f"/{kind}s" and method == "GET":
                parent = q.get("parentGatewayId")
                items = [r for r in store.values() if not parent or parent in r["spec"].get("gatewayIds", ())]
                return _ok({"items": items})
            if path == f"/{kind}s" and method == "POST":
                rid = body["id"]
                if rid in store or any(r["spec"]["name"] == body["name"] for r in store.values()):
                    return _error(409, "already_exists", f"{kind} exists")
                spec = {k: v for k, v in body.items()}
                store[rid] = {"spec": spec, "status": {"status": "STATUS_CREATING", "conditions": []}}
                return _ok({kind: store[rid]})
            m = re.fullmatch(rf"/{kind}s/([^/]+)", path)
            if m:
                rid = m[1]
                if rid not in store:
                    return _error(404, "not_found", f"{kind} {rid} not found")
                if method == "DELETE":
                    self.deleting.setdefault(rid, 2)
                    return _ok({})
                if rid in self.deleting:
                    self.deleting[rid] -= 1
                    if self.deleting[rid] <= 0:
                        del store[rid]
                        del self.deleting[rid]
                        return _error(404, "not_found", f"{kind} {rid} not found")
                    store[rid]["status"]["status"] = "STATUS_DELETING"
                return _ok({kind: store[rid]})
        if path == "/hotLoads" and method == "POST":
            return self._create_hot_load(body)
        if path == "/hotLoads" and method == "GET":
            items = sorted(self.hot_loads.values(), key=lambda h: h["status"]["createdAt"], reverse=True)
            parent = q.get("parentDeploymentId")
            if parent:
                items = [h for h in items if h["spec"]["deploymentId"] == parent]
            return self._page(items, "hotLoads", q)
        m = re.fullmatch(r"/hotLoads/([^/:]+)(/replicas|:cancel)?", path)
        if m:
            hid = m[1]
            if hid not in self.hot_loads:
                return _error(404, "not_found", f"hot-load {hid} not found")
            if m[2] == ":cancel":
                return _error(501, "unimplemented", "cancel is not implemented")
            if m[2] == "/replicas":
                return self._page(self.replicas[hid], "replicas", q)
            self._advance(hid)
            return _ok({"hotLoad": _public(self.hot_loads[hid])})
        return _error(404, "not_found", f"no route {method} {path}")

    def _page(self, items: list[Any], key: str, q: httpx.QueryParams) -> httpx.Response:
        size = self.page_size or int(q.get("maxPageSize") or 50)
        start = int(q.get("pageToken") or 0)
        chunk = items[start : start + size]
        nxt = str(start + size) if start + size < len(items) else ""
        payload: dict[str, Any] = {key: [_public(i) for i in chunk]}
        if nxt:
            payload["nextPageToken"] = nxt
        return _ok(payload)

    def _create_hot_load(self, body: dict[str, Any]) -> httpx.Response:
        hid = body["hotLoadId"]
        if hid in self.hot_loads:
            return _error(409, "already_exists", f"hot-load {hid} exists")
        dep = body["deploymentId"]
        status = self.deployments.get(dep, {}).get("status", {}).get("status", "STATUS_READY")
        if status not in ("STATUS_READY", "STATUS_ERROR"):  # as the local stack (and the contract) refuse
            return _error(400, "failed_precondition", f"deployment {dep} is {status}, not STATUS_READY")
        if any(
            h["spec"]["deploymentId"] == dep and h["status"]["state"].endswith(("PENDING", "IN_PROGRESS"))
            for h in self.hot_loads.values()
        ):
            return _error(400, "failed_precondition", "another hot-load is already in progress")
        spec = {k: v for k, v in body.items() if k != "hotLoadId"}
        spec["id"] = hid
        self.hot_loads[hid] = {
            "spec": spec,
            "status": {"state": "HOT_LOAD_STATE_PENDING", "createdAt": _now()},
            "_steps": 0,
        }
        self.replicas[hid] = self._replica_list(self.serving, "PENDING_UPDATE")
        return _ok({"hotLoad": _public(self.hot_loads[hid])})

    def _advance(self, hid: str) -> None:
        hot_load = self.hot_loads[hid]
        if hot_load["_steps"] >= 99:
            return
        hot_load["_steps"] += 1
        identity = hot_load["spec"]["identity"]
        if hot_load["_steps"] >= self.steps_to_complete:
            hot_load["_steps"] = 99
            if identity in self.fail_identities:
                hot_load["status"]["state"] = "HOT_LOAD_STATE_FAILED"
                self.replicas[hid] = self._replica_list(self.serving, "ERROR", "checksum mismatch in lm_head.weight")
            else:
                hot_load["status"]["state"] = "HOT_LOAD_STATE_COMPLETED"
                self.serving = identity
                self.replicas[hid] = self._replica_list(identity, "READY")
        else:
            hot_load["status"]["state"] = "HOT_LOAD_STATE_IN_PROGRESS"
            self.replicas[hid] = self._replica_list(self.serving, "UPDATING")


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if not k.startswith("_")}


def _ok(payload: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=payload)


def _error(status: int, code: str | int, message: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message, "details": []})


def error_response(
    status: int, code: str | int | None = None, message: str = "boom"
) -> Callable[[httpx.Request], httpx.Response]:
    """An injectable error answer (``code=None`` sends no code)."""

    def answer(request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = {"message": message}
        if code is not None:
            body["code"] = code
        return httpx.Response(status, json=body)

    return answer

"""One engine replica of the local stack: a process that serves the tiny model over HTTP.

Started by :class:`cwtrain.local.LocalStack` (or by hand)::

    AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… AWS_REGION=US-EAST-04A CWTRAIN_LOCAL_REPLICA_TOKEN=… \\
    python -m cwtrain.local.engine.replica --name r0 --port 8101 --s3-endpoint http://127.0.0.1:9000 \\
        --bucket weights --path-prefix hotload --model-name tiny \\
        --model-bucket models --model-path tiny/base [--peer http://127.0.0.1:8102]

At start it loads the deployment's base checkpoint (identity ``initial``) from
``s3://<model bucket>/<model path>/``, or copies the weights a peer serves (``--peer``),
then answers on ``127.0.0.1:<port>``:

| Route | Answer |
|---|---|
| ``GET /health`` | ``{"name", "state", "identity", "error_reason", "hot_load_id", …}``; 503 until weights are loaded |
| ``POST /admin/hotload`` | body ``{"hot_load_id", "identity", "chain": [{"identity", "type"}, …]}`` (and ``"fault"``, below) → 202; loads in the background |
| ``POST /admin/hotload/cancel`` | body ``{"hot_load_id"}`` → ``{"canceled": bool}``; a load still running stops and the weights served stay |
| ``GET /admin/weights`` | the served weights as one safetensors file (``__metadata__.identity``) |
| ``GET /v1/models``, ``POST /v1/completions`` | OpenAI-compatible, as vLLM 0.31 serves them (:mod:`cwtrain.local.engine.completions`) |
| ``POST /v1/chat/completions`` | the same for chat, with the tokenizer's chat template (:mod:`cwtrain.local.engine.chat`) |
| ``POST /tokenize``, ``POST /detokenize`` | vLLM's tokenizer endpoints (:mod:`cwtrain.local.engine.tokenization`) |
| ``GET``/``POST /ping`` | vLLM's probe: the status ``/health`` has, an empty body |
| ``GET /version`` | ``{"version": "0.31.0"}`` (:data:`ENGINE_VERSION`, the vLLM the engine routes follow) |
| ``GET /metrics`` | Prometheus text: ``vllm:num_requests_running``, ``vllm:request_success_total``, and ``cwtrain_local_served_identity`` (1 for the identity served) |

With ``stream: true`` the completions endpoints answer with server-sent events, each token's
chunk sent as soon as the token is sampled.

The routes under ``/v1`` and ``/admin`` want ``Authorization: Bearer <token>`` with the
replica token from ``CWTRAIN_LOCAL_REPLICA_TOKEN`` (the stack makes one and gives it to the
supervisor and the gateways; a replica started without it refuses to run): 401 otherwise,
before a byte of the body is read. The others need no token, as vLLM's ``--api-key`` guards
only ``/v1`` (``/health`` answers the replica's state as JSON where vLLM's body is empty).
Bodies are bounded (:data:`MAX_BODY_BYTES`, 413).

States: ``READY`` (serving), ``PENDING_UPDATE`` (hot-load accepted), ``UPDATING`` (reading and
verifying), ``ERROR`` (the last hot-load failed: ``error_reason`` says why, the previous
weights keep serving). A hot-load reads only the deltas after the served identity when it is
in the chain, else the chain's FULL root and every delta after it (at most 63); every
object's SHA-256 is checked against its ``cwtrain-sha256`` metadata as it is read, and every
Adler-32 before the swap (:mod:`cwtrain.local.engine.snapshots`). The swap replaces one reference between requests: a request in
flight finishes on the weights it started with. Every completion names the identity that
produced it in ``system_fingerprint`` and the ``x-cwtrain-snapshot-identity`` header.

Generation runs on one thread (:class:`Batcher`): concurrent requests for the same prompt
and settings on the same weights are merged into one batch, each keeping its own seed, so a
GRPO group split into seeded ``n = 1`` requests costs about as much as one ``n``-request
and gives the same tokens however the requests were batched or routed (streamed or not).

``--apply-delay S`` makes every hot-load last S seconds more: the replica stays UPDATING for
S seconds after verification and before the swap (the slow hot-load of ``cwtrain local up
--slow-hot-load S``, and tests that must catch a replica mid hot-load). A cancel (the
control plane sends one when a hot-load is canceled) ends that wait, or the reading between
two snapshots of the chain, and the replica keeps serving what it served.

**Faults** (:data:`FAULT_KINDS`; the supervisor adds ``"fault": {"kind", "reason"}`` to one
hot-load when a test armed one, see :mod:`cwtrain.local.harness.faults`). Each loads and
verifies the chain as usual, then misbehaves as a faulty engine would:

- ``fail``: the load ends in ``ERROR`` with ``reason`` (the previous weights keep serving);
- ``stay-behind``: the replica reports the hot-load done (``READY``,
  ``completed_hot_load_id``) but keeps serving the previous weights under the previous identity;
- ``serve-corrupt``: it serves the new identity with one tensor corrupted (the byte holding
  each ``lm_head.weight`` element's exponent bit and top mantissa bits inverted, as a
  corrupted stored FULL read without its checksums would give);
- ``serve-previous``: it serves the previous weights under the new identity.

Only the completions' content shows the last two: ``/health``, the identity header and
``system_fingerprint`` all name the new identity. SIGTERM or SIGINT stops the server, and so does the exit
of the process that started it.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import logging
import os
import queue
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cwtrain.errors import UsageError
from cwtrain.jsondoc import load_json
from cwtrain.local.engine.chat import chat_complete
from cwtrain.local.engine.completions import (
    SSE_CONTENT_TYPE,
    Answer,
    CompletionError,
    complete,
    error_body,
    models_body,
)
from cwtrain.local.engine.model import GeneratedSequence, TinyLM, TokenEvent
from cwtrain.local.engine.processes import FAULT_KINDS, TOKEN_VARIABLE
from cwtrain.local.engine.snapshots import (
    ChainLink,
    ServedWeights,
    SnapshotSource,
    apply_chain,
    served_from_weights_file,
    weights_file,
)
from cwtrain.local.engine.tokenization import detokenize, tokenize
from cwtrain.local.loopback import LoopbackHTTPServer
from cwtrain.serving import DEFAULT_MAX_BODY_BYTES, BackgroundServer, JSONHandler, RequestRefused

__all__ = [
    "ENGINE_ROUTES",
    "ENGINE_VERSION",
    "FAULT_KINDS",
    "GUARDED_PREFIXES",
    "IDENTITY_HEADER",
    "MAX_BODY_BYTES",
    "TOKEN_VARIABLE",
    "Batcher",
    "Replica",
    "ReplicaServer",
    "main",
]

IDENTITY_HEADER = "x-cwtrain-snapshot-identity"
#: What ``GET /version`` answers: the vLLM whose OpenAI-compatible server the engine routes follow.
ENGINE_VERSION = "0.31.0"
#: The longest request body a replica reads (as much as a gateway relays).
MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES
#: The POST routes a replica serves as an inference engine (the gateway relays exactly these).
ENGINE_ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
#: The tensor ``serve-corrupt`` corrupts.
CORRUPTED_TENSOR = "lm_head.weight"
log = logging.getLogger("cwtrain.local.engine.replica")


@dataclass
class _Job:
    lm: TinyLM
    prompt: list[int]
    n: int
    seed: int | None
    sampling: dict[str, Any]
    events: queue.SimpleQueue[tuple[int, TokenEvent] | None] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: list[GeneratedSequence] | None = None
    error: BaseException | None = None

    def key(self) -> tuple[Any, ...]:
        return (id(self.lm), tuple(self.prompt), tuple(sorted(self.sampling.items())))

    def finish(self) -> None:
        self.done.set()
        if self.events is not None:
            self.events.put(None)


class Batcher:
    """Runs generation on one thread, merging queued requests that share prompt and settings.

    Concurrent requests for the same prompt (the ``n = 1`` requests of a split GRPO group,
    or several groups of one prompt) become one batched forward pass per token; each keeps
    its own seed, so its tokens do not depend on what it was batched with. Requests that
    started on different weights are never merged. It is the replica's
    :class:`~cwtrain.local.engine.completions.Engine`: :meth:`generate` waits for the sequences,
    :meth:`stream` yields each token as it is sampled.
    """

    def __init__(self, max_rows: int = 256) -> None:
        self.max_rows = max_rows
        self._cv = threading.Condition()
        self._queue: list[_Job] = []
        self._thread = threading.Thread(target=self._run, name="replica-batcher", daemon=True)
        self._thread.start()

    def _submit(self, job: _Job) -> _Job:
        with self._cv:
            self._queue.append(job)
            self._cv.notify()
        return job

    def generate(
        self, lm: TinyLM, prompt: list[int], n: int, seed: int | None, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        """``n`` sequences for ``prompt``, generated in a batch with whatever matches them."""
        job = self._submit(_Job(lm, list(prompt), n, seed, dict(sampling)))
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def stream(
        self, lm: TinyLM, prompt: list[int], n: int, seed: int | None, sampling: dict[str, Any]
    ) -> Iterator[tuple[int, TokenEvent]]:
        """The same as :meth:`generate`, as ``(sequence index, event)`` per token while it runs."""
        events: queue.SimpleQueue[tuple[int, TokenEvent] | None] = queue.SimpleQueue()
        job = self._submit(_Job(lm, list(prompt), n, seed, dict(sampling), events))
        while (item := events.get()) is not None:
            yield item
        if job.error is not None:
            raise job.error

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                jobs, self._queue = self._queue, []
            batches: dict[tuple[Any, ...], list[_Job]] = {}
            for job in jobs:
                batches.setdefault(job.key(), []).append(job)
            for batch in batches.values():
                while batch:
                    part: list[_Job] = []
                    rows = 0
                    while batch and (not part or rows + batch[0].n <= self.max_rows):
                        rows += batch[0].n
                        part.append(batch.pop(0))
                    self._generate(part)

    @staticmethod
    def _generate(part: list[_Job]) -> None:
        first = part[0]
        streams = [job.events for job in part]

        def on_token(request: int, index: int, event: TokenEvent) -> None:
            events = streams[request]
            if events is not None:
                events.put((index, event))

        try:
            outs = first.lm.generate_many(
                first.prompt,
                [(j.n, j.seed) for j in part],
                on_token=on_token if any(e is not None for e in streams) else None,
                **first.sampling,
            )
            for job, out in zip(part, outs):
                job.result = out
        except BaseException as exc:
            for job in part:
                job.error = exc
        for job in part:
            job.finish()


class Replica:
    """The state of one replica: served weights, hot-load state, and the loader thread.

    Args:
        name: The replica's name (in ``/health`` and logs).
        model_name: The served model name (the OpenAI ``model``).
        source: Where hot-loads read snapshots (``None``: this replica cannot hot-load).
        apply_delay: Seconds every hot-load lasts more (UPDATING before the swap; a cancel ends the wait).
        model_root: The model's path, the ``root`` of its ``/v1/models`` card.
    """

    def __init__(
        self,
        name: str,
        model_name: str,
        source: SnapshotSource | None,
        *,
        apply_delay: float = 0.0,
        model_root: str | None = None,
    ) -> None:
        self.name = name
        self.model_name = model_name
        self.model_root = model_root or model_name
        self.source = source
        self.apply_delay = apply_delay
        self.created = int(time.time())
        self.served: ServedWeights | None = None
        self.state = "PENDING_UPDATE"
        self.error_reason: str | None = None
        self.hot_load_id: str | None = None
        self.completed_hot_load_id: str | None = None
        self.target: str | None = None
        self.step: str | None = None
        self._lock = threading.Lock()
        self._batcher = Batcher()
        self._loader: threading.Thread | None = None
        self._cancel = threading.Event()
        self._weights_file: tuple[str, bytes] | None = None
        self.requests_running = 0
        self.requests_succeeded = 0

    def set_served(self, served: ServedWeights) -> None:
        """Swap in new weights (requests already running keep their reference)."""
        with self._lock:
            self.served = served
            self.state = "READY"
            self.error_reason = None

    def health(self) -> dict[str, Any]:
        """The ``/health`` document."""
        with self._lock:
            served = self.served
            return {
                "name": self.name,
                "state": self.state,
                "identity": served.identity if served else None,
                "error_reason": self.error_reason,
                "hot_load_id": self.hot_load_id,
                "completed_hot_load_id": self.completed_hot_load_id,
                "target_identity": self.target,
                "loading": self.step,
                "model": self.model_name,
            }

    def start_hot_load(self, body: Any) -> tuple[int, dict[str, Any]]:
        """Accept a hot-load request and start loading in the background."""
        if not isinstance(body, dict):
            return 400, {"error": "body must be a JSON object"}
        hot_load_id, identity, raw_chain = body.get("hot_load_id"), body.get("identity"), body.get("chain")
        if not isinstance(hot_load_id, str) or not isinstance(identity, str) or not isinstance(raw_chain, list):
            return 400, {"error": "hot_load_id and identity (strings) and chain (list) are required"}
        try:
            chain = [ChainLink(str(link["identity"]), str(link["type"]).upper()) for link in raw_chain]
        except (KeyError, TypeError):
            return 400, {"error": "every chain entry needs identity and type"}
        if not chain or chain[-1].identity != identity:
            return 400, {"error": f"the chain must end at identity {identity!r}"}
        if any(link.type not in ("FULL", "INCREMENTAL") for link in chain):
            return 400, {"error": "chain entry type must be FULL or INCREMENTAL"}
        fault = body.get("fault")
        if fault is not None and (not isinstance(fault, dict) or fault.get("kind") not in FAULT_KINDS):
            return 400, {"error": f"fault must be an object whose kind is one of {', '.join(FAULT_KINDS)}"}
        with self._lock:
            busy = self._loader is not None and self._loader.is_alive()
            if busy and self.hot_load_id == hot_load_id:
                return 202, self._accepted_unlocked()
            if busy:
                return 409, {"error": f"hot-load {self.hot_load_id} is still running on replica {self.name}"}
            if self.served is None:
                return 409, {"error": f"replica {self.name} has no weights yet"}
            if self.source is None:
                return 409, {"error": f"replica {self.name} has no object store to hot-load from"}
            self.hot_load_id, self.target, self.error_reason, self.step = hot_load_id, identity, None, None
            self.state = "PENDING_UPDATE"
            self._cancel = cancel = threading.Event()
            self._loader = threading.Thread(
                target=self._run_hot_load, args=(hot_load_id, chain, cancel, fault), daemon=True
            )
            self._loader.start()
            return 202, self._accepted_unlocked()

    def cancel_hot_load(self, body: Any) -> tuple[int, dict[str, Any]]:
        """Stop the hot-load ``body["hot_load_id"]`` if it is still loading; the served weights stay."""
        hot_load_id = body.get("hot_load_id") if isinstance(body, dict) else None
        if not isinstance(hot_load_id, str):
            return 400, {"error": "hot_load_id (a string) is required"}
        with self._lock:
            running = self._loader is not None and self._loader.is_alive() and self.hot_load_id == hot_load_id
            if running:
                self._cancel.set()
            return 200, {"name": self.name, "hot_load_id": hot_load_id, "canceled": running}

    def _accepted_unlocked(self) -> dict[str, Any]:
        return {"name": self.name, "hot_load_id": self.hot_load_id, "identity": self.target, "state": self.state}

    def _run_hot_load(
        self, hot_load_id: str, chain: list[ChainLink], cancel: threading.Event, fault: dict[str, Any] | None = None
    ) -> None:
        started = time.monotonic()
        served, source = self.served, self.source
        assert served is not None and source is not None
        with self._lock:
            self.state = "UPDATING"

        def on_step(identity: str) -> None:
            if cancel.is_set():
                raise _Canceled
            with self._lock:
                self.step = identity

        try:
            new = apply_chain(source, served, chain, on_step=on_step)
            if self.apply_delay > 0:
                cancel.wait(self.apply_delay)
            if cancel.is_set():
                raise _Canceled
            if fault is not None:
                log.warning("replica %s: fault %s on hot-load %s", self.name, fault["kind"], hot_load_id)
                new = _faulty(fault, served, new, self.name)
        except _Canceled:
            log.info("replica %s: hot-load %s canceled; still serving %s", self.name, hot_load_id, served.identity)
            with self._lock:
                if self.hot_load_id == hot_load_id:
                    self.state, self.error_reason, self.step = "READY", None, None
            return
        except Exception as exc:  # any failure leaves the old weights serving
            reason = f"{type(exc).__name__}: {exc}"
            log.error("replica %s: hot-load %s failed: %s", self.name, hot_load_id, reason)
            with self._lock:
                if self.hot_load_id == hot_load_id:
                    self.state, self.error_reason, self.step = "ERROR", reason, None
            return
        with self._lock:
            self.served = new
            if self.hot_load_id == hot_load_id:
                self.state, self.error_reason, self.step = "READY", None, None
                self.completed_hot_load_id = hot_load_id
        log.info(
            "replica %s: serving %s (hot-load %s, %.0f ms)",
            self.name,
            new.identity,
            hot_load_id,
            (time.monotonic() - started) * 1000,
        )

    def weights_bytes(self) -> tuple[str, bytes] | None:
        """The served weights as one safetensors file (cached per identity)."""
        served = self.served
        if served is None:
            return None
        cached = self._weights_file
        if cached is None or cached[0] != served.identity:
            cached = (served.identity, weights_file(served))
            self._weights_file = cached
        return cached

    def answer(self, route: str, body: Any) -> tuple[str, Answer]:
        """Answer one request to an engine route on the weights served when it starts.

        Args:
            route: ``/v1/completions``, ``/v1/chat/completions``, ``/tokenize`` or ``/detokenize``.
            body: The decoded JSON body.

        Returns:
            The served identity and the answer (a JSON object, or a stream's events).

        Raises:
            CompletionError: The request is refused (503 before the first weights load).
        """
        served = self.served
        if served is None:
            raise CompletionError("no weights loaded yet", status=503)
        lm, identity, model = served.lm, served.identity, self.model_name
        if route == "/v1/completions":
            return identity, complete(body, lm, identity=identity, model=model, engine=self._batcher)
        if route == "/v1/chat/completions":
            return identity, chat_complete(body, lm, identity=identity, model=model, engine=self._batcher)
        if route == "/tokenize":
            return identity, tokenize(body, lm, model=model)
        return identity, detokenize(body, lm, model=model)

    @contextlib.contextmanager
    def counting(self) -> Iterator[Callable[[], None]]:
        """Count an engine request as running while inside; the function given counts it answered (``/metrics``)."""
        with self._lock:
            self.requests_running += 1

        def succeeded() -> None:
            with self._lock:
                self.requests_succeeded += 1

        try:
            yield succeeded
        finally:
            with self._lock:
                self.requests_running -= 1

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` document (vLLM's card for the served model)."""
        served = self.served
        max_len = served.lm.config.max_position_embeddings if served is not None else None
        return models_body(self.model_name, self.created, root=self.model_root, max_model_len=max_len)


class InjectedFault(Exception):
    """A hot-load failed because a test asked for it (fault ``fail``)."""


def _faulty(fault: dict[str, Any], previous: ServedWeights, loaded: ServedWeights, name: str) -> ServedWeights:
    """What a faulty replica serves after loading ``loaded`` over ``previous`` (see the module docs)."""
    kind = fault["kind"]
    if kind == "fail":
        reason = fault.get("reason") or f"replica {name} failed to load {loaded.identity}"
        raise InjectedFault(f"injected fault: {reason}")
    if kind == "stay-behind":
        return previous
    if kind == "serve-previous":
        return ServedWeights(loaded.identity, previous.config, previous.tensors, previous.lm)
    tensors = dict(loaded.tensors)
    item = tensors[CORRUPTED_TENSOR]
    raw = np.frombuffer(memoryview(item.data).cast("B"), dtype=np.uint8).copy()  # type: ignore[arg-type]
    width = raw.size // max(1, int(np.prod(item.shape)))
    raw.reshape(-1, width)[:, width - 2] ^= 0xFF  # each element's exponent bit and top mantissa bits
    tensors[CORRUPTED_TENSOR] = item._replace(data=raw)
    return ServedWeights.build(loaded.identity, loaded.config, tensors)


class _Canceled(Exception):
    """The hot-load being loaded was canceled."""


def _metrics_text(replica: Replica) -> str:
    """The ``/metrics`` page (Prometheus text format)."""
    model = replica.model_name.replace("\\", "\\\\").replace('"', '\\"')
    served = replica.served
    lines = [
        "# HELP vllm:num_requests_running Engine requests being answered now.",
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{model_name="{model}"}} {replica.requests_running}',
        "# HELP vllm:request_success_total Engine requests answered with 200.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{model_name="{model}"}} {replica.requests_succeeded}',
        "# HELP cwtrain_local_served_identity The snapshot identity the replica serves (1).",
        "# TYPE cwtrain_local_served_identity gauge",
    ]
    if served is not None:
        lines.append(f'cwtrain_local_served_identity{{model_name="{model}",identity="{served.identity}"}} 1')
    return "\n".join(lines) + "\n"


#: Path prefixes that need the replica token (vLLM's --api-key guards /v1; /admin is the local stack's own).
GUARDED_PREFIXES = ("/v1", "/admin")


class _Handler(JSONHandler):
    server: _Server
    max_body_bytes = MAX_BODY_BYTES

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def authenticate(self) -> None:
        if not self.path.split("?", 1)[0].startswith(GUARDED_PREFIXES):
            return
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.server.token.encode()):
            raise RequestRefused(401, "missing or invalid replica token (Authorization: Bearer <token>)", code="401")

    def refusal_body(self, error: RequestRefused) -> Any:
        return error_body(error.message, error.status)

    def _json_body(self) -> Any:
        raw = self.read_body()
        return load_json(raw) if raw else None

    def do_GET(self) -> None:
        replica = self.server.replica
        path = self.path.split("?", 1)[0]
        try:
            self.read_body()
        except RequestRefused as exc:
            self.refuse(exc)
            return
        if path == "/health":
            doc = replica.health()
            self.send_json(200 if doc["identity"] is not None else 503, doc)
        elif path == "/ping":
            self.send_body(200 if replica.served is not None else 503, b"", content_type="application/json")
        elif path == "/version":
            self.send_json(200, {"version": ENGINE_VERSION})
        elif path == "/metrics":
            text = _metrics_text(replica).encode()
            self.send_body(200, text, content_type="text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            self.send_json(200, replica.models())
        elif path == "/admin/weights":
            found = replica.weights_bytes()
            if found is None:
                self.send_json(503, {"error": "no weights loaded yet"})
            else:
                identity, data = found
                self.send_body(200, data, content_type="application/octet-stream", headers={IDENTITY_HEADER: identity})
        else:
            self.send_json(404, error_body(f"no route {path}", 404))

    def do_POST(self) -> None:
        replica = self.server.replica
        path = self.path.split("?", 1)[0]
        try:
            body = self._json_body()
        except RequestRefused as exc:
            self.refuse(exc)
            return
        except ValueError as exc:
            self.send_json(400, error_body(f"the request body is not JSON: {exc}", 400))
            return
        if path == "/admin/hotload":
            status, doc = replica.start_hot_load(body)
            self.send_json(status, doc)
        elif path == "/admin/hotload/cancel":
            status, doc = replica.cancel_hot_load(body)
            self.send_json(status, doc)
        elif path == "/ping":
            self.send_body(200 if replica.served is not None else 503, b"", content_type="application/json")
        elif path in ENGINE_ROUTES:
            with replica.counting() as succeeded:
                try:
                    identity, answer = replica.answer(path, body)
                except CompletionError as exc:
                    self.send_json(exc.status, error_body(exc.message, exc.status, exc.param))
                    return
                if isinstance(answer, dict):
                    self.send_json(200, answer, {IDENTITY_HEADER: identity})
                else:
                    self.send_stream(200, answer, content_type=SSE_CONTENT_TYPE, headers={IDENTITY_HEADER: identity})
                succeeded()
        else:
            self.send_json(404, error_body(f"no route {path}", 404))


class _Server(LoopbackHTTPServer):
    request_queue_size = 256  # a split GRPO batch opens dozens of connections at once

    def __init__(self, port: int, replica: Replica, token: str) -> None:
        if not token:
            raise UsageError(f"replica {replica.name} needs a token ({TOKEN_VARIABLE}); every route requires it")
        self.replica = replica
        self.token = token
        super().__init__(port, _Handler)


class ReplicaServer(BackgroundServer):
    """A replica's HTTP server in a background thread of this process (the module's CLI runs the same server).

    Args:
        replica: The replica it serves.
        port: The port (a free one when 0).
        token: The bearer token every request must carry (not empty).
    """

    def __init__(self, replica: Replica, port: int = 0, *, token: str) -> None:
        super().__init__(_Server(port, replica, token), f"replica-{replica.name}")


def _s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "US-EAST-04A",
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 3, "mode": "standard"},
        ),
    )


def _copy_from_peer(peer: str, token: str, timeout: float = 30.0) -> ServedWeights:
    request = urllib.request.Request(peer.rstrip("/") + "/admin/weights", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return served_from_weights_file(resp.read())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cwtrain.local.engine.replica", description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--s3-endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--path-prefix", default="")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--model-bucket", required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--peer", default=None, help="copy the served weights from this replica at start")
    parser.add_argument(
        "--apply-delay",
        type=float,
        default=0.0,
        help="make every hot-load last this many seconds more (UPDATING before the swap; a cancel ends it)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a replica until SIGTERM/SIGINT; returns the exit code."""
    parent = os.getppid()  # before anything slow, so that a parent dying during start-up is noticed
    args = _parser().parse_args(argv)
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        print(f"error: set {TOKEN_VARIABLE} to the token every request to this replica must carry", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s replica {args.name} %(levelname)s %(message)s")
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import torch

    torch.set_num_threads(1)
    source = SnapshotSource(_s3_client(args.s3_endpoint), args.bucket, args.path_prefix)
    root = f"s3://{args.model_bucket}/{args.model_path.strip('/')}"
    replica = Replica(args.name, args.model_name, source, apply_delay=args.apply_delay, model_root=root)
    server = _Server(args.port, replica, token)
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        served = None
        if args.peer:
            try:
                served = _copy_from_peer(args.peer, token)
                log.info("copied %s from peer %s", served.identity, args.peer)
            except Exception as exc:
                log.warning("cannot copy weights from peer %s (%s); loading the base checkpoint", args.peer, exc)
        if served is None:
            served = source.read_base(args.model_bucket, args.model_path)
            log.info("loaded base checkpoint s3://%s/%s", args.model_bucket, args.model_path.strip("/"))
        replica.set_served(served)
    except Exception as exc:
        log.error("cannot load weights: %s", exc)
        with replica._lock:
            replica.state, replica.error_reason = "ERROR", f"{type(exc).__name__}: {exc}"
    log.info("listening on http://127.0.0.1:%d", args.port)
    while not stop.is_set():
        stop.wait(0.5)
        if os.getppid() != parent:  # whoever started us is gone: never outlive it
            log.warning("parent process %d exited; stopping", parent)
            _stop(signal.SIGTERM, None)
    thread.join(timeout=5)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``model_server``: the OpenAI endpoint NeMo Gym's model server uses, served from the deployment.

NeMo Gym's own ``vllm_model`` model server (its training config,
``vllm_model_for_training.yaml``, unchanged) samples the deployment through this endpoint
(:class:`GymModelServer`), so Gym needs no change. With NeMo Gym environments NeMo-RL points
that model server at the generation backend's ``dp_openai_server_base_urls``; cwtrain-nemo-rl's
``coreweave`` backend (``CoreWeaveGeneration``) serves them by starting this endpoint in the
driver on first use. Each ``POST /v1/chat/completions`` becomes one token-id
``/v1/completions`` call on the deployment, sampled for the run and salted with the identity
now served; ``POST /tokenize`` and ``GET /v1/models`` answer as vLLM's do. What each request
goes through, how the endpoint is guarded (one advertised address, a bearer token checked
before the body is read, bounded bodies) and the standalone server
(``python -m cwtrain.integrations.gym.model_server``, token from ``CWTRAIN_GYM_MODEL_TOKEN``)
are in ``docs/nemo-rl.md`` ("NeMo Gym environments"), the one description of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cwtrain.errors import CWTrainError, RolloutError
from cwtrain.hotload import identity_version
from cwtrain.integrations.rollout import IDENTITY_HEADER, CompletionSampler, Prompt, SamplingParams
from cwtrain.jsondoc import load_json
from cwtrain.serving import (
    DEFAULT_MAX_BODY_BYTES,
    LOOPBACK,
    BackgroundServer,
    GuardedHTTPServer,
    JSONHandler,
    RequestRefused,
    bind_address,
    check_bearer,
    url_host,
)

__all__ = [
    "MAX_BODY_BYTES",
    "TOKEN_VARIABLE",
    "ChatRenderer",
    "ChatTokenizer",
    "GymModel",
    "GymModelError",
    "GymModelServer",
    "bind_address",
    "main",
]

log = logging.getLogger(__name__)

#: The longest request body read (a long multi-turn chat with its token ids fits many times).
MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES
#: The variable the standalone server takes its bearer token from (else it makes one up).
TOKEN_VARIABLE = "CWTRAIN_GYM_MODEL_TOKEN"

# Keys Gym puts on assistant messages that a chat template must not see.
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")


class ChatTokenizer(Protocol):
    """What of the trainer's (HuggingFace) tokenizer the renderer uses."""

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id (the end of an assistant turn)."""
        ...

    def apply_chat_template(self, conversation: Any, /, **kwargs: Any) -> Any:
        """The chat rendered as text (called with ``tokenize=False``)."""
        ...

    def encode(self, text: str, /, **kwargs: Any) -> list[int]:
        """Token ids of ``text`` (called with ``add_special_tokens=False``)."""
        ...

    def decode(self, ids: Sequence[int], /, **kwargs: Any) -> str:
        """The text of ``ids``."""
        ...


class GymModelError(CWTrainError):
    """A request the endpoint refuses, with the HTTP status it answers.

    Attributes:
        status: the HTTP status.
        kind: the OpenAI error type (``BadRequestError``, ``ServiceUnavailableError``, ...).
    """

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, str(self), self.kind))


def _text(content: Any) -> Any:
    """Message content as a chat template expects it: a list of text parts becomes one string."""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise GymModelError(400, f"only text content is supported, got a {part.get('type')!r} part")
        return "".join(parts)
    return content


def _clean(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in _TOKEN_KEYS}
    if "content" in out:
        out["content"] = _text(out["content"])
    return out


def _ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise GymModelError(400, f"{what} must be a list of token ids")
    return list(value)


class ChatRenderer:
    """Chats rendered to prompt ids with the trainer's tokenizer (see the module docs, steps 1-2).

    Args:
        tokenizer: the trainer's tokenizer (its chat template is the one training uses).
    """

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The ids of ``messages`` as the template renders them (no exact prefix)."""
        try:
            text = self.tokenizer.apply_chat_template(
                [_clean(m) for m in messages],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **dict(template_kwargs or {}),
            )
        except GymModelError:
            raise
        except Exception as exc:  # a template error is the request's problem, not the server's
            raise GymModelError(400, f"the chat template could not render the messages: {exc}") from exc
        if not isinstance(text, str):
            raise GymModelError(500, f"the chat template returned {type(text).__name__}, not text")
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        """The prompt of a chat request: rendered, with the exact ids of earlier turns kept."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, Mapping) for m in messages):
            raise GymModelError(400, "messages must be a non-empty list of message objects")
        tools = body.get("tools")
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, Mapping):
            raise GymModelError(400, "chat_template_kwargs must be an object")
        generation_prompt = body.get("add_generation_prompt", True) is not False
        full = self.render(
            messages, tools=tools, template_kwargs=template_kwargs, add_generation_prompt=generation_prompt
        )
        prefix = self._exact_prefix(body, messages)
        if not prefix:
            return full
        assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        last = assistants[-1] if assistants else len(messages) - 1
        history = self.render(
            messages[: last + 1], tools=tools, template_kwargs=template_kwargs, add_generation_prompt=False
        )
        return self.splice(prefix, history, full)

    def splice(self, prefix: Sequence[int], history: Sequence[int], full: Sequence[int]) -> list[int]:
        """``prefix`` (the exact ids up to the last turn) continued by what ``full`` adds after ``history``.

        ``history`` is the template's rendering up to the last assistant turn, ``full`` its
        rendering of the whole request. The cut is at the last EOS ``full`` has inside the
        history's span: the exact ids stand for everything before it.

        Raises:
            GymModelError: (400) ``full`` does not extend ``history``, or ends turns without EOS.
        """
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise GymModelError(400, "the tokenizer has no EOS token: the exact ids of earlier turns cannot be kept")
        if len(full) <= len(history):
            raise GymModelError(
                400,
                "the chat template renders the conversation no longer than its history "
                f"({len(full)} <= {len(history)} tokens): it re-renders earlier turns, so their exact ids cannot be "
                "kept as the prefix",
            )
        cut = next((i for i in range(len(history) - 1, -1, -1) if full[i] == eos), -1)
        if cut < 0:
            raise GymModelError(
                400,
                "the chat template ends the last assistant turn without the EOS token "
                f"({eos}); the exact ids of earlier turns cannot be spliced in",
            )
        keep = list(prefix[:-1]) if prefix and prefix[-1] == eos else list(prefix)
        return keep + list(full[cut:])

    @staticmethod
    def _exact_prefix(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[int]:
        explicit = body.get("required_prefix_token_ids")
        if explicit is not None:
            return _ids(explicit, "required_prefix_token_ids")
        for message in reversed(messages):
            if "prompt_token_ids" in message and "generation_token_ids" in message:
                return _ids(message["prompt_token_ids"], "prompt_token_ids") + _ids(
                    message["generation_token_ids"], "generation_token_ids"
                )
        return []


@dataclass
class _Counters:
    requests: int = 0
    refused: int = 0
    overflows: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: list[float] = field(default_factory=list)
    identities: dict[str, None] = field(default_factory=dict)


class GymModel:
    """The endpoint's logic without HTTP: chat requests to token-id completions.

    Args:
        sampler: samples from the deployment (its config names the model and key; give it no
            tokenizer, so a refused token-id prompt is an error instead of a text retry).
        renderer: renders chats with the trainer's tokenizer.
        max_model_len: the deployment's context length (``None``: no cap, no overflow check).
        salt: returns the prompt-cache salt, the identity now served; raises
            :class:`~cwtrain.errors.RolloutError` when there is none (the request gets a 503).
    """

    def __init__(
        self,
        sampler: CompletionSampler,
        renderer: ChatRenderer,
        *,
        max_model_len: int | None,
        salt: Callable[[], str],
    ) -> None:
        self.sampler = sampler
        self.renderer = renderer
        self.max_model_len = max_model_len
        self.salt = salt
        self._lock = threading.Lock()
        self._counters = _Counters()

    @property
    def model(self) -> str:
        """The deployment's model name."""
        return self.sampler.config.model

    # ------------------------------------------------------------------ requests

    def tokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """vLLM's ``/tokenize``: the prompt ids of a chat (``messages``) or of a text ``prompt``."""
        if "messages" in body:
            tokens = self.renderer.prompt_ids(body)
        elif isinstance(body.get("prompt"), str):
            add_special = body.get("add_special_tokens", True) is not False
            tokens = [int(i) for i in self.renderer.tokenizer.encode(body["prompt"], add_special_tokens=add_special)]
        else:
            raise GymModelError(400, "tokenize needs messages or a text prompt")
        out: dict[str, Any] = {"count": len(tokens), "tokens": tokens}
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        return out

    def chat(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """One chat completion; returns the response body and the identity that served it.

        Raises:
            GymModelError: the request is refused (400 bad request or overflow, 502 the
                deployment failed, 503 no served identity yet).
        """
        started = time.monotonic()
        try:
            prompt, params = self._request(body)
            try:
                salt = self.salt()
            except RolloutError as exc:
                raise GymModelError(503, str(exc), "ServiceUnavailableError") from None
            try:
                batch = self.sampler.sample_groups_sync([Prompt(ids=tuple(prompt))], 1, params, cache_salt=salt)
            except RolloutError as exc:
                status = getattr(exc, "status", None)
                if isinstance(status, int) and 400 <= status < 500:
                    raise GymModelError(
                        status, f"the deployment refused the request: {getattr(exc, 'body', exc)}"
                    ) from None
                raise GymModelError(502, f"the deployment failed: {exc}", "BadGatewayError") from None
        except GymModelError as exc:
            with self._lock:
                self._counters.requests += 1
                self._counters.refused += 1
                self._counters.overflows += exc.status == 400 and str(exc).startswith("context length:")
            raise
        completion = batch.groups[0][0]
        with self._lock:
            counters = self._counters
            counters.requests += 1
            counters.prompt_tokens += len(prompt)
            counters.completion_tokens += len(completion.response_ids)
            counters.seconds.append(time.monotonic() - started)
            if completion.identity:
                counters.identities.setdefault(completion.identity)
        return self._response(body, prompt, completion), completion.identity

    def _request(self, body: Mapping[str, Any]) -> tuple[list[int], SamplingParams]:
        if body.get("stream"):
            raise GymModelError(400, "stream is not supported by cwtrain's model_server endpoint")
        n = body.get("n")
        if n not in (None, 1):
            raise GymModelError(400, f"n must be 1, got {n!r}")
        top_k = body.get("top_k")
        if top_k not in (None, 0, -1):
            raise GymModelError(400, f"top_k must be unset or -1, got {top_k!r}")
        prompt = self.renderer.prompt_ids(body)
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
            raise GymModelError(400, f"max_tokens must be a positive integer, got {requested!r}")
        limit = self.max_model_len
        if limit is not None:
            room = limit - len(prompt)
            if room < 1:
                raise GymModelError(
                    400,
                    f"context length: This model's maximum context length is {limit} tokens. However, you requested "
                    f"{len(prompt) + (requested or 1)} tokens ({len(prompt)} in the messages, {requested or 1} in "
                    "the completion). Please reduce the length of the messages or completion.",
                )
            max_tokens = min(requested, room) if requested else room
        elif requested:
            max_tokens = requested
        else:
            raise GymModelError(400, "max_tokens is required when the endpoint has no max_model_len")
        stop = body.get("stop") or ()
        stops = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if temperature is None else float(temperature),
                top_p=1.0 if top_p is None else float(top_p),
                stop=stops,
            )
        except (RolloutError, TypeError, ValueError) as exc:
            raise GymModelError(400, str(exc)) from None
        return prompt, params

    def _response(self, body: Mapping[str, Any], prompt: list[int], completion: Any) -> dict[str, Any]:
        generated = [int(i) for i in completion.response_ids]
        logprobs = [float(x) for x in completion.logprobs] if completion.logprobs is not None else None
        message: dict[str, Any] = {
            "role": "assistant",
            "content": completion.text,
            "tool_calls": [],
            "prompt_token_ids": list(prompt),
            "generation_token_ids": generated,
        }
        if logprobs is not None:
            message["generation_log_probs"] = logprobs
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": completion.finish_reason if completion.finish_reason in ("stop", "length") else "stop",
            "stop_reason": completion.stop_reason,
            "logprobs": None,
        }
        if body.get("logprobs") and logprobs is not None:
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{tok}", "logprob": lp if math.isfinite(lp) else -9999.0,
                     "bytes": None, "top_logprobs": []}
                    for tok, lp in zip(generated, logprobs, strict=True)
                ]
            }  # fmt: skip
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": completion.identity,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generated),
                "total_tokens": len(prompt) + len(generated),
            },
        }

    # ------------------------------------------------------------------ metrics

    def metrics(self) -> dict[str, float]:
        """``coreweave/gym_*`` numbers since the last :meth:`clear_metrics` (empty without requests)."""
        with self._lock:
            c = self._counters
            if not c.requests:
                return {}
            seconds = sorted(c.seconds)
            out = {
                "coreweave/gym_requests": float(c.requests),
                "coreweave/gym_refused": float(c.refused),
                "coreweave/gym_context_overflows": float(c.overflows),
                "coreweave/gym_prompt_tokens": float(c.prompt_tokens),
                "coreweave/gym_completion_tokens": float(c.completion_tokens),
                "coreweave/gym_request_seconds_mean": sum(seconds) / len(seconds) if seconds else 0.0,
                "coreweave/gym_request_seconds_max": seconds[-1] if seconds else 0.0,
                "coreweave/identities_seen": float(len(c.identities)),
            }
            run = self.sampler.run_id  # only this run's identities are its versions
            numeric = [v for v in (identity_version(i, run) for i in c.identities) if v is not None] if run else []
            if numeric:
                out["coreweave/served_version"] = float(max(numeric))
            return out

    @property
    def identities(self) -> tuple[str, ...]:
        """The identities that served requests since the last :meth:`clear_metrics`, first seen first."""
        with self._lock:
            return tuple(self._counters.identities)

    def clear_metrics(self) -> None:
        """Start counting anew (NeMo-RL calls this before each step's rollouts)."""
        with self._lock:
            self._counters = _Counters()


class _Handler(JSONHandler):
    server: _Server
    max_body_bytes = MAX_BODY_BYTES

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("model_server: " + format, *args)

    def authenticate(self) -> None:
        """Every route wants the endpoint's bearer token, before a byte of a body is read."""
        check_bearer(self.headers, (self.server.token,))

    def refusal_body(self, error: RequestRefused) -> Any:
        kind = "AuthenticationError" if error.status == 401 else "BadRequestError"
        return _error_body(GymModelError(error.status, error.message, kind))

    def do_GET(self) -> None:
        try:
            self.read_body()
        except RequestRefused as exc:
            self.refuse(exc)
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        model = self.server.model
        if path in ("", "/health", "/v1/health"):
            self.send_json(200, {"status": "ok"})
        elif path == "/v1/models":
            card = {"id": model.model, "object": "model", "owned_by": "cwtrain"}
            self.send_json(200, {"object": "list", "data": [card]})
        else:
            self._error(GymModelError(404, f"no route GET {path}", "NotFoundError"))

    def do_POST(self) -> None:
        try:
            raw = self.read_body()
        except RequestRefused as exc:
            self.refuse(exc)
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            body = _json_object(raw)
            if path == "/v1/chat/completions":
                answer, identity = self.server.model.chat(body)
                self.send_json(200, answer, {IDENTITY_HEADER: identity} if identity else None)
            elif path in ("/tokenize", "/v1/tokenize"):
                self.send_json(200, self.server.model.tokenize(body))
            else:
                raise GymModelError(404, f"no route POST {path}", "NotFoundError")
        except GymModelError as exc:
            self._error(exc)
        except Exception as exc:  # never let a handler thread die without an answer
            log.exception("model_server: %s failed", path)
            self._error(GymModelError(500, f"{type(exc).__name__}: {exc}", "InternalServerError"))

    def _error(self, exc: GymModelError) -> None:
        self.send_json(exc.status, _error_body(exc))


def _error_body(exc: GymModelError) -> dict[str, Any]:
    return {"object": "error", "message": str(exc), "type": exc.kind, "param": None, "code": exc.status}


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = load_json(raw or b"{}")
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise GymModelError(400, f"the request body is not JSON: {reason}") from None
    if not isinstance(body, dict):
        raise GymModelError(400, "the request body must be a JSON object")
    return body


class _Server(GuardedHTTPServer):
    def __init__(self, host: str, port: int, model: GymModel, token: str) -> None:
        self.model = model
        self.token = token
        super().__init__(host, port, _Handler)


def node_address() -> str:
    """This node's address as other nodes reach it: Ray's node IP when Ray runs here, else loopback."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        try:
            return str(ray.util.get_node_ip_address())
        except Exception:  # an unusual Ray: fall back to the hostname's address
            return socket.gethostbyname(socket.gethostname())
    return LOOPBACK


class GymModelServer(BackgroundServer):
    """:class:`GymModel` over HTTP, in a background thread, behind a bearer token.

    It listens on the address it advertises (:func:`~cwtrain.serving.bind_address`): loopback
    when Gym runs on this node's loopback, else the one interface Gym's node reaches, never
    every interface unless ``host`` says so. Every request needs ``Authorization: Bearer
    <token>`` (checked before a byte of the body is read; bodies over :data:`MAX_BODY_BYTES`
    are refused with 413): the token is random unless given, and reaches Gym as its model server's
    ``api_key`` (NeMo-RL's coreweave backend sets it in Gym's config; standalone, ``policy_api_key``).
    ``start``/``close``/``serve_forever`` and ``with`` are core's :class:`~cwtrain.serving.BackgroundServer`.

    Args:
        model: the endpoint's logic.
        host: the address to listen on (default: :func:`~cwtrain.serving.bind_address` of ``advertise``).
        port: the port (0: any free one).
        advertise: the host the base URL names (default :func:`node_address`).
        token: the bearer token callers must send (default: a random one).
    """

    def __init__(
        self,
        model: GymModel,
        *,
        host: str | None = None,
        port: int = 0,
        advertise: str | None = None,
        token: str | None = None,
    ) -> None:
        self.model = model
        self.advertise = advertise or node_address()
        self.token = token or secrets.token_urlsafe(32)
        super().__init__(_Server(host or bind_address(self.advertise), port, model, self.token), "cwtrain-gym-model")
        log.info("model_server at %s (listening on %s) for model %s", self.base_url, self.host, model.model)

    @property
    def base_url(self) -> str:
        """``http://<advertised host>:<port>/v1``: what Gym's ``policy_base_url`` should be."""
        return f"http://{url_host(self.advertise)}:{self.port}/v1"

    def close(self) -> None:
        """Stop serving and release the port."""
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cwtrain.integrations.gym.model_server``: serve the endpoint until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m cwtrain.integrations.gym.model_server",
        description=__doc__.split("\n")[0],
        epilog=f"Every request needs 'Authorization: Bearer <token>': the token is {TOKEN_VARIABLE} when set, else a "
        "random one printed as api_key in the JSON line written at start (give it to Gym as policy_api_key).",
    )
    parser.add_argument("--tokenizer", required=True, help="the trainer's tokenizer (HF name or directory)")
    parser.add_argument("--chat-template", help="a chat template (Jinja text or a file) instead of the tokenizer's")
    parser.add_argument("--max-model-len", type=int, help="the deployment's context length")
    parser.add_argument("--state-dir", help="where the publisher writes served_identity (CWTRAIN_HOTLOAD_STATE_DIR)")
    parser.add_argument(
        "--run-id",
        help="the run whose versions count as served versions (CWTRAIN_HOTLOAD_RUN_ID; else the state dir's)",
    )
    parser.add_argument(
        "--host",
        help="address to listen on (default: the address --advertise names or resolves to; never every interface "
        "unless given 0.0.0.0)",
    )
    parser.add_argument("--port", type=int, default=8001, help="port (8001)")
    parser.add_argument("--advertise", help="host to print in the base URL (default: this host's name)")
    args = parser.parse_args(argv)

    from pathlib import Path

    from transformers import AutoTokenizer  # type: ignore[import-not-found,unused-ignore]

    from cwtrain.config import env_str
    from cwtrain.integrations.nvext import recorded_run_id, require_served_salt
    from cwtrain.integrations.rollout import RolloutConfig

    try:
        config = RolloutConfig.from_env()
    except CWTrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.chat_template:
        template = Path(args.chat_template)
        tokenizer.chat_template = template.read_text(encoding="utf-8") if template.is_file() else args.chat_template
    state_dir = args.state_dir or env_str("CWTRAIN_HOTLOAD_STATE_DIR")
    # else the run of the identity the publisher recorded
    run_id = args.run_id or env_str("CWTRAIN_HOTLOAD_RUN_ID") or recorded_run_id(state_dir)
    model = GymModel(
        CompletionSampler(config, run_id=run_id),
        ChatRenderer(tokenizer),
        max_model_len=args.max_model_len,
        salt=lambda: require_served_salt(state_dir),
    )
    token = env_str(TOKEN_VARIABLE)
    server = GymModelServer(
        model, host=args.host, port=args.port, advertise=args.advertise or socket.gethostname(), token=token
    )
    shown = {"base_url": server.base_url, "model": model.model, "listening_on": server.host}
    if token is None:  # made up here: Gym's policy_api_key must be it
        shown["api_key"] = server.token
    print(json.dumps(shown), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        model.sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wire vocabulary of the local control plane: errors, enums, times and request validation.

This module knows the v1alpha1 inference API's JSON (``shared/spec/service-api.md``) and
nothing about HTTP or processes. :class:`ServiceError` is what every rule violation
raises; the HTTP layer turns it into the service's error body
``{"code": <Connect code>, "message": ..., "details": []}`` with the usual status.

Validation helpers take the decoded request body and return normalised copies, raising
:class:`ServiceError` with ``invalid_argument`` and a message naming the field.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from cwtrain.hotload import RESERVED_IDENTITIES

__all__ = [
    "API_MAX_CHAIN_DELTAS",
    "CONNECT_HTTP_STATUS",
    "GPU_COUNTS",
    "HOT_LOAD_ENGINE",
    "NAME_RE",
    "RESERVED_IDS",
    "TERMINAL_HOT_LOAD_STATES",
    "ServiceError",
    "ENGINE_CONFIG_KEYS",
    "ENGINE_ENV_NAMES",
    "INSTANCE_TYPES",
    "check_identity",
    "check_resource_id",
    "deployment_parameters",
    "enum_value",
    "new_id",
    "now",
    "rfc3339",
    "parse_rfc3339",
    "validate_deployment_request",
    "validate_gateway_request",
    "validate_hot_load_request",
]

#: HTTP status the service answers for each Connect code (spec section 6).
CONNECT_HTTP_STATUS: Mapping[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
GPU_COUNTS = frozenset({1, 2, 4, 8, 16})
HOT_LOAD_ENGINE = "dynamo-vllm"
#: The API accepts at most this many deltas after the chain's last FULL snapshot when it
#: resolves a hot-load's chain (the service's limit; a replica starting cold replays at most
#: :data:`cwtrain.hotload.MAX_CHAIN_DELTAS`, which is lower).
API_MAX_CHAIN_DELTAS = 128
#: ``runtimeConfigOptions``: the ``runtime.engineConfig`` keys each engine takes. Local
#: values (the replicas ignore engineConfig); the service answers its own lists.
ENGINE_CONFIG_KEYS: Mapping[str, tuple[str, ...]] = {
    HOT_LOAD_ENGINE: ("gpu-memory-utilization", "max-model-len", "tensor-parallel-size"),
    "vllm": ("gpu-memory-utilization", "max-model-len", "tensor-parallel-size"),
    "sglang": ("context-length", "mem-fraction-static", "tp-size"),
}
#: ``engineEnvOptions``: the ``runtime.engineEnv`` names each engine takes (any engine: these).
ENGINE_ENV_NAMES: tuple[str, ...] = ("HF_HUB_OFFLINE", "VLLM_LOGGING_LEVEL")
#: ``resourceParameters.instanceTypes`` (the local replicas run on the CPU whatever is chosen).
INSTANCE_TYPES: tuple[str, ...] = ("CPU_LOCAL", "H100_80GB_SXM5")
TERMINAL_HOT_LOAD_STATES = frozenset({"HOT_LOAD_STATE_COMPLETED", "HOT_LOAD_STATE_FAILED", "HOT_LOAD_STATE_CANCELED"})

_ENUMS: Mapping[str, tuple[str, ...]] = {
    "SNAPSHOT_TYPE_": ("UNSPECIFIED", "FULL", "INCREMENTAL"),
    "COMPRESSION_FORMAT_": ("UNSPECIFIED", "ZSTD"),
    "CHECKSUM_FORMAT_": ("UNSPECIFIED", "ADLER32"),
    "PROMPT_CACHE_POLICY_": ("UNSPECIFIED", "RESET_ALL", "PRESERVE"),
    "TRANSITION_MODE_": ("UNSPECIFIED", "ASYNC"),
}


class ServiceError(Exception):
    """A request the service refuses: a Connect code and a message for the error body.

    Attributes:
        code: the Connect code string (``"invalid_argument"``, ...).
        message: the human-readable message.
        http_status: the HTTP status sent with it (the usual one for ``code`` unless given).
    """

    def __init__(self, code: str, message: str, *, http_status: int | None = None) -> None:
        self.code = code
        self.message = message
        self.http_status = http_status or CONNECT_HTTP_STATUS.get(code, 500)
        super().__init__(f"{code}: {message}")

    def body(self) -> dict[str, Any]:
        """The service's error body."""
        return {"code": self.code, "message": self.message, "details": []}


def _invalid(message: str) -> ServiceError:
    return ServiceError("invalid_argument", message)


def now() -> datetime:
    """The current UTC time."""
    return datetime.now(UTC)


def rfc3339(when: datetime | None) -> str | None:
    """``2026-01-02T03:04:05.123456Z``, or ``None``."""
    if when is None:
        return None
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str, field: str) -> datetime:
    """Parse an RFC 3339 time (no offset = UTC); ``invalid_argument`` naming ``field`` otherwise."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _invalid(f"{field}: {text!r} is not an RFC 3339 time") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def new_id() -> str:
    """A server-chosen id (lowercase UUID4)."""
    return str(uuid.uuid4())


def enum_value(prefix: str, value: Any, field: str, *, default: str | None = None) -> str:
    """Normalise an enum from a request to its prefixed name.

    Accepts the prefixed name, the bare name (any case) or the integer value. Absent
    values give ``default`` (itself prefixed), else ``<prefix>UNSPECIFIED``.
    """
    names = _ENUMS[prefix]
    if value is None or value == "":
        return default or prefix + "UNSPECIFIED"
    if isinstance(value, bool):
        raise _invalid(f"{field}: {value!r} is not a {prefix}* value")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        number = int(value)
        if 0 <= number < len(names):
            return prefix + names[number]
        raise _invalid(f"{field}: {value!r} is not a {prefix}* value")
    if isinstance(value, str):
        bare = value.strip().upper().removeprefix(prefix)
        if bare in names:
            return prefix + bare
    raise _invalid(f"{field}: {value!r} is not one of {', '.join(prefix + n for n in names[1:])}")


def deployment_parameters(gateway_ids: Sequence[str], engines: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The body of ``GET /deployments/parameters``, in the public API reference's shape.

    ::

        {"gatewayIds": [...],
         "runtimeParameters": {"runtimeVersions": {"<engine>": {"versions": [...]}},
                               "runtimeConfigOptions": {"<engine>": {"allowedKeys": [...]}},
                               "engineEnvOptions": {"<engine>": {"allowedNames": [...]}}},
         "resourceParameters": {"instanceTypes": [...]}}

    ``engineEnvOptions`` is not in the reference's example but is a field of the public
    SDK's response; clients treat a missing map as empty.

    Args:
        gateway_ids: the gateways a new deployment may reference (the caller's
            ``gatewayIds`` query, or every usable gateway of the organisation).
        engines: allowed ``runtime.engine`` names, each with its versions.
    """
    names = sorted(engines)
    return {
        "gatewayIds": list(gateway_ids),
        "runtimeParameters": {
            "runtimeVersions": {name: {"versions": list(engines[name])} for name in names},
            "runtimeConfigOptions": {name: {"allowedKeys": list(ENGINE_CONFIG_KEYS.get(name, ()))} for name in names},
            "engineEnvOptions": {name: {"allowedNames": list(ENGINE_ENV_NAMES)} for name in names},
        },
        "resourceParameters": {"instanceTypes": list(INSTANCE_TYPES)},
    }


def check_identity(identity: Any, field: str = "identity") -> str:
    """A snapshot identity: 1-128 characters, one path segment, not reserved
    (:data:`cwtrain.hotload.RESERVED_IDENTITIES`)."""
    if not isinstance(identity, str) or not identity:
        raise _invalid(f"{field} is required (one path segment under the deployment's hot-load prefix)")
    if len(identity) > 128:
        raise _invalid(f"{field}: {identity[:40]!r}... is longer than 128 characters")
    if "/" in identity or identity in (".", ".."):
        raise _invalid(f"{field}: {identity!r} must be one path segment (no '/', not '.' or '..')")
    if identity in RESERVED_IDENTITIES:
        raise _invalid(f"{field}: {identity!r} is reserved; choose another identity")
    return identity


#: Ids that name a route of their own (``GET /deployments/parameters``), so no resource may take them.
RESERVED_IDS = frozenset({"parameters"})


def check_resource_id(value: str, what: str) -> str:
    """A resource id from a request path: 1-128 characters of ``[A-Za-z0-9._-]``, as ids are created.

    Ids with ``?``, ``/``, ``%``, spaces or control characters (an unescaped or doubly
    escaped path) are refused with ``invalid_argument`` rather than looked up.
    """
    if not _ID_RE.fullmatch(value):
        raise _invalid(f"{what} {value[:80]!r} is not a valid id (1-128 characters of [A-Za-z0-9._-])")
    return value


def _client_id(body: Mapping[str, Any], key: str = "id") -> str:
    value = body.get(key)
    if value is None or value == "":
        return new_id()
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise _invalid(f"{key}: {value!r} is not a valid id (1-128 characters of [A-Za-z0-9._-])")
    if value in RESERVED_IDS:
        raise _invalid(f"{key}: {value!r} is reserved (it names a route of the API); choose another id")
    return value


def _obj(body: Mapping[str, Any], key: str, *, required: bool = True) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        if required:
            raise _invalid(f"{key} is required")
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"{key} must be an object")
    return dict(value)


def _text(body: Mapping[str, Any], key: str, field: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _invalid(f"{field} is required (a non-empty string)")
    return value


def _int(body: Mapping[str, Any], key: str, field: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # proto3 JSON sends 64-bit integers as strings
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(f"{field} must be an integer")
    return value


def _name(body: Mapping[str, Any]) -> str:
    name = _text(body, "name", "name")
    if not NAME_RE.match(name):
        raise _invalid(f"name: {name!r} must match {NAME_RE.pattern} (letters, digits, '-', at most 63)")
    return name


def validate_gateway_request(body: Mapping[str, Any], zones: frozenset[str]) -> dict[str, Any]:
    """Check a CreateGatewayRequest and return the gateway ``spec`` (without organisation)."""
    gateway_id = _client_id(body)
    name = _name(body)
    requested = body.get("zones")
    if not isinstance(requested, list) or len(requested) != 1 or not isinstance(requested[0], str):
        raise _invalid("zones must list exactly one zone (gateways are single-zone)")
    if requested[0] not in zones:
        raise _invalid(f"zones: {requested[0]!r} is not a valid zone; valid zones: {', '.join(sorted(zones))}")
    spec: dict[str, Any] = {"id": gateway_id, "name": name, "zones": [requested[0]]}
    auths = [key for key in ("coreWeaveAuth", "weightsAndBiasesAuth") if body.get(key) is not None]
    if len(auths) != 1:
        raise _invalid("exactly one of coreWeaveAuth, weightsAndBiasesAuth is required")
    spec[auths[0]] = _obj(body, auths[0])
    routings = [
        key for key in ("bodyBasedRouting", "headerBasedRouting", "pathBasedRouting") if body.get(key) is not None
    ]
    if len(routings) != 1:
        raise _invalid("exactly one of bodyBasedRouting, headerBasedRouting, pathBasedRouting is required")
    routing = _obj(body, routings[0])
    if routings[0] == "bodyBasedRouting":
        api_type = routing.get("apiType", "API_TYPE_OPENAI")
        if str(api_type).upper() not in ("API_TYPE_OPENAI", "OPENAI", "1"):
            raise _invalid(f"bodyBasedRouting.apiType: {api_type!r} is not supported; use API_TYPE_OPENAI")
        routing["apiType"] = "API_TYPE_OPENAI"
    if routings[0] == "headerBasedRouting":
        _text(routing, "headerName", "headerBasedRouting.headerName")
    spec[routings[0]] = routing
    return spec


def validate_deployment_request(body: Mapping[str, Any], engines: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """Check a CreateDeploymentRequest's fields (not cross-resource rules) and return its spec.

    Args:
        body: the decoded request.
        engines: allowed ``runtime.engine`` names, each with its allowed versions.
    """
    deployment_id = _client_id(body)
    for key in ("name", "gatewayIds", "runtime", "resources", "model", "autoscaling", "traffic"):
        if body.get(key) is None:
            raise _invalid(f"{key} is required")
    name = _name(body)
    gateway_ids = body["gatewayIds"]
    if not isinstance(gateway_ids, list) or not gateway_ids or not all(isinstance(g, str) and g for g in gateway_ids):
        raise _invalid("gatewayIds must list at least one gateway id")
    runtime = _obj(body, "runtime")
    engine = _text(runtime, "engine", "runtime.engine")
    if engine not in engines:
        raise _invalid(f"runtime.engine: {engine!r} is not supported; allowed: {', '.join(sorted(engines))}")
    version = _text(runtime, "version", "runtime.version")
    if not _SEMVER_RE.match(version):
        raise _invalid(f"runtime.version: {version!r} is not a semantic version (e.g. 1.2.3)")
    for key in ("engineConfig", "engineEnv"):
        value = runtime.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _invalid(f"runtime.{key} must be an object of strings")
    resources = _obj(body, "resources")
    _text(resources, "instanceType", "resources.instanceType")
    gpus = _int(resources, "gpuCount", "resources.gpuCount")
    if gpus not in GPU_COUNTS:
        raise _invalid(f"resources.gpuCount: {gpus} must be one of 1, 2, 4, 8, 16")
    resources["gpuCount"] = gpus
    model = _obj(body, "model")
    model_name = _text(model, "name", "model.name")
    if not 4 <= len(model_name) <= 63:
        raise _invalid(f"model.name: {model_name!r} must be 4-63 characters")
    _text(model, "bucket", "model.bucket")
    _text(model, "path", "model.path")
    autoscaling = _obj(body, "autoscaling")
    low = _int(autoscaling, "min", "autoscaling.min", 0)
    high = _int(autoscaling, "max", "autoscaling.max", max(low, 1))
    if low < 0 or high < max(low, 1):
        raise _invalid(f"autoscaling: need 0 <= min <= max and max >= 1 (got min={low}, max={high})")
    autoscaling.update(min=low, max=high)
    traffic = _obj(body, "traffic")
    weight = _int(traffic, "weight", "traffic.weight", 100)
    if not 0 <= weight <= 100:
        raise _invalid(f"traffic.weight: {weight} must be between 0 and 100")
    traffic["weight"] = weight
    spec: dict[str, Any] = {
        "id": deployment_id,
        "name": name,
        "gatewayIds": list(dict.fromkeys(gateway_ids)),
        "runtime": runtime,
        "resources": resources,
        "model": model,
        "autoscaling": autoscaling,
        "traffic": traffic,
    }
    hot_load = body.get("hotLoad")
    if hot_load:
        spec["hotLoad"] = validate_hot_load_section(hot_load, engine)
    return spec


def validate_hot_load_section(hot_load: Any, engine: str) -> dict[str, Any]:
    """Check a deployment's ``hotLoad`` section (engine, bucket, prefix, transition mode)."""
    if not isinstance(hot_load, dict):
        raise _invalid("hotLoad must be an object")
    if engine != HOT_LOAD_ENGINE:
        raise _invalid(f"hotLoad needs runtime.engine {HOT_LOAD_ENGINE!r} (got {engine!r})")
    section = dict(hot_load)
    _text(section, "bucket", "hotLoad.bucket")
    prefix = section.get("pathPrefix", "")
    if not isinstance(prefix, str):
        raise _invalid("hotLoad.pathPrefix must be a string")
    if ".." in prefix.split("/"):
        raise _invalid(f"hotLoad.pathPrefix: {prefix!r} must not contain '..' segments")
    section["pathPrefix"] = prefix
    mode = enum_value("TRANSITION_MODE_", section.get("transitionMode"), "hotLoad.transitionMode")
    if mode != "TRANSITION_MODE_ASYNC":
        raise _invalid("hotLoad.transitionMode must be TRANSITION_MODE_ASYNC (the only supported mode)")
    section["transitionMode"] = mode
    return section


def validate_hot_load_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """Check a CreateHotLoadRequest's own fields and return the hot-load ``spec`` (unresolved)."""
    deployment_id = _text(body, "deploymentId", "deploymentId")
    hot_load_id = _client_id(body, "hotLoadId")
    identity = check_identity(body.get("identity"))
    snapshot_type = enum_value("SNAPSHOT_TYPE_", body.get("type"), "type")
    if snapshot_type == "SNAPSHOT_TYPE_UNSPECIFIED":
        raise _invalid("type is required: SNAPSHOT_TYPE_FULL or SNAPSHOT_TYPE_INCREMENTAL")
    policy = enum_value(
        "PROMPT_CACHE_POLICY_",
        body.get("promptCachePolicy"),
        "promptCachePolicy",
        default="PROMPT_CACHE_POLICY_PRESERVE",
    )
    if policy == "PROMPT_CACHE_POLICY_UNSPECIFIED":
        policy = "PROMPT_CACHE_POLICY_PRESERVE"
    meta = body.get("incrementalSnapshotMetadata")
    incremental: dict[str, Any] | None = None
    if snapshot_type == "SNAPSHOT_TYPE_FULL":
        if meta:
            raise _invalid("incrementalSnapshotMetadata is not allowed for SNAPSHOT_TYPE_FULL")
    else:
        if not isinstance(meta, dict) or not meta:
            raise _invalid("incrementalSnapshotMetadata is required for SNAPSHOT_TYPE_INCREMENTAL")
        previous = check_identity(
            meta.get("previousSnapshotIdentity"), "incrementalSnapshotMetadata.previousSnapshotIdentity"
        )
        if previous == identity:
            raise _invalid("incrementalSnapshotMetadata.previousSnapshotIdentity must differ from identity")
        compression = enum_value(
            "COMPRESSION_FORMAT_", meta.get("compressionFormat"), "incrementalSnapshotMetadata.compressionFormat"
        )
        if compression != "COMPRESSION_FORMAT_ZSTD":
            raise _invalid("incrementalSnapshotMetadata.compressionFormat must be COMPRESSION_FORMAT_ZSTD")
        checksum = enum_value(
            "CHECKSUM_FORMAT_", meta.get("checksumFormat"), "incrementalSnapshotMetadata.checksumFormat"
        )
        if checksum != "CHECKSUM_FORMAT_ADLER32":
            raise _invalid("incrementalSnapshotMetadata.checksumFormat must be CHECKSUM_FORMAT_ADLER32")
        incremental = {
            "previousSnapshotIdentity": previous,
            "compressionFormat": compression,
            "checksumFormat": checksum,
        }
    return {
        "id": hot_load_id,
        "deploymentId": deployment_id,
        "identity": identity,
        "type": snapshot_type,
        "promptCachePolicy": policy,
        "incrementalSnapshotMetadata": incremental,
    }

"""boto3 for CoreWeave AI Object Storage: the client factory and the :class:`ObjectStore` over it.

:func:`s3_client` builds a boto3 S3 client configured the way the hot-load protocol
needs it (spec ``service-api.md`` section 11)::

    from cwtrain.infra import s3_client

    s3 = s3_client()                                # endpoint and region from the environment
    s3 = s3_client("http://cwlota.com")             # LOTA cache inside CoreWeave Kubernetes
    s3 = s3_client("http://127.0.0.1:9000", region_name="US-EAST-04A")

**Endpoint**, first found: the ``endpoint_url`` argument; ``CW_S3_ENDPOINT``; the AWS
configuration (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, then the profile's
``services`` section or ``endpoint_url``, unless ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``
is true); :data:`DEFAULT_S3_ENDPOINT` (``https://cwobject.com``).

**Addressing**: virtual-hosted (``https://<bucket>.cwobject.com/<key>``, the only style
CoreWeave serves) for named hosts; path style for loopback, IP-literal and single-label
hosts (``localhost``, ``minio``), where ``<bucket>.<host>`` would not resolve.

**Region** (the bucket's availability zone, e.g. ``US-EAST-04A``): the ``region_name``
argument; ``AWS_REGION``; ``AWS_DEFAULT_REGION`` or the profile's ``region``. There is no
default: without one the factory raises :class:`~cwtrain.errors.ConfigError` naming
``AWS_REGION``.

**Client settings**: SigV4; adaptive retries, 5 attempts; a connection pool of
``max(10, CW_S3_MAX_POOL or 128)`` (an invalid value warns and uses 128); request and
response checksums only when an operation requires them
(``request_checksum_calculation="when_required"``, which S3-compatible stores accept);
payload signing off (``UNSIGNED-PAYLOAD``): hashing every body for the signature would
cost a second SHA-256 pass over every published byte, while TLS, cwtrain's own
``cwtrain-sha256`` metadata and the engine's per-tensor Adler-32 already cover the
bytes. Pass ``config=botocore.config.Config(s3={"payload_signing_enabled": True})`` to
sign payloads anyway; a ``config`` you pass is merged over these settings.

**The object store.** :func:`object_store` takes the same arguments and returns a
:class:`Boto3ObjectStore`: the :class:`~cwtrain.infra.objectstore.ObjectStore` that
every cwtrain upload, manifest and permission check uses. Every botocore detail stays in
this module and its send path: it turns SDK exceptions into cwtrain's object-store errors (see
:mod:`cwtrain.infra.objectstore`), follows listing pages, and sends request bodies
without copies. :func:`as_object_store` wraps a raw boto3 client the same way, so
``upload_snapshot(..., s3=s3_client())`` and ``HotLoader(api, dep, s3=client)`` work::

    from cwtrain.infra.s3 import object_store

    store = object_store()                           # same resolution as s3_client()
    store.head("my-weights", "hotload/run1-v000007/model.safetensors.index.json")

**Sending bodies without copies** (:mod:`cwtrain.infra.s3_send`): a store's
:class:`~cwtrain.infra.objectstore.Payload` bodies go out as the caller's memory views
(the very buffers whose SHA-256 was computed). ``put(..., sha256=...)`` sends that digest
as ``ChecksumSHA256`` (``x-amz-checksum-sha256`` with ``x-amz-sdk-checksum-algorithm:
SHA256``): the store verifies the body against it (``BadDigest`` otherwise), and botocore
computes nothing of its own. ``head(..., checksum=True)`` asks for the stored checksum
(``ChecksumMode=ENABLED``).

**TLS** verification is on. ``verify=False`` turns it off (with a warning; for
development stores with self-signed certificates only); ``verify="/path/ca.pem"`` names
a CA bundle. Credentials come from the standard boto3 chain (static keys, container
credentials, web identity, profiles); cwtrain never reads or logs key material, and it
masks the signing material (``Authorization``, ``Credential=``, session tokens) in
botocore's DEBUG request logs.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from cwtrain.config import env_str, parse_bool
from cwtrain.errors import ConfigError
from cwtrain.infra.objectstore import (
    Body,
    Deadline,
    ListedObject,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreDeadlineError,
    ObjectStoreError,
    ObjectStoreTransportError,
    ObjectStream,
    OpenUpload,
    StoredObject,
    UploadedPart,
    deadline_passed,
    status_error,
)
from cwtrain.infra.s3_endpoint import (
    ENDPOINT_VARIABLE,
    EndpointOrigin,
    refusal_message,
    remember,
    unreachable_message,
)
from cwtrain.infra.s3_send import S3Client, call_deadline, install_deadlines, install_zero_copy, request_body

__all__ = [
    "DEFAULT_S3_ENDPOINT",
    "Boto3ObjectStore",
    "ObjectStoreLike",
    "S3Client",
    "addressing_style",
    "as_object_store",
    "object_store",
    "resolve_endpoint",
    "resolve_region",
    "s3_client",
]

log = logging.getLogger(__name__)

#: CoreWeave AI Object Storage's public endpoint.
DEFAULT_S3_ENDPOINT = "https://cwobject.com"

_DEFAULT_POOL = 128
_MIN_POOL = 10
_MAX_ATTEMPTS = 5


_loader_lock = threading.Lock()
_loader: Any = None

# botocore's DEBUG logs of each request carry its signing material: the Authorization header
# (``Credential=<access key id>/...``) and a session token (the request repr, the canonical request).
_SIGNING = (
    (re.compile(r"(['\"]?Authorization['\"]?\s*:\s*b?['\"]?)[^'\"\n]+", re.IGNORECASE), r"\1***"),
    (re.compile(r"(x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?)[^'\"&\s]+", re.IGNORECASE), r"\1***"),
    (re.compile(r"(Credential=)[^/&\s'\"]+"), r"\1***"),
)


class _RedactSigning(logging.Filter):
    """Masks credentials in botocore's request logs (cwtrain never logs key material)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot be formatted is left to the handler
            return True
        redacted = text
        for pattern, replacement in _SIGNING:
            redacted = pattern.sub(replacement, redacted)
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


_REDACT_SIGNING = _RedactSigning()
for _name in ("botocore.endpoint", "botocore.auth", "botocore.httpsession"):
    logging.getLogger(_name).addFilter(_REDACT_SIGNING)


def _shared_loader() -> Any:
    """One botocore data loader for every client: parsing the service models once saves ~0.7 s a client."""
    global _loader
    with _loader_lock:
        if _loader is None:
            import botocore.loaders

            _loader = botocore.loaders.create_loader()
        paths = _loader.search_paths
        paths[:] = list(dict.fromkeys(paths))  # boto3 appends its data path per session
        return _loader


def _botocore_session(profile: str | None = None) -> Any:
    import botocore.session

    session = botocore.session.get_session()
    session.register_component("data_loader", _shared_loader())
    if profile:
        session.set_config_variable("profile", profile)
    return session


def _profile_endpoint(session: Any) -> str | None:
    """The S3 endpoint the shared AWS config file gives the active profile, if any."""
    try:
        scoped = session.get_scoped_config()
    except Exception:  # a missing profile is reported by boto3 itself when the client is built
        return None
    services_name = scoped.get("services")
    if services_name:
        section = session.full_config.get("services", {}).get(services_name, {})
        s3_section = section.get("s3", {})
        if isinstance(s3_section, Mapping) and s3_section.get("endpoint_url"):
            return str(s3_section["endpoint_url"])
    value = scoped.get("endpoint_url")
    return str(value) if value else None


def resolve_endpoint(
    endpoint_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    session: Any = None,
) -> str:
    """The S3 endpoint to use, in the documented order (see the module docstring).

    Args:
        endpoint_url: an explicit endpoint; wins when given.
        environ: environment to read (default ``os.environ``).
        session: a botocore session for the profile lookup (built on demand).

    Returns:
        The endpoint URL, without a trailing ``/``.
    """
    return _endpoint_origin(endpoint_url, environ, session=session).url


def _endpoint_origin(
    endpoint_url: str | None, environ: Mapping[str, str] | None = None, *, session: Any = None
) -> EndpointOrigin:
    """:func:`resolve_endpoint`, with what chose the endpoint (for the line when it cannot be reached)."""
    env = os.environ if environ is None else environ
    source = "argument" if endpoint_url else ENDPOINT_VARIABLE
    chosen = endpoint_url or env_str(ENDPOINT_VARIABLE, env)
    if not chosen:
        ignore = (env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").strip()
        if not (ignore and parse_bool(ignore, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
            for source in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
                chosen = (env.get(source) or "").strip()
                if chosen:
                    break
            else:
                source = "profile"
                chosen = _profile_endpoint(session if session is not None else _botocore_session())
    if not chosen:
        source = "default"
    chosen = (chosen or DEFAULT_S3_ENDPOINT).strip().rstrip("/")
    parts = urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"S3 endpoint {chosen!r} is not an http(s) URL; set CW_S3_ENDPOINT to e.g. {DEFAULT_S3_ENDPOINT}"
        )
    return EndpointOrigin(chosen, source)


def addressing_style(endpoint_url: str) -> str:
    """``"path"`` for loopback, IP-literal and single-label hosts, else ``"virtual"``."""
    host = (urlsplit(endpoint_url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost") or "." not in host:
        return "path"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "virtual"
    return "path"


def resolve_region(
    region_name: str | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    session: Any = None,
) -> str:
    """The region (the bucket's availability zone): argument, ``AWS_REGION``, then the SDK's.

    Raises:
        ConfigError: no region anywhere; the message names ``AWS_REGION``.
    """
    env = os.environ if environ is None else environ
    region: str | None = region_name or env_str("AWS_REGION", env) or (env.get("AWS_DEFAULT_REGION") or "").strip()
    if not region:
        try:
            region = (session if session is not None else _botocore_session()).get_config_variable("region")
        except Exception:
            region = None
    if not region:
        raise ConfigError(
            "no object-storage region: set AWS_REGION to the bucket's availability zone (e.g. US-EAST-04A)"
        )
    return str(region)


def _pool_size(environ: Mapping[str, str]) -> int:
    raw = env_str("CW_S3_MAX_POOL", environ)
    if raw is None:
        return _DEFAULT_POOL
    try:
        value = int(raw, 10)
        if value < 1:
            raise ValueError(raw)
    except ValueError:
        log.warning("CW_S3_MAX_POOL=%r is not a positive integer; using %d", raw, _DEFAULT_POOL)
        return _DEFAULT_POOL
    return max(_MIN_POOL, value)


def s3_client(endpoint_url: str | None = None, *, region_name: str | None = None, **boto3_kwargs: Any) -> Any:
    """A boto3 S3 client for CoreWeave AI Object Storage or another S3-compatible store.

    Args:
        endpoint_url: the endpoint; else ``CW_S3_ENDPOINT``, the AWS configuration, then
            :data:`DEFAULT_S3_ENDPOINT`.
        region_name: the bucket's availability zone; else ``AWS_REGION``, then
            ``AWS_DEFAULT_REGION`` or the profile.
        **boto3_kwargs: passed to ``boto3.session.Session.client`` (credentials,
            ``verify``, ``config`` merged over cwtrain's settings); ``profile_name`` selects
            an AWS profile.

    Returns:
        A ``botocore`` S3 client.

    Raises:
        ConfigError: no region, or an endpoint that is not an http(s) URL.
    """
    import boto3.session
    from botocore.config import Config

    profile = boto3_kwargs.pop("profile_name", None)
    session = _botocore_session(profile)
    origin = _endpoint_origin(endpoint_url, session=session)
    endpoint = origin.url
    region = resolve_region(region_name, session=session)
    config = Config(
        signature_version="s3v4",
        retries={"max_attempts": _MAX_ATTEMPTS, "mode": "adaptive"},
        max_pool_connections=_pool_size(os.environ),
        s3={"addressing_style": addressing_style(endpoint), "payload_signing_enabled": False},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    user_config = boto3_kwargs.pop("config", None)
    if user_config is not None:
        s3_options = {**config.s3, **(getattr(user_config, "s3", None) or {})}
        config = config.merge(user_config).merge(Config(s3=s3_options))
    verify = boto3_kwargs.get("verify")
    if verify is False:
        log.warning("TLS verification of the S3 endpoint %s is OFF (verify=False); use only for development", endpoint)
    log.debug("S3 client: endpoint %s, region %s, addressing %s", endpoint, region, config.s3["addressing_style"])
    client = boto3.session.Session(botocore_session=session).client(
        "s3", endpoint_url=endpoint, region_name=region, config=config, **boto3_kwargs
    )
    _shared_loader()  # drop the data path boto3 just appended again
    remember(client, origin)  # named in the error line when it cannot connect
    return client


# ------------------------------------------------------------------------ the object store


#: What ``s3=`` parameters accept: an :class:`ObjectStore`, or a boto3 client to wrap.
type ObjectStoreLike = ObjectStore | S3Client


def object_store(
    endpoint_url: str | None = None, *, region_name: str | None = None, **boto3_kwargs: Any
) -> Boto3ObjectStore:
    """The object store over a client from :func:`s3_client` (same arguments, same resolution).

    Raises:
        ConfigError: no region, or an endpoint that is not an http(s) URL.
        ObjectStoreError: the SDK refused to build the client (e.g. an unknown ``profile_name``).
    """
    with _translated("CreateClient"):
        client = s3_client(endpoint_url, region_name=region_name, **boto3_kwargs)
    return Boto3ObjectStore(client)


def as_object_store(s3: ObjectStoreLike | None = None) -> ObjectStore:
    """``s3`` as an :class:`ObjectStore`: a store as it is, a boto3 client wrapped, ``None`` built.

    Args:
        s3: an :class:`ObjectStore`, a boto3 S3 client, or ``None`` for :func:`object_store`
            configured from the environment.

    Raises:
        ConfigError: ``None`` and no region or a bad endpoint in the environment.
        ObjectStoreError: ``None`` and the SDK refused to build the client.
    """
    if s3 is None:
        return object_store()
    if isinstance(s3, ObjectStore):
        return s3
    return Boto3ObjectStore(s3)


@contextmanager
def _translated(operation: str, key: str = "", client: Any = None) -> Iterator[None]:
    """Raise the SDK's exceptions as cwtrain's object-store errors (the original as ``__cause__``).

    A request that could not connect names the endpoint and what chose it
    (:func:`cwtrain.infra.s3_endpoint.unreachable_message`); one whose credentials were
    refused names the error code and the variable to check (:func:`~cwtrain.infra.s3_endpoint.refusal_message`).
    """
    from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError
    from botocore.exceptions import ConnectionError as SDKConnectionError

    try:
        yield
    except ObjectStoreDeadlineError as exc:  # raised by the deadline hooks, which know no key
        what = f"{operation} {key}".strip()
        raise ObjectStoreDeadlineError(
            f"{what}: the deadline passed before the object store answered", operation=operation, key=key
        ) from exc.__cause__
    except ClientError as exc:
        response: Mapping[str, Any] = getattr(exc, "response", None) or {}
        error = response.get("Error", {})
        code = str(error.get("Code") or "?")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = refusal_message(code, str(error.get("Message") or ""), client, operation, key) or str(exc)
        raise status_error(
            message, code=code, http_status=int(status) if status else None, operation=operation, key=key
        ) from exc
    except SDKConnectionError as exc:  # no connection: the endpoint and its origin say what to fix
        raise ObjectStoreTransportError(
            unreachable_message(exc, client, operation), operation=operation, key=key
        ) from exc
    except (HTTPClientError, IncompleteReadError) as exc:
        raise ObjectStoreTransportError(str(exc), operation=operation, key=key) from exc
    except BotoCoreError as exc:  # credentials, configuration: no request went out
        raise ObjectStoreError(str(exc), operation=operation, key=key) from exc


def _stored(key: str, response: Mapping[str, Any]) -> StoredObject:
    metadata = {str(k).lower(): str(v) for k, v in (response.get("Metadata") or {}).items()}
    return StoredObject(
        key=key,
        size=int(response.get("ContentLength", 0)),
        etag=str(response.get("ETag", "")),
        metadata=metadata,
        checksum_sha256=_sha256_hex(response.get("ChecksumSHA256")),
    )


def _sha256_hex(value: Any) -> str | None:
    """A whole-object ``ChecksumSHA256`` (base64) as hex; ``None`` for none or a composite (``<b64>-<parts>``)."""
    if not isinstance(value, str) or "-" in value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


class _StreamBody:
    """botocore's streaming body, reading with cwtrain's errors."""

    def __init__(self, body: Any, key: str) -> None:
        self._body = body
        self._key = key

    def read(self, size: int = -1, /) -> bytes:
        with _translated("GetObject", self._key):
            return bytes(self._body.read(None if size < 0 else size))

    def close(self) -> None:
        self._body.close()


class Boto3ObjectStore:
    """The :class:`~cwtrain.infra.objectstore.ObjectStore` over a boto3 S3 client.

    Build it with :func:`object_store` (or wrap a client with :func:`as_object_store`).
    Wrapping prepares the client to send :class:`~cwtrain.infra.objectstore.Payload`
    bodies without copies (see the module docstring); nothing else about the client
    changes, so it stays usable on its own.

    Args:
        client: a boto3 S3 client (best from :func:`s3_client`).

    Attributes:
        client: the wrapped boto3 client.
    """

    def __init__(self, client: S3Client, *, deadline: Deadline | None = None) -> None:
        self.client: Any = client
        self.deadline = deadline
        install_zero_copy(client)
        install_deadlines(client)

    def within(self, deadline: Deadline) -> Boto3ObjectStore:
        """This store (the same client and connections) with every call bounded by ``deadline``.

        Each request's read timeout is at most what is left, no SDK retry starts with less than
        :data:`~cwtrain.infra.objectstore.MIN_ATTEMPT_SECONDS` left, and past the deadline a call
        raises :class:`~cwtrain.infra.objectstore.ObjectStoreDeadlineError` without a request.
        ``download`` (the SDK's own threads) is checked only before it starts.
        """
        return Boto3ObjectStore(self.client, deadline=deadline)

    @contextmanager
    def _op(self, operation: str, key: str = "") -> Iterator[None]:
        if self.deadline is not None and self.deadline.remaining <= 0:
            raise deadline_passed(self.deadline, operation, key)
        with call_deadline(self.deadline), _translated(operation, key, self.client):
            yield

    def __repr__(self) -> str:
        endpoint = getattr(getattr(self.client, "meta", None), "endpoint_url", "?")
        return f"Boto3ObjectStore({endpoint})"

    def head(self, bucket: str, key: str, *, checksum: bool = False) -> StoredObject | None:
        """HeadObject (``ChecksumMode=ENABLED`` when ``checksum``); ``None`` for a missing key."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if checksum:
            kwargs["ChecksumMode"] = "ENABLED"
        try:
            with self._op("HeadObject", key):
                response = self.client.head_object(**kwargs)
        except ObjectNotFoundError:
            return None
        return _stored(key, response)

    def get(self, bucket: str, key: str) -> ObjectStream:
        """GetObject, as a stream (``ObjectNotFoundError`` for a missing key)."""
        with self._op("GetObject", key):
            response = self.client.get_object(Bucket=bucket, Key=key)
        return ObjectStream(_stored(key, response), _StreamBody(response["Body"], key))

    def put(
        self,
        bucket: str,
        key: str,
        body: Body,
        *,
        metadata: Mapping[str, str] | None = None,
        content_type: str | None = None,
        if_none_match: bool = False,
        sha256: str | None = None,
    ) -> None:
        """PutObject (create-only with ``If-None-Match: *`` when ``if_none_match``; ``sha256`` as its checksum)."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": request_body(body)}
        if sha256 is not None:
            kwargs["ChecksumAlgorithm"] = "SHA256"
            kwargs["ChecksumSHA256"] = base64.b64encode(bytes.fromhex(sha256)).decode()
        if metadata is not None:
            kwargs["Metadata"] = dict(metadata)
        if content_type is not None:
            kwargs["ContentType"] = content_type
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        with self._op("PutObject", key):
            self.client.put_object(**kwargs)

    def list_objects(
        self, bucket: str, prefix: str, *, delimiter: str | None = None, limit: int | None = None
    ) -> list[ListedObject]:
        """ListObjectsV2 over every page (one page when ``limit`` is reached)."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if delimiter is not None:
            kwargs["Delimiter"] = delimiter
        if limit is not None:
            kwargs["MaxKeys"] = limit
        found: list[ListedObject] = []
        while True:
            with self._op("ListObjectsV2"):
                page = self.client.list_objects_v2(**kwargs)
            found.extend(
                ListedObject(str(item["Key"]), int(item.get("Size", 0)), str(item.get("ETag", "")))
                for item in page.get("Contents", [])
            )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token or (limit is not None and len(found) >= limit):
                return found[:limit] if limit is not None else found
            kwargs["ContinuationToken"] = token

    def create_multipart(self, bucket: str, key: str, *, metadata: Mapping[str, str] | None = None) -> str:
        """CreateMultipartUpload; returns the upload id."""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if metadata is not None:
            kwargs["Metadata"] = dict(metadata)
        with self._op("CreateMultipartUpload", key):
            return str(self.client.create_multipart_upload(**kwargs)["UploadId"])

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, body: Body) -> str:
        """UploadPart; returns the part's ETag."""
        with self._op("UploadPart", key):
            response = self.client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=request_body(body)
            )
        return str(response["ETag"])

    def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]], *, if_none_match: bool = False
    ) -> None:
        """CompleteMultipartUpload (create-only with ``If-None-Match: *`` when ``if_none_match``)."""
        kwargs: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": [{"PartNumber": number, "ETag": etag} for number, etag in parts]},
        }
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        with self._op("CompleteMultipartUpload", key):
            self.client.complete_multipart_upload(**kwargs)

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        """AbortMultipartUpload."""
        with self._op("AbortMultipartUpload", key):
            self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)

    def list_parts(self, bucket: str, key: str, upload_id: str) -> list[UploadedPart]:
        """ListParts over every page."""
        parts: list[UploadedPart] = []
        marker = 0
        while True:
            with self._op("ListParts", key):
                page = self.client.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker)
            parts.extend(
                UploadedPart(int(part["PartNumber"]), str(part["ETag"]), int(part["Size"]))
                for part in page.get("Parts", [])
            )
            if not page.get("IsTruncated"):
                return parts
            marker = int(page["NextPartNumberMarker"])

    def list_multipart_uploads(self, bucket: str, prefix: str) -> list[OpenUpload]:
        """ListMultipartUploads over every page."""
        found: list[OpenUpload] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            with self._op("ListMultipartUploads"):
                page = self.client.list_multipart_uploads(**kwargs)
            for item in page.get("Uploads", []):
                initiated = item.get("Initiated")
                stamp = initiated.timestamp() if hasattr(initiated, "timestamp") else 0.0
                found.append(OpenUpload(str(item["Key"]), str(item["UploadId"]), stamp))
            if not page.get("IsTruncated"):
                return found
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    def download(self, bucket: str, key: str, path: str | os.PathLike[str]) -> None:
        """The SDK's managed download (parallel ranged GETs for large objects)."""
        from boto3.exceptions import RetriesExceededError

        try:
            with self._op("GetObject", key):
                self.client.download_file(bucket, key, os.fspath(path))
        except RetriesExceededError as exc:
            raise ObjectStoreTransportError(str(exc), operation="GetObject", key=key) from exc

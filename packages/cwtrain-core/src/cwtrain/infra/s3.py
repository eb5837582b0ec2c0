"""The S3 client factory for CoreWeave AI Object Storage (and any S3-compatible store).

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

**Sending files.** Over plain HTTP (a loopback store, the LOTA cache) the client's
connections send a request-body chunk that is a :class:`FileRange` with ``sendfile``:
the kernel sends straight from the page cache instead of copying the bytes from user
memory (about 0.05 CPU-s/GB less on loopback). Any other chunk, and HTTPS, go through the
SDK's own send path; a connection that predates :func:`install_sendfile` iterates the
range's memory views instead.

**TLS** verification is on. ``verify=False`` turns it off (with a warning; for
development stores with self-signed certificates only); ``verify="/path/ca.pem"`` names
a CA bundle. Credentials come from the standard boto3 chain (static keys, container
credentials, web identity, profiles); cwtrain never reads or logs key material, and it
masks the signing material (``Authorization``, ``Credential=``, session tokens) in
botocore's DEBUG request logs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from cwtrain.config import env_str, parse_bool
from cwtrain.errors import ConfigError

__all__ = [
    "DEFAULT_S3_ENDPOINT",
    "FileRange",
    "addressing_style",
    "install_sendfile",
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
    env = os.environ if environ is None else environ
    chosen = endpoint_url or env_str("CW_S3_ENDPOINT", env)
    if not chosen:
        ignore = (env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").strip()
        if not (ignore and parse_bool(ignore, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
            chosen = (env.get("AWS_ENDPOINT_URL_S3") or "").strip() or (env.get("AWS_ENDPOINT_URL") or "").strip()
            if not chosen:
                chosen = _profile_endpoint(session if session is not None else _botocore_session())
    chosen = (chosen or DEFAULT_S3_ENDPOINT).strip().rstrip("/")
    parts = urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"S3 endpoint {chosen!r} is not an http(s) URL; set CW_S3_ENDPOINT to e.g. {DEFAULT_S3_ENDPOINT}"
        )
    return chosen


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


class FileRange:
    """A request-body chunk that is ``views`` = the bytes of file ``fd`` from ``offset`` on.

    Plain-HTTP connections of a client prepared by :func:`install_sendfile` send it with
    ``sendfile``; any other connection iterates it and sends the views.
    """

    def __init__(self, fd: int, offset: int, views: tuple[memoryview, ...]) -> None:
        self.fd = fd
        self.offset = offset
        self.views = views
        self.count = sum(v.nbytes for v in views)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self.views)


class _RangeFile:
    """A file object for ``socket.sendfile`` over a shared descriptor (``pread``: no shared offset)."""

    mode = "rb"

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pos = 0

    def fileno(self) -> int:
        return self._fd

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos
        return pos

    def read(self, amt: int) -> bytes:
        """Used by ``socket.sendfile`` only where ``os.sendfile`` cannot be."""
        data = os.pread(self._fd, amt, self._pos)
        self._pos += len(data)
        return data


_sendfile_pool: Any = None


def _sendfile_pool_class() -> Any:
    """botocore's plain-HTTP connection pool, with connections that ``sendfile`` a :class:`FileRange`."""
    global _sendfile_pool
    if _sendfile_pool is None:
        from botocore.awsrequest import AWSHTTPConnection, AWSHTTPConnectionPool

        class SendfileConnection(AWSHTTPConnection):  # type: ignore[misc]
            def send(self, data: Any) -> Any:
                if not isinstance(data, FileRange) or self.sock is None:
                    return super().send(data)
                if self._response_received:  # the store answered before the body (Expect: 100-continue)
                    return None
                self.sock.sendfile(_RangeFile(data.fd), data.offset, data.count)
                return None

        class SendfilePool(AWSHTTPConnectionPool):  # type: ignore[misc]
            ConnectionCls = SendfileConnection

        _sendfile_pool = SendfilePool
    return _sendfile_pool


def install_sendfile(s3: Any) -> None:
    """Let the plain-HTTP connections ``s3`` opens from now on send :class:`FileRange` chunks with ``sendfile``.

    Idempotent; a no-op for a client whose HTTP session is not botocore's urllib3 one.
    """
    from botocore.awsrequest import AWSHTTPConnectionPool

    session = getattr(getattr(s3, "_endpoint", None), "http_session", None)
    classes = getattr(session, "_pool_classes_by_scheme", None)
    if isinstance(classes, dict) and classes.get("http") is AWSHTTPConnectionPool:
        classes["http"] = _sendfile_pool_class()


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
    endpoint = resolve_endpoint(endpoint_url, session=session)
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
    install_sendfile(client)
    return client

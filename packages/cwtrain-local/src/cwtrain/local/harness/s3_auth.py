"""The local object store's credential check: SigV4 signatures, refused as S3 refuses them.

:func:`require_signature` wraps a WSGI application (moto's S3 server, in
:mod:`cwtrain.local.harness.moto_s3`) so that every request on a bucket path must be signed
with AWS Signature Version 4 by one key pair, ``Authorization: AWS4-HMAC-SHA256
Credential=AK/DATE/REGION/SERVICE/aws4_request, SignedHeaders=..., Signature=...`` or the
presigned query (``X-Amz-Algorithm``, ``X-Amz-Credential``, ...). moto checks no signature,
so without this a wrong secret key published fine locally and was first seen on the real
bucket. What a request gets, as S3 answers it (403 with S3's XML error body)::

    no signature (an anonymous request)            AccessDenied
    an access key that is not the stack's          InvalidAccessKeyId
    a signature the stack's secret does not give   SignatureDoesNotMatch
    a presigned URL past its X-Amz-Expires         AccessDenied

The signature is rebuilt from the request as received: the method; the path as sent
(still percent-encoded, as S3 signs it, not encoded twice); the query, each name and value
encoded once and sorted (``X-Amz-Signature`` left out); the signed headers in their order,
``host`` as received (so a proxy in front of the store changes nothing); the payload hash
as the ``x-amz-content-sha256`` header states it (``UNSIGNED-PAYLOAD`` for a presigned URL).
The body is not read: a signed payload hash is taken as stated, not checked against the
bytes. Clocks are not compared (no ``RequestTimeTooSkewed``). moto's own endpoints
(``/moto-api/...``: readiness, reset) need no signature.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_from_bytes, unquote_to_bytes

__all__ = ["Refusal", "check_request", "require_signature"]

type WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_ALGORITHM = "AWS4-HMAC-SHA256"
_OPEN_PREFIX = "/moto-api"
_AUTH_FIELDS = re.compile(r"(Credential|SignedHeaders|Signature)=([^,\s]*)")


@dataclass(frozen=True)
class Refusal:
    """An S3 error answer: the HTTP status, S3's error code and its message."""

    status: int
    code: str
    message: str


_ANONYMOUS = Refusal(403, "AccessDenied", "Access Denied")
_UNKNOWN_KEY = Refusal(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
_BAD_SIGNATURE = Refusal(
    403,
    "SignatureDoesNotMatch",
    "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
)
_NO_DATE = Refusal(403, "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header")
_EXPIRED = Refusal(403, "AccessDenied", "Request has expired")
_OLD_SIGNATURE = Refusal(
    400,
    "InvalidRequest",
    "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.",
)


def _malformed(what: str) -> Refusal:
    return Refusal(400, "AuthorizationHeaderMalformed", f"The authorization header is malformed; {what}.")


def _query_pairs(raw_query: str) -> list[tuple[bytes, bytes]]:
    """The raw query's ``name=value`` pairs, percent-decoded (``+`` stays ``+``, as SigV4 reads it)."""
    pairs = []
    for item in raw_query.split("&"):
        if item:
            name, _, value = item.partition("=")
            pairs.append((unquote_to_bytes(name), unquote_to_bytes(value)))
    return pairs


def _encode(raw: bytes) -> str:
    """SigV4's URI encoding: every byte but ``A-Za-z0-9-_.~`` as ``%XX``."""
    return quote_from_bytes(raw, safe="-_.~")


def _header(environ: Mapping[str, Any], name: str) -> str | None:
    """A request header as received (WSGI keeps ``Content-Type`` and ``Content-Length`` apart)."""
    key = name.upper().replace("-", "_")
    value = environ.get(key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}")
    return None if value is None else str(value)


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _signed_parts(environ: Mapping[str, Any]) -> tuple[dict[str, str], bool] | Refusal | None:
    """The signature's fields (``Credential``, ``SignedHeaders``, ``Signature``, ``Date``, and
    ``Expires`` for a presigned URL) and whether they came from a presigned query; ``None``
    for an unsigned request."""
    authorization = _header(environ, "Authorization")
    if authorization is not None:
        scheme, _, rest = authorization.strip().partition(" ")
        if scheme != _ALGORITHM:
            return _OLD_SIGNATURE if scheme == "AWS" else _malformed(f"the algorithm {scheme!r} is not {_ALGORITHM}")
        fields = dict(_AUTH_FIELDS.findall(rest))
        fields["Date"] = (_header(environ, "X-Amz-Date") or "").strip()
        return fields, False
    query = {name.decode("latin-1"): value.decode("latin-1") for name, value in _query_pairs(_raw_query(environ))}
    if "X-Amz-Algorithm" not in query and "X-Amz-Signature" not in query:
        return None
    if query.get("X-Amz-Algorithm") != _ALGORITHM:
        return _malformed(f"X-Amz-Algorithm must be {_ALGORITHM}")
    names = ("Credential", "SignedHeaders", "Signature", "Date", "Expires")
    return {name: query.get(f"X-Amz-{name}", "") for name in names}, True


def _raw_target(environ: Mapping[str, Any]) -> str:
    """The request target as sent, still percent-encoded (werkzeug's ``RAW_URI``)."""
    return str(environ["RAW_URI"])


def _raw_query(environ: Mapping[str, Any]) -> str:
    return _raw_target(environ).partition("?")[2]


def _canonical_request(environ: Mapping[str, Any], signed_headers: list[str], presigned: bool) -> bytes:
    path, _, query = _raw_target(environ).partition("?")
    pairs = sorted(
        (_encode(name), _encode(value))
        for name, value in _query_pairs(query)
        if not (presigned and name == b"X-Amz-Signature")
    )
    headers = []
    for name in signed_headers:
        value = _header(environ, name) or ""
        headers.append(f"{name}:{' '.join(value.split())}\n")
    payload = "UNSIGNED-PAYLOAD" if presigned else (_header(environ, "X-Amz-Content-SHA256") or "").strip()
    lines = (
        str(environ.get("REQUEST_METHOD", "GET")),
        path or "/",
        "&".join(f"{name}={value}" for name, value in pairs),
        "".join(headers),
        ";".join(signed_headers),
        payload,
    )
    return "\n".join(lines).encode("latin-1")


def check_request(environ: Mapping[str, Any], access_key: str, secret_key: str) -> Refusal | None:
    """Why S3 would refuse this request signed for ``access_key``/``secret_key``; ``None`` when it is good.

    Args:
        environ: the WSGI environ of the request: its method, headers and ``RAW_URI`` (the
            request target as sent, which werkzeug's server sets).
        access_key: the one access key id the store knows.
        secret_key: its secret.
    """
    parts = _signed_parts(environ)
    if parts is None:
        return _ANONYMOUS
    if isinstance(parts, Refusal):
        return parts
    fields, presigned = parts
    credential = fields.get("Credential", "").split("/")
    signed_headers = [name for name in fields.get("SignedHeaders", "").split(";") if name]
    if len(credential) != 5 or credential[4] != "aws4_request" or not signed_headers or not fields.get("Signature"):
        return _malformed("it needs Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders and Signature")
    key, date, region, service, _ = credential
    if not hmac.compare_digest(key.encode(), access_key.encode()):
        return _UNKNOWN_KEY
    stamp = fields["Date"]
    if not stamp:
        return _NO_DATE
    if presigned and _expired(stamp, fields["Expires"]):
        return _EXPIRED
    canonical = _canonical_request(environ, signed_headers, presigned)
    to_sign = "\n".join((_ALGORITHM, stamp, "/".join(credential[1:]), hashlib.sha256(canonical).hexdigest())).encode(
        "latin-1"
    )
    expected = hmac.new(_signing_key(secret_key, date, region, service), to_sign, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), fields["Signature"].lower().encode()):
        return _BAD_SIGNATURE
    return None


def _expired(stamp: str, expires: str) -> bool:
    """Whether a presigned URL dated ``stamp`` (``YYYYMMDDTHHMMSSZ``) for ``expires`` seconds is past."""
    try:
        signed = calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ"))
        return time.time() > signed + int(expires or 0)
    except ValueError:
        return True


def _error_body(refusal: Refusal, request_id: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{refusal.code}</Code><Message>{refusal.message}</Message>"
        f"<RequestId>{request_id}</RequestId></Error>"
    ).encode()


def _drain(environ: Mapping[str, Any]) -> None:
    """Read the request's body (its Content-Length, or its chunks) and drop it."""
    from werkzeug.wsgi import get_input_stream

    stream = get_input_stream(dict(environ))
    while stream.read(1 << 20):
        pass


def require_signature(app: WSGIApp, access_key: str, secret_key: str) -> WSGIApp:
    """``app`` answering only requests signed with ``access_key``/``secret_key`` (see the module docstring)."""

    def checked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("PATH_INFO") or "").startswith(_OPEN_PREFIX):
            return app(environ, start_response)
        refusal = check_request(environ, access_key, secret_key)
        if refusal is None:
            return app(environ, start_response)
        _drain(environ)  # the server closes the connection after the answer: a body left unread would reset it
        request_id = uuid.uuid4().hex[:16].upper()
        body = b"" if environ.get("REQUEST_METHOD") == "HEAD" else _error_body(refusal, request_id)
        reason = {400: "Bad Request", 403: "Forbidden"}[refusal.status]
        start_response(
            f"{refusal.status} {reason}",
            [
                ("Content-Type", "application/xml"),
                ("Content-Length", str(len(body))),
                ("x-amz-request-id", request_id),
            ],
        )
        return [body]

    return checked

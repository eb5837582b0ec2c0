"""Where a client's S3 endpoint came from, and the one line that says so when it does not answer
or refuses the credentials.

:func:`cwtrain.infra.s3.s3_client` records, for every client it builds, the endpoint and
what chose it (:class:`EndpointOrigin`: the ``endpoint_url`` argument, ``CW_S3_ENDPOINT``,
the AWS configuration, or the default because none of those was set). When a request
cannot connect (refused, unresolvable host, connect timeout), the object store's
translation of SDK errors asks :func:`unreachable_message` for the line to raise::

    cannot reach the object store at CW_S3_ENDPOINT=http://127.0.0.1:1 (ListObjectsV2: could not
    connect to http://127.0.0.1:1/bucket: Failed to establish a new connection: [Errno 111] Connection
    refused); check that CW_S3_ENDPOINT names a running S3-compatible endpoint

    cannot reach the object store at https://cwobject.com: CW_S3_ENDPOINT is not set, so cwtrain used
    the default https://cwobject.com (ListObjectsV2: could not connect to ...); set CW_S3_ENDPOINT to
    the object store's endpoint (for the local stack: eval "$(cwtrain local env)")

When the store refuses the request's credentials, :func:`refusal_message` gives the line
that names the S3 error code and the variable to check (``None`` for other answers, which
keep the store's own message)::

    the object store at http://127.0.0.1:9000 refused the credentials (SignatureDoesNotMatch on ListObjectsV2:
    The request signature we calculated does not match ...); check AWS_SECRET_ACCESS_KEY: it must be the
    secret key of AWS_ACCESS_KEY_ID

    the object store at http://127.0.0.1:9000 refused the credentials (InvalidAccessKeyId on ListObjectsV2:
    The AWS Access Key Id you provided does not exist in our records.); check AWS_ACCESS_KEY_ID: the store
    knows no such access key

    the object store at http://127.0.0.1:9000 refused the request (AccessDenied on PutObject hotload/a.bin:
    Access Denied); check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and that the bucket
    policy allows the call

A boto3 client built elsewhere has no record; its line names the client's own endpoint.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["ENDPOINT_VARIABLE", "EndpointOrigin", "origin_of", "refusal_message", "remember", "unreachable_message"]

#: cwtrain's own variable for the endpoint (first after an explicit argument).
ENDPOINT_VARIABLE = "CW_S3_ENDPOINT"


@dataclass(frozen=True)
class EndpointOrigin:
    """An endpoint and what chose it.

    Attributes:
        url: the endpoint the client sends to.
        source: ``"argument"``, a variable name (``CW_S3_ENDPOINT``, ``AWS_ENDPOINT_URL_S3``,
            ``AWS_ENDPOINT_URL``), ``"profile"`` (the AWS config file), or ``"default"``.
    """

    url: str
    source: str

    def describe(self) -> str:
        """The endpoint with its origin, as the error line names it."""
        if self.source == ENDPOINT_VARIABLE:
            return f"{ENDPOINT_VARIABLE}={self.url}"
        if self.source == "default":
            return f"{self.url}: {ENDPOINT_VARIABLE} is not set, so cwtrain used the default {self.url}"
        if self.source == "argument":
            return f"{self.url} (the endpoint_url given to s3_client)"
        where = "the AWS profile's endpoint_url" if self.source == "profile" else self.source
        return f"{self.url} (from {where}; {ENDPOINT_VARIABLE} is not set)"

    def fix(self) -> str:
        """What to do about it."""
        if self.source == ENDPOINT_VARIABLE:
            return f"check that {ENDPOINT_VARIABLE} names a running S3-compatible endpoint"
        if self.source == "argument":
            return "check that endpoint_url names a running S3-compatible endpoint"
        return (
            f"set {ENDPOINT_VARIABLE} to the object store's endpoint "
            '(for the local stack: eval "$(cwtrain local env)")'
        )


_ORIGINS: weakref.WeakKeyDictionary[Any, EndpointOrigin] = weakref.WeakKeyDictionary()


def remember(client: Any, origin: EndpointOrigin) -> None:
    """Record what chose ``client``'s endpoint (kept as long as the client lives)."""
    try:
        _ORIGINS[client] = origin
    except TypeError:  # not weakly referenceable: its line names its endpoint only
        pass


def origin_of(client: Any) -> EndpointOrigin | None:
    """What chose ``client``'s endpoint, when :func:`remember` recorded it."""
    try:
        return _ORIGINS.get(client)
    except TypeError:
        return None


def _without_query(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _reason(exc: BaseException) -> str:
    """The connection failure in words (urllib3's text after its connection's repr)."""
    error = getattr(exc, "kwargs", {}).get("error")
    if error is None:
        return ""
    text = " ".join(str(error).split())
    return text.split("): ", 1)[1] if "): " in text else text


def _endpoint(client: Any) -> str:
    origin = origin_of(client) if client is not None else None
    return origin.url if origin else str(getattr(getattr(client, "meta", None), "endpoint_url", "") or "")


def unreachable_message(exc: BaseException, client: Any, operation: str) -> str:
    """The line for a request of ``client`` that could not connect (botocore's ``ConnectionError``).

    Args:
        exc: the SDK's exception (its ``endpoint_url`` and underlying ``error`` are used when present).
        client: the boto3 client that sent it (``None`` when unknown).
        operation: the S3 operation.
    """
    origin = origin_of(client) if client is not None else None
    endpoint = _endpoint(client)
    url = str(getattr(exc, "kwargs", {}).get("endpoint_url") or "")
    reason = _reason(exc)
    detail = f"could not connect to {_without_query(url)}" if url else " ".join(str(exc).split())
    if reason:
        detail += f": {reason}"
    detail = f"{operation}: {detail}" if operation else detail
    if origin is not None:
        return f"cannot reach the object store at {origin.describe()} ({detail}); {origin.fix()}"
    where = f" at {endpoint} (the endpoint of the S3 client passed in)" if endpoint else ""
    return f"cannot reach the object store{where} ({detail}); check that client's endpoint_url"


#: What the store refused, and what to check, by S3 error code.
_REFUSALS = {
    "SignatureDoesNotMatch": (
        "the credentials",
        "check AWS_SECRET_ACCESS_KEY: it must be the secret key of AWS_ACCESS_KEY_ID",
    ),
    "InvalidAccessKeyId": ("the credentials", "check AWS_ACCESS_KEY_ID: the store knows no such access key"),
    "AccessDenied": (
        "the request",
        "check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and that the bucket policy allows the call",
    ),
}


def refusal_message(code: str, message: str, client: Any, operation: str, key: str = "") -> str | None:
    """The line for an answer that refused the credentials (see the module docstring); ``None`` for other codes.

    Args:
        code: the S3 error code of the answer.
        message: the store's message.
        client: the boto3 client that sent the request (``None`` when unknown).
        operation: the S3 operation.
        key: the object key, if the call had one.
    """
    if code not in _REFUSALS:
        return None
    what, fix = _REFUSALS[code]
    endpoint = _endpoint(client)
    where = f" at {endpoint}" if endpoint else ""
    call = " ".join(part for part in (operation, key) if part)
    detail = ": ".join(part for part in (f"{code} on {call}" if call else code, " ".join(message.split())) if part)
    return f"the object store{where} refused {what} ({detail}); {fix}"

"""The cwtrain error tree.

Every error cwtrain raises on purpose derives from :class:`CWTrainError`. The tree
keeps "you misused it" apart from "the remote failed", and "the transport failed"
apart from "the server said no"::

    CWTrainError                      plain instances: a failure with no branch of its own
    ├── ConfigError (ValueError)      a bad environment variable, option or deployment setting
    ├── UsageError (ValueError)       misuse: wrong arguments or calls in the wrong order
    ├── TransportError                no usable answer at all (connection, timeout, non-JSON 2xx)
    ├── APIError                      the control plane answered with an error code
    │   ├── InvalidArgumentError      invalid_argument (3)
    │   ├── NotFoundError             not_found (5)
    │   ├── AlreadyExistsError        already_exists (6)
    │   ├── PermissionDeniedError     permission_denied (7)
    │   ├── FailedPreconditionError   failed_precondition (9)
    │   │   └── HotLoadInProgressError    ... "already in progress"
    │   ├── UnimplementedError        unimplemented (12)
    │   ├── UnavailableError          unavailable (14), transient
    │   └── UnauthenticatedError      unauthenticated (16)
    ├── LifecycleError                a deployment or gateway wait or delete failed
    ├── SnapshotError                 a snapshot is malformed or cannot be published
    │   ├── SnapshotNotFoundError (FileNotFoundError)
    │   ├── SnapshotChecksumError     an Adler-32 or SHA-256 did not match
    │   ├── SnapshotConflictError     the identity already holds other bytes
    │   ├── SnapshotAccessError       the object store refused one of the four checks
    │   └── MirrorError               the trainer's copy of the served weights is unusable
    ├── HotLoadError                  a hot-load did not end as asked
    │   ├── HotLoadFailedError        FAILED or CANCELED
    │   ├── HotLoadVerificationError  completed, but replicas do not serve the identity
    │   ├── HotLoadTimeoutError       the time budget ran out after the hot-load was created
    │   └── PublishTimeoutError       the time budget ran out before any hot-load was created
    └── RolloutError                  sampling from the completions endpoint failed

Retrying: ``error.transient`` on a :class:`TransportError` (always) or an
:class:`APIError` (``unavailable``, ``deadline_exceeded``, ``resource_exhausted``, HTTP
500/502/503/504) says the same call may succeed; the waits catch both branches::

    try:
        hot_load = client.get_hot_load(hot_load_id)
    except (APIError, TransportError) as error:
        if not error.transient:
            raise
        log.warning("still waiting (%s)", error)

Every class pickles with its fields (Ray moves errors between processes): the base
class rebuilds instances without calling ``__init__`` again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = [
    "APIError",
    "AlreadyExistsError",
    "CWTrainError",
    "ConfigError",
    "FailedPreconditionError",
    "HotLoadError",
    "HotLoadFailedError",
    "HotLoadInProgressError",
    "HotLoadTimeoutError",
    "HotLoadVerificationError",
    "InvalidArgumentError",
    "LifecycleError",
    "MirrorError",
    "NotFoundError",
    "PermissionDeniedError",
    "PublishTimeoutError",
    "RolloutError",
    "SnapshotAccessError",
    "SnapshotChecksumError",
    "SnapshotConflictError",
    "SnapshotError",
    "SnapshotNotFoundError",
    "TransportError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UsageError",
    "api_error",
    "describe",
    "mask_secrets",
    "mask_url_userinfo",
    "secret_forms",
]


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    obj = cls.__new__(cls)
    BaseException.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class CWTrainError(Exception):
    """Root of every error cwtrain raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class ConfigError(CWTrainError, ValueError):
    """A configuration value is invalid: a variable, option, config key or deployment setting.

    The last covers a deployment that lacks what the call needs (no ``hotLoad`` block).
    """


class UsageError(CWTrainError, ValueError):
    """The API was called in a way that cannot work: wrong arguments, or calls in the wrong order.

    Refused before any I/O wherever the arguments alone show it.
    """


# --------------------------------------------------------------------- transport


class TransportError(CWTrainError):
    """No usable answer from the control plane; always transient.

    The connection was refused or dropped, the request timed out, or a 2xx body was
    not JSON. Not an :class:`APIError`: the service never said no (it may not have seen the
    request). The message reads ``unavailable: <what failed>``, as a proxy's answer would.

    Attributes:
        message: what failed and where (no secrets).
        http_status: the HTTP status when a response came back (a non-JSON 2xx), else ``None``.
    """

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        self.message = message
        self.http_status = http_status
        super().__init__(f"unavailable: {message}")

    @property
    def transient(self) -> bool:
        """Always ``True``: the same call may succeed once the network recovers."""
        return True


# --------------------------------------------------------------------------- API


class APIError(CWTrainError):
    """The control plane answered with an error.

    Attributes:
        code: the Connect code string (``"not_found"``, ...).
        message: the service's message.
        http_status: the HTTP status, when there was a response.
        details: the ``details`` array of the error body.
        retry_after: seconds the service asked to wait (``Retry-After``), else ``None``.
    """

    retry_after: float | None = None

    def __init__(
        self,
        code: str,
        message: str,
        *,
        http_status: int | None = None,
        details: Sequence[Any] | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.http_status = http_status
        self.details = list(details or [])
        super().__init__(f"{code}: {message}")

    @property
    def transient(self) -> bool:
        """Whether retrying the same call may succeed."""
        return self.code in _TRANSIENT_CODES or (
            self.http_status in (500, 502, 503, 504) and self.code != "unimplemented"
        )


class InvalidArgumentError(APIError):
    """``invalid_argument``: a field, identity or page size was refused."""


class NotFoundError(APIError):
    """``not_found``: no such resource."""


class AlreadyExistsError(APIError):
    """``already_exists``: the client id or the name is taken."""


class PermissionDeniedError(APIError):
    """``permission_denied``: the token lacks the role (Inference Admin / Viewer)."""


class FailedPreconditionError(APIError):
    """``failed_precondition``: not READY, hot-load active, chain too long, ..."""


class HotLoadInProgressError(FailedPreconditionError):
    """Another hot-load of the deployment is unfinished (single-flight)."""


class UnimplementedError(APIError):
    """``unimplemented``: the service does not offer this call (cancel, today)."""


class UnavailableError(APIError):
    """``unavailable``: the service is temporarily unable to answer; retry."""


class UnauthenticatedError(APIError):
    """``unauthenticated``: the token is missing, bad or expired."""


_TRANSIENT_CODES = frozenset({"unavailable", "deadline_exceeded", "resource_exhausted"})

_CODE_CLASSES: dict[str, type[APIError]] = {
    "invalid_argument": InvalidArgumentError,
    "not_found": NotFoundError,
    "already_exists": AlreadyExistsError,
    "permission_denied": PermissionDeniedError,
    "failed_precondition": FailedPreconditionError,
    "unimplemented": UnimplementedError,
    "unavailable": UnavailableError,
    "unauthenticated": UnauthenticatedError,
}


def api_error(
    code: str,
    message: str,
    *,
    http_status: int | None = None,
    details: Sequence[Any] | None = None,
) -> APIError:
    """Build the :class:`APIError` subclass that matches a Connect code string."""
    cls = _CODE_CLASSES.get(code, APIError)
    if cls is FailedPreconditionError and "already in progress" in message:
        cls = HotLoadInProgressError
    return cls(code, message, http_status=http_status, details=details)


# --------------------------------------------------------------------- lifecycle


class LifecycleError(CWTrainError):
    """Waiting for, or deleting, a deployment or gateway did not succeed."""


# ---------------------------------------------------------------------- snapshot


class SnapshotError(CWTrainError):
    """A snapshot is malformed, inconsistent, or cannot be published as asked."""


class SnapshotNotFoundError(SnapshotError, FileNotFoundError):
    """A snapshot directory or one of its files is missing."""


class SnapshotChecksumError(SnapshotError):
    """A tensor's Adler-32 or an object's SHA-256 does not match what was recorded."""


class SnapshotConflictError(SnapshotError):
    """The identity already holds objects that differ from this snapshot.

    Attributes:
        identity: the snapshot identity.
        conflicts: one line per conflicting key.
    """

    def __init__(self, identity: str, conflicts: Iterable[str]) -> None:
        self.identity = identity
        self.conflicts = list(conflicts)
        shown = "; ".join(self.conflicts[:3])
        more = len(self.conflicts) - 3
        if more > 0:
            shown += f"; and {more} more"
        super().__init__(
            f"snapshot identity {identity!r} already holds different objects ({shown}); "
            "identities are immutable: publish under a new identity"
        )


_ACCESS_HELP = (
    "the trainer needs s3:ListBucket, s3:GetObject, s3:PutObject and "
    "s3:AbortMultipartUpload on the hot-load prefix, granted by the organization access "
    "policy and not denied by the bucket policy"
)


class SnapshotAccessError(SnapshotError):
    """The object store refused a call of the permission check.

    Attributes:
        uri: ``s3://bucket/prefix/`` that was checked.
        action: the S3 permission the refused call needs (``s3:PutObject``, ...).
        code: the S3 error code, or ``"?"``.
    """

    def __init__(self, uri: str, action: str, code: str, *, upload_id: str | None = None) -> None:
        self.uri = uri
        self.action = action
        self.code = code
        self.upload_id = upload_id
        text = f"{action} refused on {uri} ({code}); {_ACCESS_HELP}"
        if upload_id:
            text += f"; multipart upload {upload_id} is still open, abort it"
        super().__init__(text)


class MirrorError(SnapshotError):
    """The trainer's byte-exact copy of the served weights is missing or inconsistent."""


# ---------------------------------------------------------------------- hot-load


class HotLoadError(CWTrainError):
    """A hot-load did not end as asked."""


def _replica_reasons(replicas: Sequence[Any]) -> str:
    reasons = []
    for replica in replicas:
        reason = getattr(replica, "error_reason", None)
        if reason:
            reasons.append(f"{getattr(replica, 'name', '?')}: {reason}")
    return "; ".join(reasons[:5])


class HotLoadFailedError(HotLoadError):
    """The hot-load ended FAILED or CANCELED.

    Attributes:
        hot_load: the final hot-load.
        replicas: the replicas as last listed.
    """

    def __init__(self, hot_load: Any, replicas: Sequence[Any] = (), message: str | None = None) -> None:
        self.hot_load = hot_load
        self.replicas = list(replicas)
        if message is None:
            state = getattr(getattr(hot_load, "state", None), "name", None) or "FAILED"
            ident = getattr(hot_load, "identity", "?")
            message = f"hot-load {getattr(hot_load, 'id', '?')} of {ident!r} ended {state}"
            reasons = _replica_reasons(self.replicas)
            if reasons:
                message += f": {reasons}"
        super().__init__(message)


class HotLoadVerificationError(HotLoadError):
    """The hot-load completed but the replicas do not all serve its identity."""

    def __init__(self, hot_load: Any, replicas: Sequence[Any], problems: Sequence[str]) -> None:
        self.hot_load = hot_load
        self.replicas = list(replicas)
        self.problems = list(problems)
        super().__init__(
            f"hot-load {getattr(hot_load, 'id', '?')} completed but not every replica serves "
            f"{getattr(hot_load, 'identity', '?')!r}: " + "; ".join(self.problems[:5])
        )


class HotLoadTimeoutError(HotLoadError):
    """The time budget ran out before the hot-load ended.

    The hot-load exists: unless it ended, the message says it is still running and may still
    go live, and how to follow it (``cwtrain hotload wait <id>``).
    """

    def __init__(self, hot_load: Any, replicas: Sequence[Any], timeout: float) -> None:
        self.hot_load = hot_load
        self.replicas = list(replicas)
        self.timeout = timeout
        ready = sum(1 for r in self.replicas if getattr(getattr(r, "state", None), "name", "") == "READY")
        hot_load_id = getattr(hot_load, "id", "?")
        message = (
            f"hot-load {hot_load_id} of {getattr(hot_load, 'identity', '?')!r} "
            f"did not finish within {timeout:g}s ({ready}/{len(self.replicas)} replicas ready)"
        )
        if not getattr(hot_load, "terminal", False):
            state = getattr(getattr(hot_load, "state", None), "name", None) or "unfinished"
            message += (
                f"; it was created and is still {state}: it may still go live (follow it with "
                f"`cwtrain hotload wait {hot_load_id}`)"
            )
        super().__init__(message)


class PublishTimeoutError(HotLoadError):
    """The time budget ran out before any hot-load was created: nothing was created on the caller's behalf.

    Attributes:
        identity: the snapshot identity.
        timeout: the budget, in seconds.
        stage: what was running (``"upload"``, ``"create"``).
    """

    def __init__(self, identity: str, timeout: float, stage: str, reason: str = "") -> None:
        self.identity = identity
        self.timeout = timeout
        self.stage = stage
        if stage == "upload":
            what = "while its snapshot was uploaded"
            after = (
                "; the objects stored so far stay and its unfinished multipart uploads are left to resume: "
                f"publishing {identity!r} again continues them"
            )
        else:
            what = "before its hot-load was created"
            after = f"; the snapshot stays stored: `cwtrain hotload trigger --identity {identity}` creates it"
        super().__init__(
            f"publishing {identity!r} did not finish within {timeout:g}s: the budget ran out {what}"
            + (f" ({reason})" if reason else "")
            + "; no hot-load was created"
            + after
        )


# ----------------------------------------------------------------------- rollout


class RolloutError(CWTrainError):
    """Sampling from the OpenAI-compatible completions endpoint failed."""


#: Shortest value masked as a secret (masking one-letter values would garble every message).
MIN_SECRET_LENGTH = 8

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]*@")
_CREDENTIAL_PATTERNS = (
    # "Bearer <token>" in a header or a message
    re.compile(r"\b(Bearer)(\s+|%20|\+)[A-Za-z0-9._~+/=-]{8,}"),
    # presigned URLs and request logs: X-Amz-Credential=..., X-Amz-Signature=..., X-Amz-Security-Token=...
    re.compile(r"(?i)\b(x-amz-(?:credential|signature|security-token)\s*[=:])\s*[^&\s,;'\"]+"),
    # a SigV4 Authorization header: Credential=<key id>/..., Signature=<hex>
    re.compile(r"\b(Credential=|Signature=)[^,\s'\"]+"),
)


def mask_url_userinfo(text: str) -> str:
    """``https://user:password@host/`` → ``https://***@host/`` wherever a URL appears in ``text``."""
    return _USERINFO.sub(lambda m: m.group(1) + "***@", text)


def secret_forms(value: str) -> list[str]:
    """Every form a secret value can take in a message, longest first.

    The value itself and stripped of surrounding whitespace; its ``repr`` escapes
    (``str`` and ``bytes``: a trailing newline shows as ``\\n``); percent-encoded (a
    URL) and JSON-escaped. Forms shorter than :data:`MIN_SECRET_LENGTH` are left out.
    """
    forms = {value, value.strip()}
    for form in list(forms):
        forms.add(repr(form)[1:-1])
        try:
            forms.add(repr(form.encode("utf-8", "surrogateescape"))[2:-1])
        except UnicodeEncodeError:  # pragma: no cover - lone surrogates the codec refuses
            pass
        forms.add(quote(form, safe=""))
        forms.add(quote_plus(form, safe=""))
        forms.add(json.dumps(form)[1:-1])
    return sorted((f for f in forms if len(f) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every form of every secret (:func:`secret_forms`) replaced by ``***``.

    Also masked, whatever the secrets: the userinfo of any URL, ``Bearer`` credentials,
    and the credential, signature and session-token parts of S3 request signatures.
    """
    forms = sorted({f for value in secrets if value for f in secret_forms(value)}, key=len, reverse=True)
    for form in forms:
        text = text.replace(form, "***")
    text = mask_url_userinfo(text)
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + (m.group(2) if m.lastindex and m.lastindex > 1 else "") + "***", text)
    return text


def describe(error: BaseException, *, secrets: Mapping[str, str] | Iterable[str] | None = None) -> str:
    """One line for an error, with every form of the known secret values masked (:func:`mask_secrets`).

    Args:
        error: the exception.
        secrets: secret values (a mapping's values, e.g. ``{"API token": token}``, or any iterable).
    """
    values = secrets.values() if isinstance(secrets, Mapping) else (secrets or ())
    text = str(error) or type(error).__name__
    return " ".join(mask_secrets(text, values).split())

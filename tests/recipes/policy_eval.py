"""A small evaluator of AI Object Storage policies, for proving what a recipe's trainer may do.

The model (service-api.md section 11.5): organisation access policies are evaluated
first, then the bucket policy; default deny; an explicit ``Deny`` wins over any ``Allow``.

* A principal of the organisation needs an ``Allow`` from an organisation statement and
  no ``Deny`` there; when the bucket has a policy, the bucket policy must not ``Deny``
  and, unless the organisation-wide read statement or another statement allows it, must
  ``Allow`` too. ``s3:PutBucketPolicy`` (and the other policy actions) are checked against
  the organisation policies only.
* A principal of another organisation (the Dedicated Inference service) is allowed only
  by the bucket policy.

Organisation statements name resources without ARNs (``bucket``, ``bucket/prefix/*``) and
principals in short form (``role/<issuer>:<subject>``); bucket statements use
``arn:aws:s3:::`` resources, ``{"CW": [...]}`` / ``{"AWS": "*"}`` principals and the
``cw:PrincipalOrgID`` condition. ``*`` and ``?`` are wildcards in actions, resources and
principals, as in S3 policies.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

POLICY_ACTIONS = frozenset({"s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:GetBucketPolicy"})


@dataclass(frozen=True)
class Principal:
    """Who asks: its short-form name, its bucket-policy ARN (if any), and its organisation."""

    name: str
    org_id: str
    arn: str = ""


def _match(pattern: str, value: str) -> bool:
    return re.match(fnmatch.translate(pattern), value) is not None


def _any(patterns: Iterable[str], value: str) -> bool:
    return any(_match(p, value) for p in patterns)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _object_resource(bucket: str, key: str | None) -> str:
    return bucket if key is None else f"{bucket}/{key}"


# ----------------------------------------------------------------- organisation policies


def _org_statement_matches(statement: Mapping[str, Any], who: Principal, action: str, resource: str) -> bool:
    return (
        _any(_as_list(statement.get("principals")), who.name)
        and _any(_as_list(statement.get("actions")), action)
        and _any(_as_list(statement.get("resources")), resource)
    )


def org_decision(policies: Iterable[Mapping[str, Any]], who: Principal, action: str, resource: str) -> str:
    """``"deny"``, ``"allow"`` or ``"none"`` for one request under the organisation policies."""
    decision = "none"
    for policy in policies:
        for statement in policy.get("statements", []):
            if not _org_statement_matches(statement, who, action, resource):
                continue
            if statement.get("effect") == "Deny":
                return "deny"
            if statement.get("effect") == "Allow":
                decision = "allow"
    return decision


# ------------------------------------------------------------------------ bucket policy


def _bucket_principal_matches(principal: Any, who: Principal) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    for kind, values in principal.items():
        for value in _as_list(values):
            if value == "*" or (kind == "CW" and (_match(value, who.arn) or _match(value, who.name))):
                return True
    return False


def _condition_holds(condition: Mapping[str, Any] | None, who: Principal) -> bool:
    for operator, tests in (condition or {}).items():
        if operator != "StringEquals":
            return False  # unknown operators never hold: the evaluator stays conservative
        for key, expected in tests.items():
            if key != "cw:PrincipalOrgID" or who.org_id not in _as_list(expected):
                return False
    return True


def bucket_decision(policy: Mapping[str, Any] | None, who: Principal, action: str, resource: str) -> str:
    """``"deny"``, ``"allow"`` or ``"none"`` for one request under a bucket policy."""
    if not policy:
        return "none"
    arn = f"arn:aws:s3:::{resource}"
    decision = "none"
    for statement in policy.get("Statement", []):
        if not (
            _bucket_principal_matches(statement.get("Principal"), who)
            and _any(_as_list(statement.get("Action")), action)
            and _any(_as_list(statement.get("Resource")), arn)
            and _condition_holds(statement.get("Condition"), who)
        ):
            continue
        if statement.get("Effect") == "Deny":
            return "deny"
        if statement.get("Effect") == "Allow":
            decision = "allow"
    return decision


# ------------------------------------------------------------------------------ both


@dataclass(frozen=True)
class Policies:
    """The organisation policies and the bucket policy of one bucket."""

    org_id: str
    organisation: tuple[Mapping[str, Any], ...]
    bucket: Mapping[str, Any] | None

    def allowed(self, who: Principal, action: str, bucket: str, key: str | None = None) -> bool:
        """Whether ``who`` may do ``action`` on ``bucket`` (or the object ``key`` in it)."""
        resource = _object_resource(bucket, key)
        if who.org_id == self.org_id:
            if org_decision(self.organisation, who, action, resource) != "allow":
                return False
            if action in POLICY_ACTIONS:
                return True  # checked against organisation policies only
            return bucket_decision(self.bucket, who, action, resource) == "allow" or self.bucket is None
        return bucket_decision(self.bucket, who, action, resource) == "allow"

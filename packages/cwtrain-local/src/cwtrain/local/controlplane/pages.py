"""Pagination of the local control plane's listings: page sizes and signed page tokens.

A listing sorts its rows, then asks for one page::

    pages = Paginator(organization_id="cwtrain-local")
    size = page_size(query_max_page_size)                 # 50 when absent or 0, at most 1000
    rows, next_token = pages.page(
        sorted_rows, size, query_page_token, kind="hotLoads", parent=deployment_id,
        cursor=lambda row: row.seq, after=lambda row, seen: row.seq < int(seen),
    )

A token carries the last row's cursor, the listing's kind, the parent filter and the
organisation, signed with a key of this process (HMAC-SHA256, 12 bytes); a token from
another listing, filter or process is refused with ``invalid_argument``, as the service
does. ``next_token`` is ``""`` on the last page.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cwtrain.jsondoc import load_json
from cwtrain.local.controlplane.resources import ServiceError

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "Paginator", "page_size"]

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000

Row = TypeVar("Row")


def page_size(raw: str | None) -> int:
    """``maxPageSize`` from a query: the default when absent or 0, capped at :data:`MAX_PAGE_SIZE`.

    Raises:
        ServiceError: ``invalid_argument`` for a non-integer or negative value.
    """
    if raw is None or raw.strip() == "":
        return DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise ServiceError("invalid_argument", f"maxPageSize: {raw!r} is not an integer") from None
    if size < 0:
        raise ServiceError("invalid_argument", f"maxPageSize: {size} must not be negative")
    if size == 0:
        return DEFAULT_PAGE_SIZE
    return min(size, MAX_PAGE_SIZE)


class Paginator:
    """Issues and opens the page tokens of one organisation's listings.

    Args:
        organization_id: the organisation every token is tied to.
        secret: the signing key (random per instance when ``None``).
    """

    def __init__(self, organization_id: str, secret: bytes | None = None) -> None:
        self.organization_id = organization_id
        self._secret = secret if secret is not None else os.urandom(16)

    def page(
        self,
        rows: Sequence[Row],
        size: int,
        page_token: str | None,
        *,
        kind: str,
        parent: str,
        cursor: Callable[[Row], Any],
        after: Callable[[Row, Any], bool],
    ) -> tuple[list[Row], str]:
        """The page of sorted ``rows`` that ``page_token`` asks for, and the next page's token.

        Args:
            rows: every row of the listing, in listing order.
            size: rows per page (:func:`page_size`).
            page_token: the token of the previous page (``None`` or empty: the first page).
            kind: the listing (``"hotLoads"``, ``"replicas"``).
            parent: the parent filter the listing was asked with (``""`` for none).
            cursor: the JSON-ready position of a row, stored in the token of the page it ends.
            after: whether a row comes after the stored position.

        Raises:
            ServiceError: ``invalid_argument`` for a token this paginator did not issue
                for ``kind`` and ``parent``.
        """
        start = 0
        if page_token:
            seen = self._open(page_token, kind, parent)
            start = next((i for i, row in enumerate(rows) if after(row, seen)), len(rows))
        page = list(rows[start : start + size])
        more = start + size < len(rows)
        return page, self._issue(kind, parent, cursor(page[-1])) if more else ""

    def _issue(self, kind: str, parent: str, cursor: Any) -> str:
        payload = json.dumps({"k": kind, "p": parent, "o": self.organization_id, "c": cursor}, separators=(",", ":"))
        raw = payload.encode()
        mac = hmac.new(self._secret, raw, hashlib.sha256).digest()[:12]
        return base64.urlsafe_b64encode(mac + raw).decode().rstrip("=")

    def _open(self, token: str, kind: str, parent: str) -> Any:
        try:
            blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            mac, raw = blob[:12], blob[12:]
            if not hmac.compare_digest(mac, hmac.new(self._secret, raw, hashlib.sha256).digest()[:12]):
                raise ValueError("bad signature")
            payload = load_json(raw)
        except (ValueError, TypeError):
            raise ServiceError("invalid_argument", "pageToken is not a token this service issued") from None
        if payload.get("k") != kind or payload.get("o") != self.organization_id:
            raise ServiceError("invalid_argument", "pageToken belongs to another listing")
        if payload.get("p") != parent:
            raise ServiceError(
                "invalid_argument", "pageToken was issued for another parent filter; repeat the first request's filter"
            )
        return payload.get("c")

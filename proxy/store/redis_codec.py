"""The Redis store's encodings: what the scripts are sent and how their replies are read.

The scripts allocate ids, so a row or summary is sent as JSON without its id
fields (the script splices them in) and an item id as a spec the script
resolves (see ``Specs``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import orjson

from proxy.store.base import (
    RequestRecord,
    SessionInfo,
    Storable,
    StoredItem,
    normalize_request,
    request_row,
)
from proxy.store.rows import shared_role

# A request row's fields that only the script knows (it allocates the ids).
_ID_FIELDS = ("session_id", "dropped_item_ids", "first_item_id", "last_item_id", "reply_item_id")
_ROW_FIELDS = tuple(
    request_row(
        RequestRecord("", "", "", "", None, False, 0),
        session_id=None,
        tenant="",
        session_key=None,
        dropped_item_ids=[],
        first_item_id=None,
        last_item_id=None,
        reply_item_id=None,
        created_at=0.0,
    )
)


class Specs:
    """How the script is told an item id: known here (``k<id>``) or its n-th stored (``s<n>``)."""

    def __init__(self, known: Sequence[int]) -> None:
        self.known = known
        self.parent = str(known[-1]) if known else ""

    def __call__(self, position: int) -> str:
        if position < len(self.known):
            return f"k{self.known[position]}"
        return f"s{position - len(self.known) + 1}"


# Longer suffixes (a history this instance has not cached) go first without
# their words: the script says which items are new, and only those are stemmed.
EAGER_WORDS = 4


# An item's recall index entry, "word:tf word:tf ..." ('' for none).
Words = Callable[[Mapping[str, Any]], str]


def quadruples(
    chain: Sequence[Storable],
    paths: Sequence[str],
    skip: int,
    now: float,
    wanted: Container[int] | None,
    index: Words | None,
) -> list[str | bytes | int]:
    """The count, then (path hash, tokens, item JSON, words) of each item after the first ``skip``.

    The words (``index``; none without one) are the item's recall index
    entry, written only if the item is new: computed for the n-th item sent
    (from 1) if ``n`` is ``wanted`` (all when None), else sent as '?' (not computed).
    """
    if index is None:
        wanted, index = None, _no_words
    elif wanted is None and len(chain) - skip > EAGER_WORDS:
        wanted = ()
    out: list[str | bytes | int] = [len(chain) - skip]
    for n, (m, path) in enumerate(zip(chain[skip:], paths[skip:], strict=True), start=1):
        item = [path, m.content_hash, m.role, m.token_count, m.status, now, m.message]
        words = index(m.message) if wanted is None or n in wanted else "?"
        out += (path, str(m.token_count or 0), orjson.dumps(item), words)
    return out


def _no_words(message: Mapping[str, Any]) -> str:
    return ""


def row_head(record: RequestRecord, tenant: str, key: str | None, created_at: float) -> bytes:
    """The request row's JSON without the id fields and closing brace (the script adds them)."""
    row = request_row(
        record,
        session_id=None,
        tenant=tenant,
        session_key=key,
        dropped_item_ids=[],
        first_item_id=None,
        last_item_id=None,
        reply_item_id=None,
        created_at=created_at,
    )
    for name in _ID_FIELDS:
        del row[name]
    return orjson.dumps(row)[:-1]


def row(data: bytes) -> dict[str, Any]:
    stored = orjson.loads(data)
    # The other backends' key order.
    return normalize_request({name: stored[name] for name in _ROW_FIELDS})


def check(out: list[Any], request: RequestRecord) -> None:
    if out[0] == b"dup":
        raise ValueError(f"request id already stored: {request.id!r}")


def items(out: list[bytes]) -> list[StoredItem]:
    """A chain script's answer, {session id, id, json, ...}, root first."""
    if not out:
        return []
    return chain_items(out, 1, int(out[0]), None)[0]


def chain_items(
    out: list[bytes], start: int, session_id: int, parent: int | None
) -> tuple[list[StoredItem], int]:
    """Items from ``out[start:]`` (id, json, ...), root first, the first a child of
    ``parent``; and their JSON's bytes."""
    items: list[StoredItem] = []
    size = 0
    for i in range(start, len(out), 2):
        item_id, data = int(out[i]), out[i + 1]
        path, content_hash, role, tokens, status, created, message = orjson.loads(data)
        role = shared_role(role, message)
        items.append(
            StoredItem(
                item_id, session_id, parent, path, content_hash, role, tokens, message, status,
                created,
            )
        )  # fmt: skip
        size += len(data)
        parent = item_id
    return items, size


def infos(out: list[bytes]) -> list[SessionInfo]:
    return [
        SessionInfo(
            id=int(out[i]),
            tenant=out[i + 1].decode(),
            key=out[i + 2].decode(),
            created_at=float(out[i + 3]),
            updated_at=float(out[i + 4]),
            head_item_id=int(out[i + 5]) if out[i + 5] else None,
            item_count=int(out[i + 6]),
            request_count=int(out[i + 8]),
            stored_tokens=int(out[i + 7]),
        )
        for i in range(0, len(out), 9)
    ]


def safe_url(url: str) -> str:
    """The URL without its password, for error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest

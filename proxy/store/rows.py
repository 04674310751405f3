"""Row shapes the SQL backends share: a request row as written; items, requests, summaries read.

SQLite and PostgreSQL keep the same columns; only their drivers differ, and
both hand back mapping-like rows. One definition here keeps them agreeing
exactly (the contract tests compare every field).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.store.base import (
    RequestRecord,
    SessionRef,
    StoredItem,
    StoredSummary,
    dropped_item_ids,
    normalize_request,
    request_row,
)


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def encoded_request(
    request: RequestRecord,
    session_id: int | None,
    created_at: float,
    *,
    session: SessionRef | None = None,
    item_ids: Sequence[int] = (),
    reply_id: int | None = None,
) -> dict[str, Any]:
    """The request's row, column name to value, its JSON columns as text."""
    row = request_row(
        request,
        session_id=session_id,
        tenant=session.tenant if session else request.tenant,
        session_key=session.key if session else request.session_key,
        dropped_item_ids=dropped_item_ids(request, item_ids),
        first_item_id=item_ids[0] if item_ids else None,
        last_item_id=item_ids[-1] if item_ids else None,
        reply_item_id=reply_id,
        created_at=created_at,
    )
    usage, detail = row.pop("usage"), row.pop("detail")
    row["usage_json"] = None if usage is None else dumps(usage)
    row["detail_json"] = dumps(detail)
    row["dropped_indexes"] = dumps(row["dropped_indexes"])
    row["dropped_item_ids"] = dumps(row["dropped_item_ids"])
    return row


def item_from_row(row: Any) -> StoredItem:
    columns = dict(row)
    message = orjson.loads(columns.pop("message_json"))
    # SQLite's chain position column (migration 7) is the recall index's, not the item's.
    columns.pop("pos", None)
    columns["role"] = shared_role(columns["role"], message)
    columns["status"] = sys.intern(columns["status"])
    return StoredItem(**columns, message=message)


def shared_role(column: str | None, message: dict[str, Any]) -> str:
    """An item's role from its row, as one string shared by the column and the message.

    A few distinct values on thousands of items a history cache may hold: one
    string each (interned) instead of one per item. SQLite keeps no role where
    the message has its own (``None``: proxy/store/sqlite_items.py).
    """
    role = sys.intern(message["role"] if column is None else column)
    if message.get("role") == role:
        message["role"] = role
    return role


def request_from_row(row: Any) -> dict[str, Any]:
    out = dict(row)
    usage = out.pop("usage_json")
    out["usage"] = None if usage is None else orjson.loads(usage)
    out["detail"] = orjson.loads(out.pop("detail_json"))
    dropped = out["dropped_indexes"]
    out["dropped_indexes"] = orjson.loads(dropped) if isinstance(dropped, str | bytes) else dropped
    out["stream"] = bool(out["stream"])
    out["incomplete"] = bool(out["incomplete"])
    return normalize_request(out)


def summary_from_row(row: Any) -> StoredSummary:
    columns = dict(row)
    usage = columns.pop("usage_json")
    return StoredSummary(
        **{k: v for k, v in columns.items() if not k.endswith("_json")},
        facts=orjson.loads(columns["facts_json"]),
        flagged=orjson.loads(columns["flagged_json"]),
        usage=None if usage is None else orjson.loads(usage),
    )


def copied(items: list[StoredItem] | tuple[StoredItem, ...]) -> list[StoredItem]:
    """A caller's own copies of cached items (a cached message is parsed once, then shared)."""
    return [replace(item, message=orjson.loads(orjson.dumps(item.message))) for item in items]

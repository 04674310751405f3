"""The SQLite store's write jobs: plain functions the writer runs inside its transaction.

Each takes the writer's connection last, so :class:`~proxy.store.sqlite.SqliteStore`
binds its arguments with ``functools.partial`` and hands the job to the writer;
a failing exchange is undone alone there (proxy/store/writer.py).
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from proxy.store.base import (
    ExchangeResult,
    MessageIn,
    RequestRecord,
    ResponseIn,
    SessionRef,
    Storable,
    chain_identity,
)
from proxy.store.chains import Prefix
from proxy.store.pruning import chain_up_sql, exclusive_suffix, references_sql
from proxy.store.rows import dumps, encoded_request
from proxy.store.sqlite_items import INSERT_ITEM, hex_sql, insert_values, packed
from proxy.store.sqlite_search import index_items

# Well under SQLite's bound-variable limit (999 on old builds).
CHUNK = 500
_PATH = hex_sql("path_hash")

_UPSERT_RESPONSE = """
    INSERT INTO responses (id, tenant, session_id, head_item_id, input_head_item_id,
        previous_response_id, model, status, response_json, created_at)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (tenant, id) DO UPDATE SET
        session_id = excluded.session_id, head_item_id = excluded.head_item_id,
        input_head_item_id = excluded.input_head_item_id,
        previous_response_id = excluded.previous_response_id, model = excluded.model,
        status = excluded.status, response_json = excluded.response_json,
        created_at = excluded.created_at
"""


def record(
    session: SessionRef | None,
    conversation: Sequence[Storable],
    reply: MessageIn | None,
    request: RequestRecord,
    prefix: Prefix | None,
    conn: sqlite3.Connection,
) -> ExchangeResult | None:
    now = time.time()
    created_at = request.created_at or now
    if session is None or prefix is None:
        session_id = None if session is None else _session_id(conn, session)
        insert_request(conn, request, session_id, created_at, session=session)
        return None if session_id is None else ExchangeResult(session_id, [], None, 0)

    chain = [*conversation, *([reply] if reply is not None else [])]
    session_id, head = _touch_session(conn, session, now)
    # Cached ids hold only if the session is the one they were stored in.
    known = prefix.known_ids if session_id == prefix.session_id else ()
    ids, missing = store_chain(conn, session_id, chain, prefix.path_hashes, now, known_ids=known)
    if ids[-1] != head:
        conn.execute("UPDATE sessions SET head_item_id = ? WHERE id = ?", (ids[-1], session_id))
    item_ids = ids[: len(conversation)]
    reply_id = ids[-1] if reply is not None else None
    insert_request(
        conn, request, session_id, created_at, session=session, item_ids=item_ids, reply_id=reply_id
    )
    new_messages = sum(1 for i in missing if i < len(conversation))
    return ExchangeResult(session_id, item_ids, reply_id, new_messages)


def _session_id(conn: sqlite3.Connection, session: SessionRef) -> int | None:
    row = conn.execute(
        "SELECT id FROM sessions WHERE tenant = ? AND key = ?", (session.tenant, session.key)
    ).fetchone()
    return None if row is None else int(row[0])


def _touch_session(
    conn: sqlite3.Connection, session: SessionRef, now: float
) -> tuple[int, int | None]:
    """The session's id and head, made if new, its ``updated_at`` now.

    What ``_upsert_session`` does, cheaper for a session that exists (the common
    case): one indexed update instead of a failed insert and an update, then one
    indexed read. Not ``UPDATE ... RETURNING``: that cost ~64K more instructions
    an exchange (callgrind, a store-level loop of bench/overhead.py's exchange).
    """
    where = (session.tenant, session.key)
    if conn.execute(_TOUCH, (now, *where)).rowcount:
        row = conn.execute(_SESSION_HEAD, where).fetchone()
        return int(row[0]), row[1]
    return _upsert_session(conn, session, now), None


_TOUCH = "UPDATE sessions SET updated_at = ? WHERE tenant = ? AND key = ?"
_SESSION_HEAD = "SELECT id, head_item_id FROM sessions WHERE tenant = ? AND key = ?"


def _upsert_session(conn: sqlite3.Connection, session: SessionRef, now: float) -> int:
    row = conn.execute(
        "INSERT INTO sessions (tenant, key, created_at, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (tenant, key) DO UPDATE SET updated_at = excluded.updated_at"
        " RETURNING id",
        (session.tenant, session.key, now, now),
    ).fetchone()
    if row is None:  # cannot happen: an upsert with RETURNING always yields its row
        raise RuntimeError("session upsert returned no row")
    return int(row[0])


def store_chain(
    conn: sqlite3.Connection,
    session_id: int,
    chain: Sequence[Storable],
    hashes: Sequence[str],
    now: float,
    *,
    known_ids: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """Item ids for the whole chain, inserting what is missing; and the missing positions.

    ``known_ids``: the ids of the chain's first items, known to be stored in
    this session (they need no lookup).
    """
    shared = len(known_ids)
    # One lookup for the rest of the chain: a resent history is mostly known.
    found = select_ids(conn, session_id, hashes[shared:]) if shared < len(hashes) else {}
    missing = [i for i in range(shared, len(hashes)) if hashes[i] not in found]
    if missing:
        # In chain order, so each parent exists by the time its child is inserted.
        # ``i``: the chain position (the recall index's ``pos``).
        rows = [
            insert_values(session_id, hashes[i - 1] if i else None, hashes[i], chain[i], now, i)
            for i in missing
        ]
        conn.executemany(INSERT_ITEM, rows)
        found.update(select_ids(conn, session_id, [hashes[i] for i in missing]))
        # The recall index, in the same transaction as its items.
        index_items(conn, [found[hashes[i]] for i in missing])
    return [*known_ids, *(found[h] for h in hashes[shared:])], missing


def select_ids(conn: sqlite3.Connection, session_id: int, hashes: Sequence[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for start in range(0, len(hashes), CHUNK):
        chunk = hashes[start : start + CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT {_PATH}, id FROM items WHERE session_id = ? AND path_hash IN ({marks})",
            (session_id, *map(packed, chunk)),
        )
        found.update({row[0]: row[1] for row in rows})
    return found


def insert_request(
    conn: sqlite3.Connection,
    request: RequestRecord,
    session_id: int | None,
    created_at: float,
    *,
    session: SessionRef | None = None,
    item_ids: Sequence[int] = (),
    reply_id: int | None = None,
) -> None:
    row = encoded_request(
        request, session_id, created_at, session=session, item_ids=item_ids, reply_id=reply_id
    )
    try:
        # Positional parameters: binding 31 of them by name costs a third more.
        conn.execute(_insert_request_sql(tuple(row)), tuple(row.values()))
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorname == "SQLITE_CONSTRAINT_PRIMARYKEY":
            raise ValueError(f"request id already stored: {request.id!r}") from exc
        raise


@functools.lru_cache(maxsize=8)
def _insert_request_sql(columns: tuple[str, ...]) -> str:
    marks = ", ".join("?" * len(columns))
    return f"INSERT INTO requests ({', '.join(columns)}) VALUES ({marks})"


def delete_rows(
    requests: str, sessions: str, params: tuple[Any, ...], conn: sqlite3.Connection
) -> list[int]:
    """Both deletes in one transaction; items and linked requests go by cascade."""
    conn.execute(requests, params)
    return [int(row[0]) for row in conn.execute(sessions, params).fetchall()]


def record_response(
    session: SessionRef,
    conversation: Sequence[Storable],
    output: Sequence[MessageIn],
    response: ResponseIn,
    request: RequestRecord,
    conn: sqlite3.Connection,
) -> ExchangeResult:
    now = time.time()
    created_at = request.created_at or now
    chain = [*conversation, *output]
    session_id, _ = _touch_session(conn, session, now)
    ids: list[int] = []
    missing: list[int] = []
    if chain:
        hashes, known = chain_identity(chain, session_id)
        ids, missing = store_chain(conn, session_id, chain, hashes, now, known_ids=known)
        conn.execute("UPDATE sessions SET head_item_id = ? WHERE id = ?", (ids[-1], session_id))
    item_ids = ids[: len(conversation)]
    reply_id = ids[-1] if output else None
    conn.execute(
        _UPSERT_RESPONSE,
        (
            response.id,
            session.tenant,
            session_id,
            ids[-1] if ids else None,
            item_ids[-1] if item_ids else None,
            response.previous_response_id,
            response.model,
            response.status,
            dumps(response.response),
            created_at,
        ),
    )
    insert_request(
        conn, request, session_id, created_at, session=session, item_ids=item_ids, reply_id=reply_id
    )
    new_messages = sum(1 for i in missing if i < len(conversation))
    return ExchangeResult(
        session_id, item_ids, reply_id, new_messages, tuple(ids[len(conversation) :])
    )


_CHAIN_UP = chain_up_sql("?", by_parent=True)
_REFERENCES = references_sql("?1", "?2", "?3")


def delete_response(tenant: str, response_id: str, conn: sqlite3.Connection) -> bool:
    """The mapping and what only this response holds (proxy/store/pruning.py)."""
    found = conn.execute(
        "SELECT r.session_id, r.head_item_id, s.key, s.head_item_id FROM responses r"
        " JOIN sessions s ON s.id = r.session_id WHERE r.tenant = ? AND r.id = ?",
        (tenant, response_id),
    ).fetchone()
    if found is None:
        return False
    session_id, head, key, session_head = found
    conn.execute("DELETE FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id))
    conn.execute(
        "DELETE FROM requests WHERE tenant = ? AND session_key = ?"
        " AND json_extract(detail_json, '$.response_id') = ?",
        (tenant, key, response_id),
    )
    names = {"sid": session_id, "tenant": tenant, "key": key}
    references = {
        row[0] for row in conn.execute(_REFERENCES, (session_id, tenant, key)) if row[0] is not None
    }
    if session_head is not None and session_head != head:
        references.add(session_head)
    chain = {row[0]: (row[1], row[2]) for row in conn.execute(_CHAIN_UP, (head,))}
    gone = exclusive_suffix(
        head if head in chain else None,
        lambda i: chain[i][0],
        lambda i: chain[i][1],
        references,
    )
    for start in range(0, len(gone), CHUNK):
        chunk = gone[start : start + CHUNK]
        marks = ", ".join("?" * len(chunk))
        # The recall index's rows go by trigger (migration 5).
        conn.execute(
            f"DELETE FROM summaries WHERE session_id = ? AND covers_item_id IN ({marks})",
            (session_id, *chunk),
        )
        conn.execute(f"DELETE FROM items WHERE id IN ({marks})", chunk)
    if gone and session_head in gone:
        survivor = chain[gone[-1]][0]
        conn.execute("UPDATE sessions SET head_item_id = ? WHERE id = ?", (survivor, session_id))
    empty = conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM items WHERE session_id = :sid)"
        " AND NOT EXISTS (SELECT 1 FROM responses WHERE session_id = :sid)"
        " AND NOT EXISTS (SELECT 1 FROM requests WHERE tenant = :tenant AND session_key = :key)",
        names,
    ).fetchone()[0]
    if empty:
        conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    return True

"""The PostgreSQL store's writes: each a coroutine over one connection inside one transaction.

:class:`~proxy.store.postgres.PostgresStore` opens the transaction and hands
the connection in; everything an exchange writes (session, items, request
row) commits or rolls back together.

Concurrency across instances: the session's row is written first
(``INSERT .. ON CONFLICT DO UPDATE``), which takes its row lock, so writes to
one session are serialized by PostgreSQL until commit whatever instance makes
them; items are ``ON CONFLICT DO NOTHING`` on ``(session_id, path_hash)``, so
two writers of one history store each message once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from proxy.store.base import (
    ExchangeResult,
    FencedOut,
    MessageIn,
    RequestRecord,
    ResponseIn,
    SessionRef,
    Storable,
    StoredSummary,
    SummaryIn,
    chain_path_hashes,
)
from proxy.store.chains import Prefix
from proxy.store.pruning import chain_up_sql, exclusive_suffix, references_sql
from proxy.store.rows import dumps, encoded_request, summary_from_row
from proxy.store.search_text import search_text

Conn = Any  # asyncpg.Connection (or a pool's proxy of one); asyncpg ships no types

# The session's row, touched; with a fencing token ($4), raised to it in the same
# statement: ``fenced`` is false when the row held a newer token (nothing may be written).
_TOUCH_SESSION = """
    UPDATE sessions SET updated_at = $3, version = version + 1,
        fence = GREATEST(fence, COALESCE($4::bigint, 0))
    WHERE tenant = $1 AND key = $2
    RETURNING id, head_item_id, ($4::bigint IS NULL OR fence = $4::bigint) AS fenced
"""

_UPSERT_SESSION = """
    INSERT INTO sessions (tenant, key, created_at, updated_at, version) VALUES ($1, $2, $3, $3, 1)
    ON CONFLICT (tenant, key) DO UPDATE
        SET updated_at = EXCLUDED.updated_at, version = sessions.version + 1
    RETURNING id, head_item_id
"""

# The recall index (proxy/store/postgres_search.py) in the same row: position and text.
_INSERT_ITEM = """
    INSERT INTO items (session_id, parent_id, path_hash, content_hash, role,
        token_count, status, message_json, created_at, position, search)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, to_tsvector('ctx_english', $11))
    ON CONFLICT (session_id, path_hash) DO NOTHING
    RETURNING id
"""

_SELECT_IDS = (
    "SELECT path_hash, id FROM items WHERE session_id = $1 AND path_hash = ANY($2::text[])"
)

_UPSERT_RESPONSE = """
    INSERT INTO responses (id, tenant, session_id, head_item_id, input_head_item_id,
        previous_response_id, model, status, response_json, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (tenant, id) DO UPDATE SET
        session_id = EXCLUDED.session_id, head_item_id = EXCLUDED.head_item_id,
        input_head_item_id = EXCLUDED.input_head_item_id,
        previous_response_id = EXCLUDED.previous_response_id, model = EXCLUDED.model,
        status = EXCLUDED.status, response_json = EXCLUDED.response_json,
        created_at = EXCLUDED.created_at
"""

REQUEST_COLUMNS = (
    "id, session_id, tenant, session_key, endpoint, route, policy, mode, model, stream,"
    " status, upstream_status, messages_before, messages_after, tokens_before, tokens_after,"
    " turns_dropped, messages_dropped, dropped_indexes, dropped_item_ids, reason, error,"
    " incomplete, upstream_ms, total_ms, usage_json, detail_json, first_item_id,"
    " last_item_id, reply_item_id, created_at,"
    " upstream_prompt_tokens, cached_tokens, cache_write_tokens, stable_prefix"
)
_REQUEST_NAMES = tuple(name.strip() for name in REQUEST_COLUMNS.split(","))
_INSERT_REQUEST = (
    f"INSERT INTO requests ({REQUEST_COLUMNS}) VALUES ("
    + ", ".join(f"${i}" for i in range(1, len(_REQUEST_NAMES) + 1))
    + ")"
)
# $2 is the row's session_id; the next parameter after the row's, the new head.
_INSERT_REQUEST_MOVING_HEAD = (
    f"WITH head AS (UPDATE sessions SET head_item_id = ${len(_REQUEST_NAMES) + 1}"
    " WHERE id = $2) " + _INSERT_REQUEST
)

_INSERT_SUMMARY = """
    INSERT INTO summaries (session_id, covers_item_id, covers_path_hash, start_unit,
        previous_summary_id, text, facts_json, flagged_json, model, prompt_hash, usage_json,
        created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
    ON CONFLICT (session_id, covers_path_hash, start_unit) DO NOTHING
"""


_FENCE = "UPDATE sessions SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING id"


async def record(
    conn: Conn,
    session: SessionRef | None,
    conversation: Sequence[Storable],
    reply: MessageIn | None,
    request: RequestRecord,
    prefix: Prefix | None,
) -> ExchangeResult | None:
    now = time.time()
    created_at = request.created_at or now
    if session is None or prefix is None:
        session_id = None
        if session is not None:
            session_id = await conn.fetchval(
                "SELECT id FROM sessions WHERE tenant = $1 AND key = $2",
                session.tenant,
                session.key,
            )
        await insert_request(conn, request, session_id, created_at, session=session)
        return None if session_id is None else ExchangeResult(session_id, [], None, 0)

    chain = [*conversation, *([reply] if reply is not None else [])]
    fence = request.detail.get("fence")
    token = fence if isinstance(fence, int) and not isinstance(fence, bool) else None
    row = await conn.fetchrow(_TOUCH_SESSION, session.tenant, session.key, now, token)
    fenced = row is None or row[2]
    if row is None:
        row = await conn.fetchrow(_UPSERT_SESSION, session.tenant, session.key, now)
        fenced = token is None or await conn.fetchval(_FENCE, row[0], token) is not None
    session_id, head = row[0], row[1]
    if not fenced:
        raise FencedOut(
            f"session lock lost: fencing token {token} is older than the session's;"
            " the exchange is not stored"
        )
    known = prefix.known_ids if session_id == prefix.session_id else ()
    ids, missing = await store_chain(
        conn, session_id, chain, prefix.path_hashes, now, known_ids=known
    )
    item_ids = ids[: len(conversation)]
    reply_id = ids[-1] if reply is not None else None
    # The head moves in the request row's statement: one round trip less.
    await insert_request(
        conn,
        request,
        session_id,
        created_at,
        session=session,
        item_ids=item_ids,
        reply_id=reply_id,
        new_head=ids[-1] if ids[-1] != head else None,
    )
    new_messages = sum(1 for i in missing if i < len(conversation))
    return ExchangeResult(session_id, item_ids, reply_id, new_messages)


async def store_chain(
    conn: Conn,
    session_id: int,
    chain: Sequence[Storable],
    hashes: Sequence[str],
    now: float,
    *,
    known_ids: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """Item ids for the whole chain, inserting what is missing; and the positions inserted.

    ``known_ids``: ids of the chain's first items, known to be stored in this session.
    """
    shared = len(known_ids)
    rest = list(hashes[shared:])
    found: dict[str, int] = {}
    if rest:
        # One lookup for the rest of the chain: a resent history is mostly known.
        found = {r[0]: r[1] for r in await conn.fetch(_SELECT_IDS, session_id, rest)}
    ids = list(known_ids)
    inserted: list[int] = []
    for i in range(shared, len(hashes)):
        item_id = found.get(hashes[i])
        if item_id is None:
            m = chain[i]
            item_id = await conn.fetchval(
                _INSERT_ITEM,
                session_id,
                ids[-1] if ids else None,
                hashes[i],
                m.content_hash,
                m.role,
                m.token_count,
                m.status,
                dumps(m.message),
                now,
                i,  # the chain starts at the root: its index is its depth
                search_text(m.message),
            )
            if item_id is None:
                # Another instance stored it between the lookup and now (it committed).
                item_id = await conn.fetchval(
                    "SELECT id FROM items WHERE session_id = $1 AND path_hash = $2",
                    session_id,
                    hashes[i],
                )
            else:
                inserted.append(i)
        ids.append(item_id)
    return ids, inserted


async def insert_request(
    conn: Conn,
    request: RequestRecord,
    session_id: int | None,
    created_at: float,
    *,
    session: SessionRef | None = None,
    item_ids: Sequence[int] = (),
    reply_id: int | None = None,
    new_head: int | None = None,
) -> None:
    """The request row; with ``new_head``, the session's head moves in the same statement."""
    row = encoded_request(
        request, session_id, created_at, session=session, item_ids=item_ids, reply_id=reply_id
    )
    values = [row[name] for name in _REQUEST_NAMES]
    try:
        if new_head is None:
            await conn.execute(_INSERT_REQUEST, *values)
        else:
            await conn.execute(_INSERT_REQUEST_MOVING_HEAD, *values, new_head)
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == "requests_pkey":
            raise ValueError(f"request id already stored: {request.id!r}") from exc
        raise


async def record_response(
    conn: Conn,
    session: SessionRef,
    conversation: Sequence[Storable],
    output: Sequence[MessageIn],
    response: ResponseIn,
    request: RequestRecord,
) -> ExchangeResult:
    now = time.time()
    created_at = request.created_at or now
    chain = [*conversation, *output]
    session_id = (await conn.fetchrow(_UPSERT_SESSION, session.tenant, session.key, now))[0]
    ids: list[int] = []
    missing: list[int] = []
    if chain:
        hashes = chain_path_hashes([m.content_hash for m in chain])
        ids, missing = await store_chain(conn, session_id, chain, hashes, now)
        await conn.execute(
            "UPDATE sessions SET head_item_id = $1 WHERE id = $2", ids[-1], session_id
        )
    item_ids = ids[: len(conversation)]
    reply_id = ids[-1] if output else None
    await conn.execute(
        _UPSERT_RESPONSE,
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
    )
    await insert_request(
        conn, request, session_id, created_at, session=session, item_ids=item_ids, reply_id=reply_id
    )
    new_messages = sum(1 for i in missing if i < len(conversation))
    return ExchangeResult(
        session_id, item_ids, reply_id, new_messages, tuple(ids[len(conversation) :])
    )


async def save_summary(
    conn: Conn, session: SessionRef, covered: Sequence[Storable], summary: SummaryIn
) -> StoredSummary:
    if not covered:
        raise ValueError("a summary must cover at least one item")
    now = time.time()
    # Created if new, but not "active": head and updated_at stay; the version moves
    # (a cached view of the session must learn of the summary).
    session_id = await conn.fetchval(
        "INSERT INTO sessions (tenant, key, created_at, updated_at, version)"
        " VALUES ($1, $2, $3, $3, 1)"
        " ON CONFLICT (tenant, key) DO UPDATE SET version = sessions.version + 1 RETURNING id",
        session.tenant,
        session.key,
        now,
    )
    hashes = chain_path_hashes([m.content_hash for m in covered])
    ids, _ = await store_chain(conn, session_id, covered, hashes, now)
    await conn.execute(
        _INSERT_SUMMARY,
        session_id,
        ids[-1],
        hashes[-1],
        summary.start_unit,
        summary.previous_summary_id,
        summary.text,
        dumps(list(summary.facts)),
        dumps(list(summary.flagged)),
        summary.model,
        summary.prompt_hash,
        None if summary.usage is None else dumps(summary.usage),
        now,
    )
    # The row for this range: the one just inserted, or the one that was there first.
    row = await conn.fetchrow(
        "SELECT * FROM summaries WHERE session_id = $1 AND covers_path_hash = $2"
        " AND start_unit = $3",
        session_id,
        hashes[-1],
        summary.start_unit,
    )
    return summary_from_row(row)


_CHAIN_UP = chain_up_sql("$1::bigint")
_REFERENCES = references_sql("$1", "$2", "$3")


async def delete_response(conn: Conn, tenant: str, response_id: str) -> bool:
    """The mapping and what only this response holds (proxy/store/pruning.py).

    The session's row is locked first (as every write does), so no exchange
    of the session can chain onto an item while it is being deleted.
    """
    found = await conn.fetchrow(
        "SELECT r.session_id, r.head_item_id FROM responses r WHERE r.tenant = $1 AND r.id = $2",
        tenant,
        response_id,
    )
    if found is None:
        return False
    session_id, head = found
    key, session_head = await conn.fetchrow(
        "UPDATE sessions SET version = version + 1 WHERE id = $1 RETURNING key, head_item_id",
        session_id,
    )
    deleted = await conn.fetch(
        "DELETE FROM responses WHERE tenant = $1 AND id = $2 AND session_id = $3 RETURNING id",
        tenant,
        response_id,
        session_id,
    )
    if not deleted:  # remapped or deleted meanwhile, before the session's lock was ours
        return False
    await conn.execute(
        "DELETE FROM requests WHERE tenant = $1 AND session_key = $2"
        " AND detail_json->>'response_id' = $3",
        tenant,
        key,
        response_id,
    )
    rows = await conn.fetch(_REFERENCES, session_id, tenant, key)
    references = {row[0] for row in rows if row[0] is not None}
    if session_head is not None and session_head != head:
        references.add(session_head)
    chain = {row[0]: (row[1], row[2]) for row in await conn.fetch(_CHAIN_UP, head)}
    gone = exclusive_suffix(
        head if head in chain else None,
        lambda i: chain[i][0],
        lambda i: chain[i][1],
        references,
    )
    if gone:
        # The recall index (the items' tsvector column) goes with its rows.
        await conn.execute(
            "DELETE FROM summaries WHERE session_id = $1 AND covers_item_id = ANY($2::bigint[])",
            session_id,
            gone,
        )
        await conn.execute("DELETE FROM items WHERE id = ANY($1::bigint[])", gone)
    if session_head in gone:
        await conn.execute(
            "UPDATE sessions SET head_item_id = $1 WHERE id = $2", chain[gone[-1]][0], session_id
        )
    empty = await conn.fetchval(
        "SELECT NOT EXISTS (SELECT 1 FROM items WHERE session_id = $1)"
        " AND NOT EXISTS (SELECT 1 FROM responses WHERE session_id = $1)"
        " AND NOT EXISTS (SELECT 1 FROM requests WHERE tenant = $2 AND session_key = $3)",
        session_id,
        tenant,
        key,
    )
    if empty:
        await conn.execute("DELETE FROM sessions WHERE id = $1", session_id)
    return True

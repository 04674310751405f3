"""Append-only schema migrations for the SQLite store.

``MIGRATIONS[n]`` is schema version ``n + 1``. Each is applied once, in its own
transaction, and recorded in ``schema_migrations``. Never edit a migration that
has shipped: append a new one instead, so every database converges on the same
schema whatever version it started from.

Tables keep queryable columns next to the raw JSON (like simonw/llm): the
columns serve listing and analysis, the JSON is the message exactly as it came.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

MIGRATIONS: tuple[str, ...] = (
    # 1: sessions, the item tree, one row per proxied request.
    """
    -- AUTOINCREMENT: ids are never reused after a delete, so an id held
    -- anywhere (a cache, a log line, another process) never names another row.
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tenant TEXT NOT NULL,
        key TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        -- No foreign key: sessions and items would reference each other and a
        -- cascading delete would trip over the cycle. Written in the same
        -- transaction as the item it names.
        head_item_id INTEGER,
        UNIQUE (tenant, key)
    );
    CREATE INDEX sessions_updated_at ON sessions (updated_at);
    CREATE INDEX sessions_tenant_updated_at ON sessions (tenant, updated_at);

    CREATE TABLE items (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        -- No foreign key: items only ever go with their whole session, and a
        -- self-reference would make that cascade quadratic without another index.
        parent_id INTEGER,
        path_hash TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        role TEXT NOT NULL,
        token_count INTEGER,
        status TEXT NOT NULL,
        message_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (session_id, path_hash)
    );
    CREATE INDEX items_session_parent ON items (session_id, parent_id);

    CREATE TABLE requests (
        id TEXT PRIMARY KEY,
        session_id INTEGER REFERENCES sessions (id) ON DELETE CASCADE,
        tenant TEXT NOT NULL,
        session_key TEXT,
        endpoint TEXT NOT NULL,
        route TEXT NOT NULL,
        policy TEXT NOT NULL,
        mode TEXT,
        model TEXT,
        stream INTEGER NOT NULL,
        status INTEGER NOT NULL,
        upstream_status INTEGER,
        messages_before INTEGER NOT NULL,
        messages_after INTEGER NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after INTEGER NOT NULL,
        turns_dropped INTEGER NOT NULL,
        messages_dropped INTEGER NOT NULL,
        dropped_indexes TEXT NOT NULL,
        dropped_item_ids TEXT NOT NULL,
        reason TEXT,
        error TEXT,
        incomplete INTEGER NOT NULL,
        upstream_ms REAL,
        total_ms REAL,
        usage_json TEXT,
        detail_json TEXT NOT NULL,
        first_item_id INTEGER,
        last_item_id INTEGER,
        reply_item_id INTEGER,
        created_at REAL NOT NULL
    );
    CREATE INDEX requests_session_created ON requests (session_id, created_at);
    -- A failed first call has no session row yet; its request is found by name.
    CREATE INDEX requests_tenant_key_created ON requests (tenant, session_key, created_at);
    """,
    # 2: Responses API: response id -> its session and the ends of its item chain.
    """
    -- Every stored response has a session: the client's, the one inherited from
    -- its previous response, or the synthetic ``resp:<id>`` of its chain's first
    -- response. Deleting the session deletes its responses.
    CREATE TABLE responses (
        id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        -- The chain's end: the response's last output item (its last input
        -- item when it produced none). No foreign key, as for sessions.head_item_id.
        head_item_id INTEGER,
        -- The last item the response was given (what input_items lists up to).
        input_head_item_id INTEGER,
        previous_response_id TEXT,
        model TEXT,
        status TEXT NOT NULL,
        response_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        UNIQUE (tenant, id)
    );
    CREATE INDEX responses_session ON responses (session_id);
    -- Another tenant's id is refused, not passed through: found by id alone.
    CREATE INDEX responses_id ON responses (id);
    """,
    # 3: summaries: views over the stored chain, each covering the items up to one.
    """
    -- A summary covers the chain from the root to covers_item_id, minus the
    -- first start_unit turns (kept verbatim). Path hashes identify that item
    -- in any client's resent history, so a later request over the same
    -- history finds it. One summary per range: the first stored wins.
    CREATE TABLE summaries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        -- No foreign keys to items or summaries: they only go with the session.
        covers_item_id INTEGER NOT NULL,
        covers_path_hash TEXT NOT NULL,
        start_unit INTEGER NOT NULL,
        -- The summary this one extends (made from it plus the turns after it).
        previous_summary_id INTEGER,
        text TEXT NOT NULL,
        facts_json TEXT NOT NULL,
        -- Entities the summary states that its source never mentions.
        flagged_json TEXT NOT NULL,
        model TEXT,
        prompt_hash TEXT,
        usage_json TEXT,
        created_at REAL NOT NULL,
        UNIQUE (session_id, covers_path_hash, start_unit)
    );
    """,
    # 4: prompt caching: the upstream's own cache figures and the stable prefix.
    """
    -- As the upstream reported them (usage), NULL when it did not.
    ALTER TABLE requests ADD COLUMN upstream_prompt_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN cached_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN cache_write_tokens INTEGER;
    -- Leading forwarded messages identical to the session's previous request's.
    ALTER TABLE requests ADD COLUMN stable_prefix INTEGER;
    """,
    # 5: the recall index (see proxy/store/sqlite_search.py). FTS5 over each item's
    # searchable text: ``scope`` holds one token naming the session (s<id>), so a
    # query is confined to one session by the index itself; ``pos`` is the item's
    # position in its chain (its depth from the root). Kept in step with items:
    # rows are written in the transaction that stores their item, and go with it.
    # Existing items are indexed here (the text the same as search_text.py's,
    # in SQL: message content, text parts, tool calls, Responses arguments and output).
    """
    CREATE VIRTUAL TABLE items_fts USING fts5 (
        scope, body, pos UNINDEXED, tokenize = 'porter unicode61'
    );
    CREATE TRIGGER items_fts_delete AFTER DELETE ON items BEGIN
        DELETE FROM items_fts WHERE rowid = old.id;
    END;
    INSERT INTO items_fts (rowid, scope, body, pos)
    WITH RECURSIVE depth (id, session_id, pos) AS (
        SELECT id, session_id, 0 FROM items WHERE parent_id IS NULL
        UNION ALL
        SELECT i.id, i.session_id, depth.pos + 1 FROM items i
            JOIN depth ON i.session_id = depth.session_id AND i.parent_id = depth.id
    ),
    texts (id, session_id, pos, body) AS (
        SELECT i.id, i.session_id, depth.pos, trim(
            CASE json_type(i.message_json, '$.content')
                WHEN 'text' THEN json_extract(i.message_json, '$.content')
                WHEN 'array' THEN coalesce((
                    SELECT group_concat(json_extract(part.value, '$.text'), char(10))
                    FROM json_each(i.message_json, '$.content') AS part
                    WHERE json_type(part.value, '$.text') = 'text'), '')
                ELSE '' END
            || char(10) || coalesce((
                SELECT group_concat(
                    coalesce(json_extract(call.value, '$.function.name'), '') || ' '
                    || coalesce(json_extract(call.value, '$.function.arguments'), ''),
                    char(10))
                FROM json_each(i.message_json, '$.tool_calls') AS call
                WHERE json_type(i.message_json, '$.tool_calls') = 'array'), '')
            || char(10) || CASE WHEN json_type(i.message_json, '$.arguments') = 'text'
                THEN coalesce(json_extract(i.message_json, '$.name'), '') || ' '
                    || json_extract(i.message_json, '$.arguments') ELSE '' END
            || char(10) || CASE WHEN json_type(i.message_json, '$.output') = 'text'
                THEN json_extract(i.message_json, '$.output') ELSE '' END,
            char(10) || ' ')
        FROM items i JOIN depth ON depth.id = i.id
        WHERE json_valid(i.message_json)
    )
    SELECT id, 's' || session_id, body, pos FROM texts WHERE body != '';
    """,
    # 6: semantic recall: each item's embedding (see proxy/store/sqlite_vectors.py),
    # written in the background after the item is stored. ``seq`` orders them as
    # they were written (one writer at a time), so a reader's cursor only ever
    # misses what is written after it read. They go with their item (and so
    # with the session); existing items get theirs when a request next needs them.
    """
    CREATE TABLE item_vectors (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        item_id INTEGER NOT NULL UNIQUE REFERENCES items (id) ON DELETE CASCADE,
        session_id INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        vector BLOB NOT NULL
    );
    CREATE INDEX item_vectors_session_seq ON item_vectors (session_id, seq);
    """,
    # 7: the recall index without its own copy of the text (it was half of what a
    # stored message took). ``items_fts`` becomes an external-content FTS5 table over
    # the view ``items_fts_source``, whose ``body`` is the searchable text computed
    # from ``message_json`` (the same expression as version 5) and whose ``pos`` is
    # the item's chain position, now a column of ``items`` (filled from the old index).
    # Rows are indexed from the view and deleted through it (before their item goes),
    # so what is removed is exactly what was indexed.
    """
    ALTER TABLE items ADD COLUMN pos INTEGER;
    UPDATE items SET pos = (SELECT f.pos FROM items_fts f WHERE f.rowid = items.id);
    CREATE VIEW items_fts_source (id, scope, body, pos) AS
        SELECT i.id, 's' || i.session_id,
            CASE WHEN json_valid(i.message_json) THEN trim(
            CASE json_type(i.message_json, '$.content')
                WHEN 'text' THEN json_extract(i.message_json, '$.content')
                WHEN 'array' THEN coalesce((
                    SELECT group_concat(json_extract(part.value, '$.text'), char(10))
                    FROM json_each(i.message_json, '$.content') AS part
                    WHERE json_type(part.value, '$.text') = 'text'), '')
                ELSE '' END
            || char(10) || coalesce((
                SELECT group_concat(
                    coalesce(json_extract(call.value, '$.function.name'), '') || ' '
                    || coalesce(json_extract(call.value, '$.function.arguments'), ''),
                    char(10))
                FROM json_each(i.message_json, '$.tool_calls') AS call
                WHERE json_type(i.message_json, '$.tool_calls') = 'array'), '')
            || char(10) || CASE WHEN json_type(i.message_json, '$.arguments') = 'text'
                THEN coalesce(json_extract(i.message_json, '$.name'), '') || ' '
                    || json_extract(i.message_json, '$.arguments') ELSE '' END
            || char(10) || CASE WHEN json_type(i.message_json, '$.output') = 'text'
                THEN json_extract(i.message_json, '$.output') ELSE '' END,
            char(10) || ' ') ELSE '' END,
            i.pos
        FROM items i;
    DROP TRIGGER items_fts_delete;
    DROP TABLE items_fts;
    CREATE VIRTUAL TABLE items_fts USING fts5 (
        scope, body, pos UNINDEXED, content = 'items_fts_source', content_rowid = 'id',
        tokenize = 'porter unicode61'
    );
    INSERT INTO items_fts (rowid, scope, body, pos)
        SELECT id, scope, body, pos FROM items_fts_source WHERE body != '' AND pos IS NOT NULL;
    CREATE TRIGGER items_fts_delete BEFORE DELETE ON items BEGIN
        INSERT INTO items_fts (items_fts, rowid, scope, body, pos)
            SELECT 'delete', id, scope, body, pos FROM items_fts_source
            WHERE id = old.id AND body != '' AND pos IS NOT NULL;
    END;
    """,
    # 8: the recall index with one namespace per session (see proxy/store/sqlite_search.py).
    # Each word of an item's searchable text is indexed as ``s<session id>_<word>``, and
    # every indexed item holds the token ``s<session id>_``, so a term's doclist is the
    # session's own (it was every session's, merged with the session's ``scope``
    # doclist on each query). The view puts a space for each separator of chat text
    # (``_`` included, which ``tokenchars`` makes part of a token), then the prefix
    # before every word; a word after a separator not listed is indexed without it
    # and found by no query. ``body`` is NULL for an item without text: its row adds
    # nothing to the index and its delete removes nothing. ``detail = none``: rowids
    # only (search never read positions); ``columnsize = 0``: no lengths (BM25 is
    # computed in Python from items.token_count). Indexed and deleted through the
    # view, as in version 7.
    """
    DROP TRIGGER items_fts_delete;
    DROP TABLE items_fts;
    DROP VIEW items_fts_source;
    CREATE VIEW items_fts_source (id, body) AS
        SELECT id, 's' || session_id || '_'
            || replace(' ' || nullif(t, ''), ' ', ' s' || session_id || '_')
        FROM (SELECT id, session_id,
            replace(replace(replace(replace(replace(replace(replace(replace(
            replace(replace(replace(replace(replace(replace(replace(replace(
            replace(t,
            char(191), ' '), char(65292), ' '), char(12290), ' '), char(12289), ' '),
            char(65281), ' '), char(65311), ' '), char(65306), ' '), char(65307), ' '),
            char(65288), ' '), char(65289), ' '), char(12300), ' '), char(12301), ' '),
            char(12302), ' '), char(12303), ' '), char(12304), ' '), char(12305), ' '),
            char(12539), ' ') AS t
        FROM (SELECT id, session_id,
            replace(replace(replace(replace(replace(replace(replace(replace(
            replace(replace(replace(replace(replace(replace(replace(replace(t,
            '#', ' '), '@', ' '), '~', ' '), '`', ' '), char(8217), ' '), char(8216), ' '),
            char(8220), ' '), char(8221), ' '), char(8212), ' '), char(8211), ' '),
            char(8230), ' '), char(171), ' '), char(187), ' '), char(8226), ' '), char(183), ' '),
            char(161), ' ') AS t
        FROM (SELECT id, session_id,
            replace(replace(replace(replace(replace(replace(replace(replace(
            replace(replace(replace(replace(replace(replace(replace(replace(t,
            '[', ' '), ']', ' '), '{', ' '), '}', ' '), '<', ' '), '>', ' '), '/', ' '), '|', ' '),
            '-', ' '), '+', ' '), '=', ' '), '*', ' '), '&', ' '), '^', ' '), '%', ' '),
            '$', ' ') AS t
        FROM (SELECT id, session_id,
            replace(replace(replace(replace(replace(replace(replace(replace(
            replace(replace(replace(replace(replace(replace(replace(replace(t,
            char(9), ' '), char(10), ' '), char(13), ' '), char(160), ' '), char(92), ' '),
            '_', ' '), '.', ' '), ',', ' '), ';', ' '), ':', ' '), '!', ' '), '?', ' '),
            '''', ' '), '"', ' '), '(', ' '), ')', ' ') AS t
        FROM (SELECT i.id, i.session_id, CASE WHEN json_valid(i.message_json) THEN trim(
            CASE json_type(i.message_json, '$.content')
                WHEN 'text' THEN json_extract(i.message_json, '$.content')
                WHEN 'array' THEN coalesce((
                    SELECT group_concat(json_extract(part.value, '$.text'), char(10))
                    FROM json_each(i.message_json, '$.content') AS part
                    WHERE json_type(part.value, '$.text') = 'text'), '')
                ELSE '' END
            || char(10) || coalesce((
                SELECT group_concat(
                    coalesce(json_extract(call.value, '$.function.name'), '') || ' '
                    || coalesce(json_extract(call.value, '$.function.arguments'), ''),
                    char(10))
                FROM json_each(i.message_json, '$.tool_calls') AS call
                WHERE json_type(i.message_json, '$.tool_calls') = 'array'), '')
            || char(10) || CASE WHEN json_type(i.message_json, '$.arguments') = 'text'
                THEN coalesce(json_extract(i.message_json, '$.name'), '') || ' '
                    || json_extract(i.message_json, '$.arguments') ELSE '' END
            || char(10) || CASE WHEN json_type(i.message_json, '$.output') = 'text'
                THEN json_extract(i.message_json, '$.output') ELSE '' END,
            char(10) || ' ') ELSE '' END AS t
        FROM items i WHERE i.pos IS NOT NULL)))));
    CREATE VIRTUAL TABLE items_fts USING fts5 (
        body, content = 'items_fts_source', content_rowid = 'id',
        detail = none, columnsize = 0, tokenize = 'porter unicode61 tokenchars ''_'''
    );
    INSERT INTO items_fts (rowid, body) SELECT id, body FROM items_fts_source;
    CREATE TRIGGER items_fts_delete BEFORE DELETE ON items BEGIN
        INSERT INTO items_fts (items_fts, rowid, body)
            SELECT 'delete', id, body FROM items_fts_source WHERE id = old.id;
    END;
    """,
    # 9: items in fewer bytes (a stored message was 1.33x its JSON). The two hashes as
    # their 16 bytes (BLOB), not 32 hex digits: 32 bytes less a row, 16 less an entry of
    # the (session_id, path_hash) index. ``role`` and ``status`` become virtual generated
    # columns, computed when read and stored nowhere: ``kind`` holds the item's role only
    # where the message's JSON has another or none (a Responses item's type; NULL: the
    # message's own), ``incomplete`` the status (0 or 1, which SQLite stores in no bytes).
    # Any other string, which a content hash may be, stays text. The index of children
    # is on parent_id alone: an item id names one item in any session, so the session
    # was redundant there, and ids grow, so its pages fill (they were half empty). The
    # table is rebuilt with its ids (every reference to an item, the recall index and
    # the vectors stay valid) and its AUTOINCREMENT counter (ids of deleted items are
    # still never reused), with foreign keys off (see FOREIGN_KEYS_OFF): dropping the
    # old table must not cascade to item_vectors. A status other than the two fails the
    # migration (NOT NULL) rather than lose it.
    """
    DROP TRIGGER items_fts_delete;
    CREATE TABLE items_v9 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        parent_id INTEGER,
        path_hash BLOB NOT NULL,
        content_hash BLOB NOT NULL,
        kind TEXT,
        token_count INTEGER,
        incomplete INTEGER NOT NULL,
        message_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        pos INTEGER,
        role TEXT GENERATED ALWAYS AS (coalesce(kind, CASE WHEN json_valid(message_json)
            THEN json_extract(message_json, '$.role') END)) VIRTUAL,
        status TEXT GENERATED ALWAYS AS (
            CASE incomplete WHEN 0 THEN 'complete' ELSE 'incomplete' END) VIRTUAL,
        UNIQUE (session_id, path_hash)
    );
    INSERT INTO sqlite_sequence (name, seq)
        SELECT 'items_v9', seq FROM sqlite_sequence WHERE name = 'items';
    INSERT INTO items_v9 (id, session_id, parent_id, path_hash, content_hash, kind,
        token_count, incomplete, message_json, created_at, pos)
        SELECT id, session_id, parent_id,
            CASE WHEN length(path_hash) = 32 AND path_hash NOT GLOB '*[^0-9a-f]*'
                THEN unhex(path_hash) ELSE path_hash END,
            CASE WHEN length(content_hash) = 32 AND content_hash NOT GLOB '*[^0-9a-f]*'
                THEN unhex(content_hash) ELSE content_hash END,
            CASE WHEN json_valid(message_json)
                AND json_type(message_json, '$.role') = 'text'
                AND json_extract(message_json, '$.role') = role THEN NULL ELSE role END,
            token_count, CASE status WHEN 'complete' THEN 0 WHEN 'incomplete' THEN 1 END,
            message_json, created_at, pos
        FROM items ORDER BY id;
    DROP TABLE items;
    ALTER TABLE items_v9 RENAME TO items;
    CREATE INDEX items_parent ON items (parent_id);
    CREATE TRIGGER items_fts_delete BEFORE DELETE ON items BEGIN
        INSERT INTO items_fts (items_fts, rowid, body)
            SELECT 'delete', id, body FROM items_fts_source WHERE id = old.id;
    END;
    """,
)

# Versions that rebuild a table others reference: applied with foreign keys off (a
# DROP TABLE would delete the referencing rows through ON DELETE CASCADE) and with
# the legacy rename (a view naming the table is left as it is, not checked against a
# schema that lacks the table for a moment), then checked by foreign_key_check.
FOREIGN_KEYS_OFF = frozenset({9})


def split_statements(script: str) -> list[str]:
    """Split a script into complete statements (``executescript`` would commit early)."""
    statements: list[str] = []
    buffer = ""
    for char in script:
        buffer += char
        if char == ";" and sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        # A last statement without its semicolon: keep it rather than drop it.
        statements.append(buffer.strip())
    return statements


async def migrate(conn: Any) -> list[int]:
    """Apply pending migrations on an aiosqlite connection in autocommit mode.

    Returns the versions applied now. Safe to run from several processes at
    once: each version is re-checked inside its write transaction.
    """
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations"
        " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    # SQLite before 3.41 has no unhex(); this one fails on anything but hex digits.
    await conn.create_function("unhex", 1, bytes.fromhex, deterministic=True)
    async with conn.execute("SELECT version FROM schema_migrations") as cursor:
        done = {row[0] for row in await cursor.fetchall()}
    applied: list[int] = []
    for version, script in enumerate(MIGRATIONS, start=1):
        if version in done:
            continue
        rebuild = version in FOREIGN_KEYS_OFF
        if rebuild:
            # Outside a transaction: SQLite ignores foreign_keys inside one.
            foreign_keys = await _pragma(conn, "foreign_keys")
            await conn.execute("PRAGMA foreign_keys = OFF")
            await conn.execute("PRAGMA legacy_alter_table = ON")
        try:
            if await _apply(conn, version, script, check_keys=rebuild):
                applied.append(version)
        finally:
            if rebuild:
                await conn.execute("PRAGMA legacy_alter_table = OFF")
                await conn.execute(f"PRAGMA foreign_keys = {int(foreign_keys)}")
    return applied


async def _apply(conn: Any, version: int, script: str, *, check_keys: bool) -> bool:
    """Apply one version in its own transaction; False if another process already had."""
    await conn.execute("BEGIN IMMEDIATE")
    try:
        # Re-checked inside the write transaction: another process may have applied it.
        async with conn.execute(
            "SELECT 1 FROM schema_migrations WHERE version = ?", (version,)
        ) as cursor:
            done = await cursor.fetchone() is not None
        if not done:
            for statement in split_statements(script):
                await conn.execute(statement)
            if check_keys:
                for table in ("items", "item_vectors"):
                    async with conn.execute(f"PRAGMA foreign_key_check({table})") as cursor:
                        if (broken := await cursor.fetchone()) is not None:
                            raise sqlite3.IntegrityError(
                                f"migration {version} broke a reference: {tuple(broken)}"
                            )
            await conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                (version, time.time()),
            )
        await conn.execute("COMMIT")
    except BaseException:
        # Undo the half-applied version whatever went wrong, then re-raise.
        await rollback(conn)
        raise
    return not done


async def _pragma(conn: Any, name: str) -> Any:
    async with conn.execute(f"PRAGMA {name}") as cursor:
        row = await cursor.fetchone()
    return row[0]


async def rollback(conn: Any) -> None:
    """Roll back if a transaction is open (some errors already ended it)."""
    if conn.in_transaction:
        await conn.execute("ROLLBACK")

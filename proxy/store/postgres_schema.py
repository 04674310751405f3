"""Append-only schema migrations for the PostgreSQL store.

``MIGRATIONS[n]`` is schema version ``n + 1``, applied once in its own
transaction and recorded in ``schema_migrations``, as for SQLite
(proxy/store/migrations.py). The two backends keep separate lists: their
types differ (identity columns, JSONB, booleans), and each list is only ever
appended to. Several instances may start at once: the migrator takes a
transaction-scoped advisory lock, so one migrates and the others then find
the work done.

Messages and response objects are TEXT holding the client's JSON exactly as
it came (JSONB would reorder keys and drop duplicates); usage and decision
details are our own dicts, so JSONB, queryable with ``->>``.
"""

from __future__ import annotations

import time
from typing import Any

# Any constant: the key of the advisory lock migrators serialize on.
_LOCK_KEY = 0x637478_7072_6F78  # "ctxprox"

MIGRATIONS: tuple[str, ...] = (
    # 1: sessions, items, requests, responses, summaries (SQLite versions 1 to 3 in one).
    """
    -- Identity columns never reuse a value, so an id held in a cache, a log line
    -- or another instance never names another row (see proxy/store/chains.py).
    CREATE TABLE sessions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tenant TEXT NOT NULL,
        key TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        -- No foreign key (sessions and items would reference each other).
        head_item_id BIGINT,
        -- Bumped by every write to the session: instances validate their caches on it.
        version BIGINT NOT NULL DEFAULT 0,
        -- The newest session-lock fencing token a write carried (proxy/coordination/):
        -- a write with an older one is refused.
        fence BIGINT NOT NULL DEFAULT 0,
        UNIQUE (tenant, key)
    );
    CREATE INDEX sessions_updated_at ON sessions (updated_at);
    CREATE INDEX sessions_tenant_updated_at ON sessions (tenant, updated_at);

    CREATE TABLE items (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id BIGINT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        parent_id BIGINT,
        path_hash TEXT NOT NULL,
        content_hash TEXT NOT NULL,
        role TEXT NOT NULL,
        token_count INTEGER,
        status TEXT NOT NULL,
        message_json TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        UNIQUE (session_id, path_hash)
    );
    CREATE INDEX items_session_parent ON items (session_id, parent_id);

    CREATE TABLE requests (
        id TEXT PRIMARY KEY,
        -- Insertion order, the tie-break among rows created in the same instant.
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        session_id BIGINT REFERENCES sessions (id) ON DELETE CASCADE,
        tenant TEXT NOT NULL,
        session_key TEXT,
        endpoint TEXT NOT NULL,
        route TEXT NOT NULL,
        policy TEXT NOT NULL,
        mode TEXT,
        model TEXT,
        stream BOOLEAN NOT NULL,
        status INTEGER NOT NULL,
        upstream_status INTEGER,
        messages_before INTEGER NOT NULL,
        messages_after INTEGER NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after INTEGER NOT NULL,
        turns_dropped INTEGER NOT NULL,
        messages_dropped INTEGER NOT NULL,
        dropped_indexes JSONB NOT NULL,
        dropped_item_ids JSONB NOT NULL,
        reason TEXT,
        error TEXT,
        incomplete BOOLEAN NOT NULL,
        upstream_ms DOUBLE PRECISION,
        total_ms DOUBLE PRECISION,
        usage_json JSONB,
        detail_json JSONB NOT NULL,
        first_item_id BIGINT,
        last_item_id BIGINT,
        reply_item_id BIGINT,
        created_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX requests_session_created ON requests (session_id, created_at);
    CREATE INDEX requests_tenant_key_created ON requests (tenant, session_key, created_at);

    CREATE TABLE responses (
        id TEXT NOT NULL,
        tenant TEXT NOT NULL,
        session_id BIGINT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        head_item_id BIGINT,
        input_head_item_id BIGINT,
        previous_response_id TEXT,
        model TEXT,
        status TEXT NOT NULL,
        response_json TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        UNIQUE (tenant, id)
    );
    CREATE INDEX responses_session ON responses (session_id);
    CREATE INDEX responses_id ON responses (id);

    CREATE TABLE summaries (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id BIGINT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        covers_item_id BIGINT NOT NULL,
        covers_path_hash TEXT NOT NULL,
        start_unit INTEGER NOT NULL,
        previous_summary_id BIGINT,
        text TEXT NOT NULL,
        facts_json JSONB NOT NULL,
        flagged_json JSONB NOT NULL,
        model TEXT,
        prompt_hash TEXT,
        usage_json JSONB,
        created_at DOUBLE PRECISION NOT NULL,
        UNIQUE (session_id, covers_path_hash, start_unit)
    );
    """,
    # 2: prompt caching (SQLite version 4): the upstream's cache figures, the stable prefix.
    """
    ALTER TABLE requests ADD COLUMN upstream_prompt_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN cached_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN cache_write_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN stable_prefix INTEGER;
    """,
    # 3: the recall index (SQLite version 5): each item's chain position and its text as a
    # tsvector, under a configuration of its own: English stemming (as SQLite's porter),
    # no stopword list (the recall step drops its own; PostgreSQL's would drop more).
    """
    CREATE TEXT SEARCH DICTIONARY ctx_english_stem (TEMPLATE = snowball, Language = english);
    CREATE TEXT SEARCH CONFIGURATION ctx_english (COPY = english);
    ALTER TEXT SEARCH CONFIGURATION ctx_english
        ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword, hword_part
        WITH ctx_english_stem;
    ALTER TABLE items ADD COLUMN position INTEGER;
    ALTER TABLE items ADD COLUMN search tsvector;
    -- Items stored before: their depth from the root, and the text
    -- proxy/store/search_text.py computes, in SQL.
    WITH RECURSIVE depth (id, position) AS (
        SELECT id, 0 FROM items WHERE parent_id IS NULL
        UNION ALL
        SELECT items.id, depth.position + 1 FROM items JOIN depth ON items.parent_id = depth.id
    )
    UPDATE items SET position = depth.position FROM depth WHERE items.id = depth.id;
    UPDATE items SET search = to_tsvector('ctx_english', concat_ws(E'\n',
        CASE jsonb_typeof(m -> 'content')
            WHEN 'string' THEN m ->> 'content'
            WHEN 'array' THEN (SELECT string_agg(p ->> 'text', E'\n')
                FROM jsonb_array_elements(m -> 'content') p
                WHERE jsonb_typeof(p -> 'text') = 'string')
        END,
        CASE jsonb_typeof(m -> 'tool_calls') WHEN 'array' THEN (
            SELECT string_agg(
                concat_ws(' ', c -> 'function' ->> 'name', c -> 'function' ->> 'arguments'), E'\n')
            FROM jsonb_array_elements(m -> 'tool_calls') c)
        END,
        CASE jsonb_typeof(m -> 'arguments')
            WHEN 'string' THEN concat_ws(' ', m ->> 'name', m ->> 'arguments') END,
        CASE jsonb_typeof(m -> 'output') WHEN 'string' THEN m ->> 'output' END
    ))
    FROM (SELECT id AS item_id, message_json::jsonb AS m FROM items) AS parsed
    WHERE items.id = parsed.item_id;
    CREATE INDEX items_search ON items USING GIN (search);
    """,
    # 4: semantic recall (SQLite version 6): each item's embedding, written in the
    # background after the item (proxy/store/postgres_vectors.py). ``seq`` is the
    # readers' cursor: a writer holds its session's row lock while it takes values,
    # so one session's vectors commit in ``seq`` order.
    """
    CREATE TABLE item_vectors (
        item_id BIGINT PRIMARY KEY REFERENCES items (id) ON DELETE CASCADE,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        session_id BIGINT NOT NULL,
        position INTEGER NOT NULL,
        vector BYTEA NOT NULL
    );
    CREATE INDEX item_vectors_session_seq ON item_vectors (session_id, seq);
    """,
    # 5: recall ranked in the proxy (proxy/store/postgres_search.py): a session's items
    # stored after an id, counted from an index; and the GIN index written through (a
    # pending list is read whole by every search until it is merged: 7 ms a term at
    # 5,000 stored turns before a vacuum), its pending entries merged now.
    """
    CREATE INDEX items_session_id ON items (session_id, id);
    ALTER INDEX items_search SET (fastupdate = off);
    SELECT gin_clean_pending_list('items_search'::regclass);
    """,
)


async def migrate(conn: Any, schema: str | None = None) -> list[int]:
    """Apply pending migrations on an asyncpg connection; return the versions applied now."""
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        if schema is not None:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
    for version, script in enumerate(MIGRATIONS, start=1):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            done = await conn.fetchval(
                "SELECT 1 FROM schema_migrations WHERE version = $1", version
            )
            if done:
                continue
            # A script without parameters may hold several statements.
            await conn.execute(script)
            await conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
                version,
                time.time(),
            )
            applied.append(version)
    return applied

"""A deleted conversation's words leave every copy the store keeps, on every backend.

Over real HTTP (the openai SDK, a recording fake upstream), a conversation that
carries a unique marker word is stored beside one that does not, then deleted
each way a user can delete it: ``DELETE /admin/sessions/...``,
``DELETE /v1/responses/{id}``, and the TTL's sweep. Then the bytes themselves
are searched, not the rows a query returns:

- SQLite: the database file and its WAL, read as bytes (the FTS5 index's
  segment blobs, freed pages and cells included);
- Redis: the value of every key under the store's prefix, whatever its type;
- PostgreSQL: every row of every table of the store's schema, and, through
  ``pageinspect``, every raw page of those tables, their indexes and TOAST
  tables (dead tuples and freed space: before and after ``ctxproxy sessions purge``).

The bystander conversation must survive untouched, so a deletion that wiped
everything would not pass either.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis import Redis

from proxy.http.sessions import tenant_of
from proxy.ops.expiry import Expiry
from tests.harness import ProxyServer
from tests.reliability.report import figure
from tests.servers import RUN, require_postgres, require_redis

ADMIN_KEY = "adm-purge-0123456789"
BACKENDS = ["sqlite", "redis", "postgres"]
KINDS = ["admin_delete", "response_delete", "expiry"]
# Recall kept on, so every backend writes its search index (the copies most easily missed).
RECALL = {"last2": {"strategy": "trim", "max_turns": 2, "recall": {"max_tokens": 400}}}


class Backend:
    """Where one backend keeps its bytes, and how to count a word's occurrences there."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.tag = f"ctxpurge{RUN}{uuid.uuid4().hex[:8]}"
        # One proxy on the shared store: no coordination needed.
        self.coordination = {} if name == "sqlite" else {"coordination": {"single_instance": True}}
        if name == "sqlite":
            self.store: dict[str, Any] = {"path": str(tmp_path / "ctxproxy.db")}
        elif name == "redis":
            self.store = {"url": require_redis(), "key_prefix": f"{self.tag}:store"}
        else:
            self.store = {"url": require_postgres(), "schema": self.tag, "pool_size": 4}

    def occurrences(self, word: bytes) -> int:
        """How many stored copies hold ``word`` (live rows and, for SQLite, any byte)."""
        if self.name == "sqlite":
            files = [self.tmp_path / "ctxproxy.db", self.tmp_path / "ctxproxy.db-wal"]
            return sum(f.read_bytes().count(word) for f in files if f.exists())
        if self.name == "redis":
            return sum(value.count(word) for value in redis_values(self.store["url"], self.tag))
        return asyncio.run(postgres_rows(self.store["url"], self.tag, word))

    def raw_pages(self, word: bytes) -> int:
        """PostgreSQL: the raw pages (heap, index, TOAST) that still hold ``word``."""
        return asyncio.run(postgres_pages(self.store["url"], self.tag, word))

    def cleanup(self) -> None:
        if self.name == "redis":
            client = Redis.from_url(self.store["url"])
            keys = list(client.scan_iter(match=f"{self.tag}:*", count=1000))
            if keys:
                client.unlink(*keys)
        elif self.name == "postgres":
            asyncio.run(_postgres(self.store["url"], f'DROP SCHEMA IF EXISTS "{self.tag}" CASCADE'))


def redis_values(url: str, tag: str) -> list[bytes]:
    """Every key's name and value under the prefix, each type read whole."""
    client = Redis.from_url(url)
    values: list[bytes] = []
    for key in client.scan_iter(match=f"{tag}:*", count=1000):
        kind = client.type(key).decode()
        values.append(key)
        if kind == "string":
            values.append(client.get(key) or b"")
        elif kind == "hash":
            values.extend(k + b"=" + v for k, v in client.hgetall(key).items())
        elif kind == "list":
            values.extend(client.lrange(key, 0, -1))
        elif kind == "set":
            values.extend(client.smembers(key))
        elif kind == "zset":
            values.extend(m for m, _ in client.zrange(key, 0, -1, withscores=True))
        else:
            raise AssertionError(f"a key of a type this test does not read: {key!r} {kind}")
    return values


async def _postgres(url: str, sql: str, *args: Any) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def postgres_rows(url: str, schema: str, word: bytes) -> int:
    tables = await _postgres(
        url, "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", schema
    )
    found = 0
    for (table,) in tables:
        rows = await _postgres(
            url,
            f'SELECT count(*) FROM "{schema}"."{table}" t WHERE position($1 in t::text) > 0',
            word.decode(),
        )
        found += rows[0][0]
    return found


async def postgres_pages(url: str, schema: str, word: bytes) -> int:
    """Raw pages of every relation of the schema (tables, indexes, TOAST) holding ``word``."""
    await _postgres(url, "CREATE EXTENSION IF NOT EXISTS pageinspect")
    relations = await _postgres(
        url,
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relkind IN ('r', 'i')"
        " UNION SELECT t.reltoastrelid::regclass::text FROM pg_class t"
        " JOIN pg_namespace n ON n.oid = t.relnamespace"
        " WHERE n.nspname = $1 AND t.reltoastrelid <> 0",
        schema,
    )
    found = 0
    for (relation,) in relations:
        rows = await _postgres(
            url,
            "SELECT count(*) FROM generate_series(0, pg_relation_size($1::regclass) / 8192 - 1) p"
            " WHERE position($2::bytea in get_raw_page($1::text, p::int)) > 0",
            relation,
            word,
        )
        found += rows[0][0]
    return found


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    b = Backend(request.param, tmp_path)
    yield b
    b.cleanup()


def _client(proxy: ProxyServer, session: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-purge",
        max_retries=0,
        default_headers={"X-Session-Id": session},
    )


def _converse(proxy: ProxyServer, session: str, word: str) -> None:
    """Two chat turns and one Responses exchange carrying ``word``, in one session."""
    client = _client(proxy, session)
    messages: list[Any] = [{"role": "user", "content": f"remember {word} for me"}]
    for turn in range(2):
        reply = client.chat.completions.create(model="gpt-4o", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"and {word} again, turn {turn}"},
        ]
    client.responses.create(model="gpt-4o", input=f"the {word} in a response")


def _store_victim(kind: str, proxy: ProxyServer, word: str) -> str | None:
    """The conversation to delete; for a response, the id of the one that carries ``word``
    (after one that does not, which stays: only what no other response holds goes)."""
    if kind != "response_delete":
        _converse(proxy, "victim", word)
        return None
    client = _client(proxy, "victim")
    first = client.responses.create(model="gpt-4o", input="a plain start")
    return client.responses.create(
        model="gpt-4o", input=f"the {word} to forget", previous_response_id=first.id
    ).id


def _delete(kind: str, proxy: ProxyServer, response_id: str | None) -> None:
    if kind == "admin_delete":
        r = httpx.delete(
            f"{proxy.url}/admin/sessions/{tenant_of('sk-purge')}/victim",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert r.status_code == 200, r.text
    elif kind == "response_delete":
        assert response_id is not None
        _client(proxy, "victim").responses.delete(response_id)
    else:
        # Every session is idle past the TTL an hour on (the bystander is written later).
        swept = proxy.loop.run(Expiry(proxy.runtime).sweep(now=time.time() + 7200))
        assert swept == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_deleted_conversations_words_are_found_in_no_byte_the_store_keeps(
    kind: str,
    backend: Backend,
    reliable_proxy: Callable[..., ProxyServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTX_PURGE_ADMIN_KEY", ADMIN_KEY)
    proxy = reliable_proxy(
        store=backend.store,
        policies=RECALL,
        admin={"api_key": "os.environ/CTX_PURGE_ADMIN_KEY"},
        session={"ttl": "1h"},
        **backend.coordination,
    )
    marker = f"zqxmark{uuid.uuid4().hex[:10]}".encode()
    keeper = f"zqxkeep{uuid.uuid4().hex[:10]}".encode()
    response_id = _store_victim(kind, proxy, marker.decode())
    proxy.drain()
    assert backend.occurrences(marker) > 0, "the scan finds not even the stored text"

    _delete(kind, proxy, response_id)
    # The bystander after the deletion, so the sweep leaves it (and the store goes on).
    _converse(proxy, "bystander", keeper.decode())
    proxy.drain()

    left = backend.occurrences(marker)
    figure(f"deletion {backend.name} {kind}: copies of the deleted text left", left)
    assert left == 0
    assert backend.occurrences(keeper) > 0, "the bystander's conversation must survive"
    if kind == "response_delete":
        assert backend.occurrences(b"a plain start") > 0, "the earlier response must survive"
    if backend.name == "postgres":
        before = backend.raw_pages(marker)
        steps = proxy.loop.run(proxy.runtime.store.purge())
        after = backend.raw_pages(marker)
        figure(f"deletion postgres {kind}: raw pages holding it before purge", before)
        figure(f"deletion postgres {kind}: raw pages holding it after purge", after)
        assert steps and after == 0

"""The Store backends every store contract test runs against, and what those tests share.

``store`` (the SQLite store, the in-memory fake, a real Redis and a real
PostgreSQL, one test run each) and ``clock`` are fixtures, registered for the
whole suite by tests/conftest.py. Each Redis store works under a key prefix
of its own, deleted when the store closes; each PostgreSQL store in a schema
of its own, dropped when the store closes.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store.base import MessageIn, RequestRecord, SessionRef, Store
from proxy.store.memory import MemoryStore
from proxy.store.postgres import PostgresStore
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore
from tests.servers import POSTGRES_URL, RUN, require_postgres, require_redis

BACKENDS = ["sqlite", "memory", "redis", "postgres"]
ALICE = SessionRef("tenant-a", "chat-1")


class ScratchRedisStore(RedisStore):
    """A Redis store under a key prefix of its own, every key of which is deleted on close."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, prefix=f"ctxtest:{uuid.uuid4().hex}:", **options)

    async def close(self) -> None:
        client = self._client
        if client is not None:
            keys = [key async for key in client.scan_iter(match=self.prefix + "*", count=1000)]
            if keys:
                await client.unlink(*keys)
        await super().close()


# Schemas of this run a closed scratch store emptied, ready for the next one:
# migrating a fresh schema per store (the property tests make hundreds) is most
# of what a PostgreSQL test costs. All of them are dropped when the run ends.
_EMPTIED: list[str] = []
_TABLES = "sessions, items, requests, responses, summaries, item_vectors"


class ScratchPostgresStore(PostgresStore):
    """A PostgreSQL store in an empty schema of this test run (``postgres_schemas`` drops them)."""

    def __init__(self, url: str, **options: Any) -> None:
        schema = _EMPTIED.pop() if _EMPTIED else f"ctxtest_{RUN}_{uuid.uuid4().hex[:8]}"
        super().__init__(url, schema=schema, **options)

    async def close(self) -> None:
        pool = self._pool
        if pool is not None:
            await pool.execute(f"TRUNCATE {_TABLES} RESTART IDENTITY")
        await super().close()
        if pool is not None and self.schema is not None:
            _EMPTIED.append(self.schema)


@pytest.fixture(scope="session", autouse=True)
def postgres_schemas() -> Iterator[None]:
    """Drop every schema this run made, whether its test passed or not."""
    yield

    async def drop() -> None:
        import asyncpg

        try:
            conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
        except OSError:
            return  # never reached: nothing was made
        try:
            names = await conn.fetch(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE $1", f"ctxtest_{RUN}_%"
            )
            for (name,) in names:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()

    _EMPTIED.clear()
    asyncio.run(drop())


def make_store(backend: str, directory: Path) -> Store:
    if backend == "redis":
        return ScratchRedisStore(require_redis())
    if backend == "postgres":
        return ScratchPostgresStore(require_postgres(), pool_size=4)
    # A nested directory: the SQLite store must create it.
    return SqliteStore(directory / "db" / "store.sqlite") if backend == "sqlite" else MemoryStore()


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = make_store(request.param, tmp_path)
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Pin time.time() so ordering and expiry tests do not depend on clock resolution."""
    now = [1_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])

    def set_time(value: float) -> None:
        now[0] = value

    return set_time


def msg(role: str, content: str, tokens: int | None = 3, status: str = "complete") -> MessageIn:
    """A chat message to store, its content hash computed as a test's own."""
    message = {"role": role, "content": content}
    digest = hashlib.sha256(orjson.dumps(message)).hexdigest()
    return MessageIn(message, digest, role, tokens, status)


_request_ids = itertools.count()


def req(tenant: str = ALICE.tenant, **fields: Any) -> RequestRecord:
    """A request row for ALICE's session (or ``tenant``'s), unique id; ``fields`` override."""
    base: dict[str, Any] = {
        "id": f"req-{next(_request_ids)}",
        "tenant": tenant,
        "session_key": ALICE.key,
        "route": "default",
        "policy": "trim",
        "model": "gpt-test",
        "stream": False,
        "status": 200,
    }
    return RequestRecord(**(base | fields))

"""The Store backends every store contract test runs against, and what those tests share.

``store`` (the SQLite store and the in-memory fake, one test run each) and
``clock`` are fixtures, registered for the whole suite by tests/conftest.py.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store.base import MessageIn, RequestRecord, SessionRef, Store
from proxy.store.memory import MemoryStore
from proxy.store.sqlite import SqliteStore

BACKENDS = ["sqlite", "memory"]
ALICE = SessionRef("tenant-a", "chat-1")


def make_store(backend: str, directory: Path) -> Store:
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

"""session.ttl: idle sessions and all their rows are deleted in the background."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.config.loader import parse_config
from proxy.errors import ConfigError
from proxy.ops.expiry import MAX_INTERVAL, MIN_INTERVAL, Expiry, sweep_interval
from proxy.runtime import Runtime
from proxy.store.base import MessageIn, RequestRecord, SessionRef
from proxy.store.sqlite import SqliteStore
from tests.harness import query, wait_until
from tests.telemetry.test_metrics import parse, value

BASE = {"upstreams": {"d": {"base_url": "http://127.0.0.1:9/v1"}}, "routes": [{"upstream": "d"}]}


@pytest.mark.parametrize(
    ("ttl", "seconds"), [("30m", 1800), ("12h", 43200), ("7d", 604800), ("0.5s", 0.5)]
)
def test_ttl_is_a_duration(ttl, seconds):
    assert parse_config({**BASE, "session": {"ttl": ttl}}).session.ttl_s == seconds


@pytest.mark.parametrize("ttl", ["7", "7w", "-1d", "0s", 3600, "soon", ""])
def test_bad_ttl_is_rejected_naming_the_key(ttl):
    with pytest.raises(ConfigError, match=r"^session\.ttl: must be a positive duration"):
        parse_config({**BASE, "session": {"ttl": ttl}})


def test_sweep_interval_follows_the_ttl_within_bounds():
    assert sweep_interval(0.001) == MIN_INTERVAL
    assert sweep_interval(60) == 6
    assert sweep_interval(7 * 86400) == MAX_INTERVAL


def message(text: str, role: str = "user") -> MessageIn:
    return MessageIn(
        message={"role": role, "content": text}, content_hash=text, role=role, token_count=3
    )


async def record(store: SqliteStore, key: str, n: int = 1) -> None:
    for i in range(n):
        await store.record_exchange(
            SessionRef("t", key),
            [message(f"{key}-{j}") for j in range(i + 1)],
            message(f"{key}-reply-{i}", "assistant"),
            RequestRecord(
                id=f"{key}-{i}",
                tenant="t",
                route="r",
                policy="p",
                model="m",
                stream=False,
                status=200,
            ),
        )


async def test_sweep_deletes_only_sessions_idle_longer_than_the_ttl(tmp_path):
    store = SqliteStore(tmp_path / "e.db")
    await store.open()
    config = parse_config({**BASE, "session": {"ttl": "1h"}})
    rt = Runtime(config=config, store=store, upstreams={})
    try:
        await record(store, "a", 2)
        await record(store, "b")
        expiry = Expiry(rt)
        assert await expiry.sweep(now=time.time() + 3500) == 0
        assert {s.key for s in await store.list_sessions()} == {"a", "b"}
        assert await expiry.sweep(now=time.time() + 3700) == 2
        assert await store.list_sessions() == []
        db = tmp_path / "e.db"
        for table in ("sessions", "items", "requests"):
            assert query(db, f"SELECT COUNT(*) FROM {table}")[0][0] == 0, table
        assert rt.metrics.sessions_expired.value() == 2
    finally:
        await store.close()


async def test_without_a_ttl_nothing_expires(tmp_path):
    store = SqliteStore(tmp_path / "e.db")
    await store.open()
    rt = Runtime(config=parse_config(BASE), store=store, upstreams={})
    try:
        await record(store, "a")
        assert await Expiry(rt).sweep(now=time.time() + 10 * 365 * 86400) == 0
        assert len(await store.list_sessions()) == 1
    finally:
        await store.close()


async def test_the_database_stops_growing_once_expiry_keeps_up(tmp_path):
    db = tmp_path / "g.db"
    store = SqliteStore(db)
    await store.open()
    rt = Runtime(config=parse_config({**BASE, "session": {"ttl": "1h"}}), store=store, upstreams={})
    pages: list[int] = []
    try:
        for cycle in range(6):
            for s in range(20):
                await record(store, f"c{cycle}-s{s}", 3)
            assert await Expiry(rt).sweep(now=time.time() + 7200) == 20
            pages.append(query(db, "PRAGMA page_count")[0][0])
    finally:
        await store.close()
    # Freed pages are reused: later cycles need no more pages than the third one
    # (the recall index's FTS5 segments reach their steady size a cycle later).
    assert max(pages[3:]) <= pages[2], pages


def test_expired_sessions_vanish_from_a_running_proxy(fake, start_proxy):
    proxy = start_proxy(extra={"session": {"ttl": "0.5s"}})
    for key in ("x", "y"):
        r = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=orjson.dumps(
                {"model": "gpt-4o", "messages": [{"role": "user", "content": key}]}
            ),
            headers={
                "content-type": "application/json",
                "x-session-id": key,
                "authorization": "Bearer sk-a",
            },
        )
        assert r.status_code == 200
    proxy.drain()
    db = Path(proxy.config.store.path)
    assert query(db, "SELECT COUNT(*) FROM sessions")[0][0] == 2
    wait_until(lambda: query(db, "SELECT COUNT(*) FROM sessions")[0][0] == 0, timeout=5)
    assert query(db, "SELECT COUNT(*) FROM items")[0][0] == 0
    assert query(db, "SELECT COUNT(*) FROM requests")[0][0] == 0
    samples = parse(httpx.get(f"{proxy.url}/metrics").text)
    assert value(samples, "ctxproxy_sessions_expired_total") == 2

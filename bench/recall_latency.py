"""bench/recall.py's cost sections: the time the recall step adds per request on each store
(SQLite, PostgreSQL, Redis) and what the FTS insert adds to storing an exchange."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.recall_data import Question
from bench.recall_store import (
    MODEL,
    NEIGHBORS,
    ask,
    message_in,
    recall_at,
    record,
    session_of,
    window,
)
from policies.types import RecallSpec
from proxy.context.recall import RecallService
from proxy.context.tokens import counter_for
from proxy.store import sqlite_jobs
from proxy.store.base import MessageIn, SessionRef, Store
from proxy.store.postgres import PostgresStore
from proxy.store.redis import RedisStore
from proxy.store.search_backends import recall_index_for
from proxy.store.sqlite import SqliteStore
from proxy.telemetry.metrics import Metrics


async def latency(
    store: Store,
    conversations: list[list[dict[str, Any]]],
    questions: list[Question],
    rounds: int,
    exchange: int | None = None,
) -> list[tuple[int, float, float, float, float, float]]:
    """The recall step's time per request on ``store``'s own index (SQLite, PostgreSQL,
    Redis). ``exchange``: store each session that many messages at a time (None: at once)."""
    service = RecallService(recall_index_for(store), Metrics())
    out = []
    for turns in (100, 1000, 5000):
        ref = SessionRef("bench", f"latency-{turns}")
        stored = [message_in(m) for m in session_of(conversations, turns)]
        step = exchange or len(stored)
        for end in range(step, len(stored) + step, step):
            await store.record_exchange(ref, stored[:end], None, record(f"l{turns}-{end}"))
        spec = RecallSpec(share=0.7, neighbors=NEIGHBORS)
        times: list[float] = []
        cpu: list[float] = []
        for r in range(rounds + 20):
            a = ask(stored, questions[r % len(questions)])
            windows = window(a, spec, 4000)
            started = time.perf_counter()
            cpu_started = time.process_time()
            await recall_at(service, spec, 4000, a, windows, ref)
            if r >= 20:  # warm-up excluded
                times.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - cpu_started) * 1000)
            # What the chat pipeline does off the request path: the left-out
            # messages' lines counted ahead (RecallService.prepare).
            base = next(iter(windows.values()))
            await service.prepare(ref, a.conversation, base, counter_for(MODEL))
        times.sort()
        cpu.sort()
        p50 = times[len(times) // 2]
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        cpu99 = cpu[min(len(cpu) - 1, int(len(cpu) * 0.99))]
        out.append((turns, p50, p99, statistics.mean(times), cpu[len(cpu) // 2], cpu99))
    return out


def print_latency(backend: str, lat: list[tuple[int, float, float, float, float, float]]) -> None:
    print(
        f"\n== time the recall step adds per request, {backend} "
        "(share 0.7 of a 4000-token trim budget)"
    )
    print(
        f"{'stored turns':>13} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'cpu p50':>8} {'cpu p99':>8}"
    )
    for turns, p50, p99, mean, c50, c99 in lat:
        print(f"{turns:13} {p50:8.3f} {p99:8.3f} {mean:8.3f} {c50:8.3f} {c99:8.3f}")
    print(
        f"(wall clock and process CPU time; load average now {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores)"
    )


async def pg_latency(
    conversations: list[list[dict[str, Any]]], questions: list[Question], rounds: int
) -> list[tuple[int, float, float, float, float, float]]:
    """:func:`latency` on a PostgreSQL store, in a schema of its own (dropped after)."""
    url = os.environ.get("CTXPROXY_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"bench_recall_{os.getpid()}"
    store = PostgresStore(url, pool_size=2, schema=schema)
    await store.open()
    try:
        return await latency(store, conversations, questions, rounds)
    finally:
        await store.pool.execute(f"DROP SCHEMA {schema} CASCADE")
        await store.close()


async def redis_latency(
    conversations: list[list[dict[str, Any]]], questions: list[Question], rounds: int
) -> list[tuple[int, float, float, float, float, float]]:
    """:func:`latency` on a Redis store, under a key prefix of its own (deleted after)."""
    url = os.environ.get("CTXPROXY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    store = RedisStore(url, prefix=f"ctxproxy:bench_recall_{os.getpid()}:")
    await store.open()
    try:
        return await latency(store, conversations, questions, rounds, exchange=20)
    finally:
        client = store._client
        assert client is not None
        keys = [k async for k in client.scan_iter(match=store.prefix + "*", count=1000)]
        for start in range(0, len(keys), 1000):
            await client.unlink(*keys[start : start + 1000])
        await store.close()


async def storage(conversations: list[list[dict[str, Any]]], exchanges: int) -> dict[str, Any]:
    """An exchange's write with and without the FTS insert: interleaved rounds, same data."""
    real = sqlite_jobs.index_items
    directory = Path(tempfile.mkdtemp(prefix="ctxproxy-recall-store-"))
    stores = {
        "with index": SqliteStore(directory / "a.db"),
        "without": SqliteStore(directory / "b.db"),
    }
    for s in stores.values():
        await s.open()
    pool = [m for c in conversations for m in c if m["role"] != "system"]
    history: dict[str, list[MessageIn]] = {name: [] for name in stores}
    times: dict[str, list[float]] = {name: [] for name in stores}
    try:
        for r in range(exchanges // 10):
            for name, s in stores.items() if r % 2 == 0 else reversed(stores.items()):
                sqlite_jobs.index_items = real if name == "with index" else _no_index
                for j in range(10):
                    k = r * 10 + j
                    user = message_in(
                        {"role": "user", "content": pool[(2 * k) % len(pool)]["content"]}
                    )
                    reply = message_in(
                        {"role": "assistant", "content": pool[(2 * k + 1) % len(pool)]["content"]}
                    )
                    history[name].append(user)
                    started = time.perf_counter()
                    await s.record_exchange(
                        SessionRef("bench", f"w{k // 200}"),
                        history[name][-199:],
                        reply,
                        record(f"{name}-{k}"),
                    )
                    times[name].append((time.perf_counter() - started) * 1000)
                    history[name].append(reply)
                    if len(history[name]) >= 200:
                        history[name] = []
    finally:
        sqlite_jobs.index_items = real
        for s in stores.values():
            await s.close()
    sizes = {
        name: sum(f.stat().st_size for f in directory.glob(f"{name[0]}.db*")) for name in stores
    }
    sizes = {
        "with index": sum(f.stat().st_size for f in directory.glob("a.db*")),
        "without": sum(f.stat().st_size for f in directory.glob("b.db*")),
    }
    return {
        name: (statistics.median(t), statistics.mean(t), sizes[name]) for name, t in times.items()
    } | {"messages": 2 * exchanges}


def _no_index(conn: Any, item_ids: Any) -> None:
    return None

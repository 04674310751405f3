"""Store backends side by side: SQLite vs Redis vs PostgreSQL on a 20-message session.

Each exchange is what a client resending its history stores: 18 messages the
store has, one new user message and the reply (20 items after it). Measured
per backend, in interleaved rounds (SQLite, Redis, Redis without the chain
cache, Redis without the recall index, then again) so drift on a shared
machine hits all alike:

- ``record_exchange`` one at a time: p50 / p99 latency;
- ``history`` of a 20-item session one at a time: p50 / p99 latency;
- write throughput: exchanges/s with ``--concurrency`` writes in flight
  (each on its own session, as a loaded proxy has them).

"Redis, cold cache" is the worst case of several instances behind a load
balancer: the instance has never seen the session, so the whole history is
sent and looked up ("postgresql, cold": no chain cache and no history cache
either). "Redis, no index" leaves out the recall index the store keeps by
default (proxy/store/redis_search.py), to show what it costs. Redis must be
on 127.0.0.1:6379 (each run uses its own key prefix, deleted afterwards),
PostgreSQL on 127.0.0.1:5432, database ``test`` (each run its own schema,
dropped afterwards).

    python bench/stores.py [--rounds 3] [--sessions 300] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.store.base import MessageIn, RequestRecord, SessionRef, Store
from proxy.store.chains import ChainCache
from proxy.store.postgres import PostgresStore
from proxy.store.postgres_history import HistoryCache
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
_ids = iter(range(10**12))


def message(role: str, text: str) -> MessageIn:
    body = {"role": role, "content": text}
    return MessageIn(body, hashlib.sha256(orjson.dumps(body)).hexdigest(), role, len(text) // 4)


def request(session: SessionRef) -> RequestRecord:
    return RequestRecord(
        id=f"bench-{next(_ids)}",
        tenant=session.tenant,
        session_key=session.key,
        route="default",
        policy="trim",
        model="gpt-4o",
        stream=False,
        status=200,
        tokens_before=4000,
        tokens_after=4000,
        messages_before=19,
        messages_after=19,
        usage={"prompt_tokens": 4000, "completion_tokens": 12},
    )


def conversation(n: int, tag: str) -> list[MessageIn]:
    """A system message and alternating turns of ~200 tokens each, as real chats carry."""
    text = "lorem ipsum dolor sit amet " * 30
    out = [message("system", "You are a helpful assistant.")]
    for i in range(1, n):
        out.append(message("user" if i % 2 else "assistant", f"{tag} {i} {text}"))
    return out


class Postgres(PostgresStore):
    """In a schema of its own, dropped on close."""

    def __init__(self, *, cold: bool = False) -> None:
        super().__init__(POSTGRES_URL, schema=f"ctxbench_{uuid.uuid4().hex[:12]}", pool_size=10)
        if cold:
            self._chains = ChainCache(max_sessions=0)
            self._histories = HistoryCache(max_sessions=0)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        await super().close()


class Redis(RedisStore):
    """Under a key prefix of its own, deleted on close."""

    def __init__(self, *, cold: bool = False, index: bool = True) -> None:
        super().__init__(REDIS_URL, prefix=f"ctxbench:{uuid.uuid4().hex}:")
        if cold:
            self._chains = ChainCache(max_sessions=0)
        if not index:
            self._index = None

    async def close(self) -> None:
        if self._client is not None:
            keys = [k async for k in self._client.scan_iter(match=self.prefix + "*", count=1000)]
            for i in range(0, len(keys), 1000):
                await self._client.unlink(*keys[i : i + 1000])
        await super().close()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(samples: list[float], call: Callable[[], Awaitable[Any]]) -> None:
    start = time.perf_counter()
    await call()
    samples.append((time.perf_counter() - start) * 1000)


async def one_round(store: Store, sessions: int, concurrency: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    refs = [SessionRef("bench", f"{tag}-{i}") for i in range(sessions)]
    chats = {ref: conversation(18, ref.key) for ref in refs}
    for ref in refs:  # the stored history: 18 messages (17 + a reply)
        chat = chats[ref]
        await store.record_exchange(ref, chat[:17], chat[17], request(ref))

    def exchange(ref: SessionRef) -> Awaitable[Any]:
        chat = chats[ref]
        new = [*chat, message("user", f"{ref.key} new question")]
        return store.record_exchange(ref, new, message("assistant", "an answer"), request(ref))

    # Latency, one at a time, on half the sessions; throughput on the other half.
    half = sessions // 2
    writes: list[float] = []
    reads: list[float] = []
    for ref in refs[:half]:
        await timed(writes, lambda ref=ref: exchange(ref))  # type: ignore[misc]
    for ref in refs[:half]:
        await timed(reads, lambda ref=ref: store.history(ref))  # type: ignore[misc]
    assert len(await store.history(refs[0])) == 20
    gate = asyncio.Semaphore(concurrency)
    # Warm: as many connections as writes in flight (a running proxy has its pool open).
    await asyncio.gather(*(store.history(ref) for ref in refs[:concurrency]))

    async def limited(ref: SessionRef) -> None:
        async with gate:
            await exchange(ref)

    start = time.perf_counter()
    await asyncio.gather(*(limited(ref) for ref in refs[half:]))
    elapsed = time.perf_counter() - start
    return {"writes": writes, "reads": reads, "rate": (sessions - half) / elapsed}


async def main(rounds: int, sessions: int, concurrency: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="ctxbench-"))
    makers: dict[str, Callable[[], Store]] = {
        "sqlite": lambda: SqliteStore(directory / f"{uuid.uuid4().hex}.db"),
        "redis": lambda: Redis(),
        "redis, cold cache": lambda: Redis(cold=True),
        "redis, no index": lambda: Redis(index=False),
        "postgresql": lambda: Postgres(),
        "postgresql, cold": lambda: Postgres(cold=True),
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in makers}
    for r in range(rounds):
        for name, make in makers.items():
            store = make()
            await store.open()
            try:
                results[name].append(await one_round(store, sessions, concurrency))
            finally:
                await store.close()
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)

    print(
        f"# {rounds} rounds x {sessions} sessions; exchange = 18 stored + 1 new message + reply;"
        f" throughput at concurrency {concurrency}"
    )
    print(
        f"{'backend':<18} {'exch/s':>8} {'write p50':>10} {'write p99':>10}"
        f" {'history p50':>12} {'history p99':>12}"
    )
    for name, runs in results.items():
        writes = [s for run in runs for s in run["writes"]]
        reads = [s for run in runs for s in run["reads"]]
        rate = statistics.median(run["rate"] for run in runs)
        print(
            f"{name:<18} {rate:8.0f} {percentile(writes, 0.5):8.3f}ms {percentile(writes, 0.99):8.3f}ms"
            f" {percentile(reads, 0.5):10.3f}ms {percentile(reads, 0.99):10.3f}ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    ns = parser.parse_args()
    asyncio.run(main(ns.rounds, ns.sessions, ns.concurrency))

"""Two proxy processes on one shared store and one Redis, driven by one client alternating.

Real processes (``python -m proxy``), the real servers, the openai SDK as the
client and a recording fake upstream both instances forward to. Asserts on
what reached the upstream, what the clients got and what the store holds.
Each test runs on both shared stores: PostgreSQL, and the Redis store
(``store.url: redis://``, beside coordination in the same Redis).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from redis import Redis

from proxy.store.base import SessionRef, Store, StoredItem
from proxy.store.postgres import PostgresStore
from proxy.store.redis import RedisStore
from tests.conftest import LoopThread
from tests.fakes.upstream import FakeUpstream, Reply
from tests.harness import AiohttpServer, free_port
from tests.servers import RUN, require_postgres, require_redis

REPO = Path(__file__).resolve().parents[2]
LEASE_S = 3.0


class Instance:
    """One proxy process."""

    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--config", str(config), "--port", str(self.port)],
            cwd=REPO,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"proxy exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("proxy did not start in time")

    def client(self, session: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key="sk-test",
            max_retries=0,
            timeout=60,
            default_headers={"X-Session-Id": session},
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def upstream(loop_thread: LoopThread) -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    server = AiohttpServer(loop_thread, fake.app())
    fake.url = server.url  # type: ignore[attr-defined]
    yield fake
    server.stop()


@pytest.fixture(params=["postgres", "redis"])
def cluster(
    request: pytest.FixtureRequest, upstream: FakeUpstream, tmp_path: Path
) -> Iterator[tuple[Instance, Instance, Store]]:
    """Two instances (a, b) on a fresh store (schema or key prefix) and Redis prefix; a reader."""
    redis_url = require_redis()
    prefix = f"ctxtest:{RUN}:{uuid.uuid4().hex[:8]}"
    reader: Store
    if request.param == "postgres":
        pg = require_postgres()
        schema = f"ctxtest_{RUN}_{uuid.uuid4().hex[:8]}"
        store: dict[str, Any] = {"url": pg, "schema": schema, "pool_size": 8}
        reader = PostgresStore(pg, schema=schema, pool_size=2)
    else:
        store = {"url": redis_url, "key_prefix": f"{prefix}:store"}
        reader = RedisStore(redis_url, prefix=f"{prefix}:store:")
    config = {
        "store": store,
        "coordination": {
            "redis_url": redis_url,
            "key_prefix": prefix,
            "lock_lease": f"{LEASE_S:g}s",
        },
        "upstreams": {"default": {"base_url": f"{upstream.url}/v1", "timeout_s": 30}},  # type: ignore[attr-defined]
        "policies": {
            "support": {
                "strategy": "summarize",
                "trigger": {"turns": 4},
                "keep_last_turns": 2,
                "summarizer": {"timeout_s": 10, "max_tokens": 300},
            }
        },
        "routes": [
            {"match": {"model": "summarized"}, "upstream": "default", "policy": "support"},
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "history": "server"},
        ],
        "logging": {"level": "warning", "format": "json"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    a, b = Instance(path, tmp_path / "a.log"), Instance(path, tmp_path / "b.log")
    try:
        for instance in (a, b):
            instance.wait_ready()
            # The first request loads the tokenizer (a second or more of CPU on a busy
            # machine, the event loop blocked meanwhile): done before the test, so no
            # lease lapses while its holder cannot renew it (docs/operations/several-instances.md, degraded mode).
            instance.client("warm-up").chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "warm up"}]
            )
        yield a, b, reader
    finally:
        a.stop()
        b.stop()
        if request.param == "postgres":
            asyncio.run(_drop(pg, schema))
        r = Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=f"{prefix}:*"))
        if keys:
            r.delete(*keys)
        r.close()


async def _drop(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def stored(reader: Store, ref: SessionRef) -> list[StoredItem]:
    async def read() -> list[StoredItem]:
        await reader.open()
        try:
            return await reader.history(ref)
        finally:
            await reader.close()

    return asyncio.run(read())


def session_ref(key: str) -> SessionRef:
    from proxy.http.sessions import session_ref as ref_for
    from proxy.http.sessions import tenant_of

    ref = ref_for(tenant_of("sk-test"), key)
    assert ref is not None
    return ref


def test_64_concurrent_server_history_requests_over_two_instances_store_every_turn_once_in_order(
    cluster: tuple[Instance, Instance, Store], upstream: FakeUpstream
) -> None:
    a, b, reader = cluster
    key = "shared-64"
    clients = [a.client(key), b.client(key)]
    upstream.replies = []  # echo: every answer names its turn

    def turn(i: int) -> str:
        reply = clients[i % 2].chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"turn {i}"}]
        )
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(turn, range(64)))
    assert answers == [f"echo: turn {i}" for i in range(64)]

    history = stored(reader, session_ref(key))
    contents = [item.message["content"] for item in history]
    # Every turn exactly once, each question directly followed by its own answer.
    assert len(history) == 128, (a.log.read_text()[-3000:], b.log.read_text()[-3000:], contents)
    questions = contents[0::2]
    assert sorted(questions) == sorted(f"turn {i}" for i in range(64))
    assert contents[1::2] == [f"echo: {q}" for q in questions]
    assert [item.role for item in history] == ["user", "assistant"] * 64
    # Serialized: the k-th forwarded request carried the whole history before it.
    turns = [r for r in upstream.chat_requests if r.json["messages"][-1]["content"] != "warm up"]
    sizes = sorted(len(r.json["messages"]) for r in turns)
    assert sizes == [2 * k + 1 for k in range(64)]


def test_a_summary_range_needed_by_both_instances_at_once_is_made_by_one_summarizer_call(
    cluster: tuple[Instance, Instance, Store], upstream: FakeUpstream
) -> None:
    a, b, reader = cluster
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    for t in range(8):
        messages += [
            {"role": "user", "content": f"question {t} " + "detail " * 200},
            {"role": "assistant", "content": f"answer {t}"},
        ]
    messages.append({"role": "user", "content": "and now?"})
    # The summarizer is slow, so both instances need the range while it runs.
    upstream.summary_replies = [Reply(content="## Goal and context\n- the one summary", delay=1.0)]

    def ask(instance: Instance) -> str:
        raw = instance.client("summary-shared").chat.completions.with_raw_response.create(
            model="summarized", messages=messages
        )
        return raw.headers.get("x-context-summary", "")

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(ask, [a, b, a, b, a, b, a, b]))
    # Prefetches for the next range may follow: one call per range, whatever asked.
    time.sleep(1.5)
    ranges = _summary_ranges(reader, session_ref("summary-shared"))
    assert upstream.summaries_made == len(ranges) >= 1
    assert len(set(ranges)) == len(ranges)
    assert set(statuses) <= {"created", "waited", "reused"}, statuses


def _summary_ranges(reader: Store, ref: SessionRef) -> list[tuple[str, int]]:
    async def read() -> list[tuple[str, int]]:
        await reader.open()
        try:
            return [(s.covers_path_hash, s.start_unit) for s in await reader.summaries(ref)]
        finally:
            await reader.close()

    return asyncio.run(read())


def test_kill_9_of_the_lock_holder_leaves_the_other_instance_serving_within_the_lease(
    cluster: tuple[Instance, Instance, Store], upstream: FakeUpstream
) -> None:
    a, b, reader = cluster
    key = "survivor"
    # Some history first, through both.
    for i in range(4):
        (a if i % 2 else b).client(key).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"warm {i}"}]
        )
    # a takes the session's lock and waits on a slow upstream: then it dies.
    upstream.replies = [Reply(content="never delivered", delay=3 * LEASE_S)]
    before = len(upstream.received)
    with ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(
            lambda: a.client(key).chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "lost turn"}]
            )
        )
        deadline = time.monotonic() + 10
        while len(upstream.received) == before:  # a holds the lock and is upstream
            assert time.monotonic() < deadline
            time.sleep(0.01)
        a.kill()
        with pytest.raises(openai.APIConnectionError):
            doomed.result(10)
    started = time.monotonic()
    reply = b.client(key).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "after the crash"}]
    )
    waited = time.monotonic() - started
    assert reply.choices[0].message.content == "echo: after the crash"
    # b waited for the dead holder's lease to run out, and no longer.
    assert waited < LEASE_S + 1.5, waited
    assert waited > LEASE_S / 4, waited
    contents = [item.message["content"] for item in stored(reader, session_ref(key))]
    assert contents == [
        *(x for i in range(4) for x in (f"warm {i}", f"echo: warm {i}")),
        "after the crash",
        "echo: after the crash",
    ]
    # The survivor keeps serving the session at its usual pace.
    started = time.monotonic()
    b.client(key).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "again"}]
    )
    assert time.monotonic() - started < 1.0

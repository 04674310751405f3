"""The Redis store beyond the shared contract: native expiry, several instances, its keys.

Against the real Redis on 127.0.0.1:6379 (tests/stores.py fails, never skips,
when it is down), each store under a key prefix of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from proxy.store.base import FencedOut, ResponseIn, SessionRef, SummaryIn
from proxy.store.redis import RedisStore, RedisStoreError
from proxy.store.redis_vectors import RedisVectorIndex
from proxy.store.search_backends import vector_index_for
from proxy.store.vectors import ItemVector
from tests.servers import require_redis
from tests.store.test_responses import chained
from tests.stores import ALICE, ScratchRedisStore, msg, req

SYSTEM, U1, A1, U2 = (
    msg("system", "s"),
    msg("user", "hi"),
    msg("assistant", "hello"),
    msg("user", "?"),
)

Opener = Callable[..., Awaitable[RedisStore]]


@pytest.fixture
async def open_store() -> AsyncIterator[Opener]:
    """Open Redis stores (``prefix=`` another's to share its data, as a second instance would)."""
    opened: list[RedisStore] = []

    async def open_one(**options: Any) -> RedisStore:
        prefix = options.pop("prefix", None)
        store = ScratchRedisStore(require_redis(), **options)
        if prefix is not None:
            store.prefix = prefix
        await store.open()
        opened.append(store)
        return store

    yield open_one
    for store in reversed(opened):
        await store.close()


async def keys(store: RedisStore) -> set[str]:
    """Every key under the store's prefix, the prefix left out."""
    client = Redis.from_url(require_redis())
    try:
        found = {k.decode() async for k in client.scan_iter(match=store.prefix + "*")}
    finally:
        await client.aclose()
    return {k.removeprefix(store.prefix) for k in found}


COUNTERS = {"seq:s", "seq:i", "seq:m"}


async def fill(store: RedisStore, session: SessionRef = ALICE) -> str:
    """One of everything: an orphan row, an exchange, a vector, a response, a summary.

    Returns a request id.
    """
    tenant, key = session.tenant, session.key
    await store.record_exchange(session, [], None, req(tenant, session_key=key, status=502))
    record = req(tenant, session_key=key)
    stored = await store.record_exchange(session, [SYSTEM, U1], A1, record)
    assert stored is not None
    vector = ItemVector(stored.item_ids[1], 1, U1.content_hash, b"\x00\x3c")
    await RedisVectorIndex(store).put_vectors(session, [vector])
    assert len((await RedisVectorIndex(store).vectors(session)).rows) == 1
    response = ResponseIn("resp_1", {"id": "resp_1"}, "completed")
    await store.record_response(session, [SYSTEM, U1, A1, U2], [A1], response, req(tenant))
    await store.save_summary(session, [SYSTEM, U1, A1], SummaryIn(text="they met"))
    return record.id


async def test_a_session_expires_natively_with_every_key_of_it(open_store: Opener) -> None:
    store = await open_store(ttl_s=0.3, expire_grace_s=0.0)
    request_id = await fill(store)
    assert await store.get_session(ALICE) is not None

    await asyncio.sleep(0.6)

    # No sweep ran: Redis itself expired the session; reads skip what it left in the indexes.
    assert await store.get_session(ALICE) is None
    assert await store.history(ALICE) == []
    assert await store.requests(ALICE) == []
    assert await store.request(request_id) is None
    assert await store.summaries(ALICE) == []
    assert await store.get_response(ALICE.tenant, "resp_1") is None
    assert not await store.response_exists("resp_1")
    assert await store.list_sessions() == []
    assert await store.list_sessions(tenant=ALICE.tenant) == []
    # The sweep finds nothing to delete, and drops the index entries no read came across.
    assert await store.delete_idle_sessions(older_than=float("inf")) == 0
    assert await keys(store) == COUNTERS


async def test_a_sweep_alone_drops_what_a_native_expiry_left(open_store: Opener) -> None:
    store = await open_store(ttl_s=0.2, expire_grace_s=0.0)
    await fill(store)
    await asyncio.sleep(0.4)
    assert await store.delete_idle_sessions(older_than=float("inf")) == 0
    assert await keys(store) == COUNTERS


async def test_activity_renews_the_ttl_and_a_failed_call_does_not(open_store: Opener) -> None:
    store = await open_store(ttl_s=0.5, expire_grace_s=0.0)
    await store.record_exchange(ALICE, [U1], A1, req())
    await asyncio.sleep(0.3)
    await store.record_exchange(ALICE, [U1, A1, U2], None, req())  # activity: renewed
    await asyncio.sleep(0.3)
    assert await store.get_session(ALICE) is not None
    await store.record_exchange(ALICE, [], None, req(status=502))  # not activity
    await asyncio.sleep(0.3)
    assert await store.get_session(ALICE) is None
    assert await store.requests(ALICE) == []


async def test_without_a_ttl_nothing_expires(open_store: Opener) -> None:
    store = await open_store()
    await fill(store)
    client = Redis.from_url(require_redis())
    try:
        ttls = {k: await client.pttl(store.prefix + k) for k in await keys(store)}
    finally:
        await client.aclose()
    assert set(ttls.values()) == {-1}


async def test_the_default_grace_leaves_the_sweep_the_first_go(open_store: Opener) -> None:
    store = await open_store(ttl_s=600.0)
    await store.record_exchange(ALICE, [U1], A1, req())
    client = Redis.from_url(require_redis())
    try:
        left = await client.pttl(f"{store.prefix}s:1")
    finally:
        await client.aclose()
    # session.ttl plus a tenth of it (the sweep's interval) plus a minute.
    assert 600_000 + 60_000 < left <= 600_000 + 60_000 + 60_000


async def test_deleting_a_session_leaves_no_key_behind(open_store: Opener) -> None:
    store = await open_store()
    await fill(store)
    other = SessionRef(ALICE.tenant, "other")
    await fill(store, other)

    assert await store.delete_session(ALICE)
    assert await store.delete_idle_sessions(older_than=float("inf")) == 1
    assert await keys(store) == COUNTERS


async def test_the_sweep_deletes_more_sessions_than_one_batch(open_store: Opener) -> None:
    store = await open_store()
    for i in range(450):
        await store.record_exchange(
            SessionRef("t", f"s{i}"), [U1], A1, req("t", session_key=f"s{i}")
        )
    assert await store.delete_idle_sessions(older_than=float("inf")) == 450
    assert await store.list_sessions() == []


async def test_two_instances_share_every_session(open_store: Opener) -> None:
    a = await open_store()
    b = await open_store(prefix=a.prefix)
    first = await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    # b resends a's history: nothing is stored twice.
    second = await b.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, req())
    assert first is not None and second is not None
    assert second.new_messages == 1
    assert second.item_ids[:3] == [*first.item_ids, first.reply_id]
    assert [h.message for h in await a.history(ALICE)] == [
        SYSTEM.message,
        U1.message,
        A1.message,
        U2.message,
    ]


async def test_a_chain_cached_by_one_instance_is_not_trusted_after_another_recreates_the_session(
    open_store: Opener,
) -> None:
    a = await open_store()
    b = await open_store(prefix=a.prefix)
    old = await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    # b deletes the session and a new one takes its name, with other items.
    assert await b.delete_session(ALICE)
    fresh = await b.record_exchange(ALICE, [U2], None, req())
    assert old is not None and fresh is not None and fresh.session_id != old.session_id

    # a still caches the old chain; resending it must store it anew in the new session.
    again = await a.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, req())
    assert again is not None
    assert again.session_id == fresh.session_id
    assert again.new_messages == 4
    assert not set(again.item_ids) & {*old.item_ids, old.reply_id}
    history = await b.history(ALICE)
    assert [h.id for h in history] == again.item_ids
    assert [h.parent_id for h in history] == [None, *again.item_ids[:-1]]
    info = await b.get_session(ALICE)
    assert info is not None and (info.item_count, info.stored_tokens) == (5, 15)


async def test_concurrent_exchanges_through_two_instances_store_each_message_once(
    open_store: Opener,
) -> None:
    a = await open_store()
    b = await open_store(prefix=a.prefix)
    prefix = [SYSTEM, U1, A1]
    results = await asyncio.gather(
        *(
            (a if i % 2 else b).record_exchange(
                ALICE, [*prefix, msg("user", f"q{i}")], msg("assistant", f"a{i}"), req()
            )
            for i in range(40)
        )
    )
    assert len({tuple(r.item_ids[:3]) for r in results if r is not None}) == 1
    info = await a.get_session(ALICE)
    assert info is not None and (info.item_count, info.request_count) == (3 + 80, 40)


async def test_an_unreachable_redis_fails_open_with_the_address() -> None:
    store = RedisStore("redis://:secret@127.0.0.1:1/0")
    with pytest.raises(
        RedisStoreError, match=r"cannot reach Redis at redis://\*\*\*@127.0.0.1:1/0"
    ):
        await store.open()
    with pytest.raises(RuntimeError, match="not open"):
        await store.history(ALICE)


async def test_a_write_with_an_older_fencing_token_is_refused_and_leaves_nothing(
    open_store: Opener,
) -> None:
    first = await open_store()
    second = await open_store(prefix=first.prefix)
    await first.record_exchange(ALICE, [U1], A1, req(detail={"fence": 200}))
    before = await first.get_session(ALICE)
    stale = req(detail={"fence": 100})  # a holder whose lease ran out, writing late
    with pytest.raises(FencedOut):
        await second.record_exchange(ALICE, [U1, A1, msg("user", "late")], A1, stale)
    assert await first.get_session(ALICE) == before
    assert await first.request(stale.id) is None
    # The current holder (same or newer token) writes as usual.
    same = await second.record_exchange(ALICE, [U1, A1, U2], None, req(detail={"fence": 200}))
    newer = await second.record_exchange(
        ALICE, [U1, A1, U2, msg("user", "now")], None, req(detail={"fence": 300})
    )
    assert same is not None and newer is not None and newer.new_messages == 1
    with pytest.raises(FencedOut):
        await first.record_exchange(ALICE, [U1], None, req(detail={"fence": 200}))


async def test_exchanges_queued_together_go_out_in_one_pipeline_and_retry_in_the_next(
    open_store: Opener,
) -> None:
    a = await open_store()
    b = await open_store(prefix=a.prefix)  # cold: must send whole histories, words on demand
    refs = [SessionRef("t", f"s{i}") for i in range(12)]
    chats = {r: [msg("user", f"{r.key} {n}") for n in range(8)] for r in refs}
    for ref in refs:
        await a.record_exchange(ref, chats[ref], None, req("t", session_key=ref.key))
    results = await asyncio.gather(
        *(
            b.record_exchange_soon(
                ref, [*chats[ref], msg("user", "new")], A1, req("t", session_key=ref.key)
            )
            for ref in refs
        )
    )
    assert [r.new_messages for r in results if r is not None] == [1] * 12
    for ref in refs:
        assert len(await a.history(ref)) == 10


async def test_a_script_redis_lost_is_loaded_again(open_store: Opener) -> None:
    store = await open_store()
    # As after a Redis restart: the script's hash is unknown to the server.
    store._scripts["RECORD"].sha = "0" * 40
    assert await store.record_exchange(ALICE, [U1], A1, req()) is not None
    assert [h.message for h in await store.history(ALICE)] == [U1.message, A1.message]


async def test_names_with_separators_and_non_ascii_stay_apart_and_are_deleted_whole(
    open_store: Opener,
) -> None:
    store = await open_store()
    # "a:b" + "c" and "a" + "b:c" must not share a key; byte lengths, not characters.
    one, two = SessionRef("a:b", "c"), SessionRef("a", "b:c")
    odd = SessionRef("tënant 🚀", "clé/ü:1")
    for ref in (one, two, odd):
        await store.record_exchange(ref, [U1], A1, req(ref.tenant, session_key=ref.key))
        await store.record_response(
            ref, [U2], [A1], ResponseIn(f"r-{ref.key}", {}, "completed"), req(ref.tenant)
        )
    assert len({(await store.get_session(r)).id for r in (one, two, odd)}) == 3  # type: ignore[union-attr]
    assert [s.key for s in await store.list_sessions(tenant=odd.tenant)] == [odd.key]
    assert await store.delete_idle_sessions(older_than=float("inf")) == 3
    assert await keys(store) == {"seq:s", "seq:i"}  # no summary: no summary counter


async def session_state(store: RedisStore, sid: int) -> dict[str, Any]:
    """The session's recall index and counters as Redis holds them."""
    client = Redis.from_url(require_redis())
    try:
        index = await client.hgetall(f"{store.prefix}x:{sid}")
        counters = await client.hmget(f"{store.prefix}s:{sid}", "n", "w", "xn", "xl", "h")
        paths = await client.hlen(f"{store.prefix}p:{sid}")
    finally:
        await client.aclose()
    return {"index": index, "counters": counters, "paths": paths}


async def test_a_deleted_response_leaves_the_index_as_if_it_had_never_been(
    open_store: Opener,
) -> None:
    def response(rid: str, previous: str | None = None) -> ResponseIn:
        return ResponseIn(rid, {"id": rid}, "completed", "m", previous)

    first_in = [msg("user", "my parcel goes to Lyon")]
    first_out = [msg("assistant", "noted: Lyon")]
    second_in = [*first_in, *first_out, msg("user", "and the invoice to Paris")]
    second_out = [msg("assistant", "noted: Paris invoice")]
    deleted, never = await open_store(), await open_store()
    for store in (deleted, never):
        await store.record_response(
            ALICE, first_in, first_out, response("r1"), req(detail={"response_id": "r1"})
        )
    result = await deleted.record_response(
        ALICE, second_in, second_out, response("r2", "r1"), req(detail={"response_id": "r2"})
    )
    assert await deleted.delete_response(ALICE.tenant, "r2")

    assert await session_state(deleted, result.session_id) == await session_state(
        never, result.session_id
    )


async def test_a_deleted_responses_vectors_leave_redis_and_cursors_stay_positions(
    open_store: Opener,
) -> None:
    store = await open_store()
    await chained(store)
    items = await store.history(ALICE)
    index = vector_index_for(store)
    assert index is not None
    secret = b"\x11\x22"
    await index.put_vectors(
        ALICE, [ItemVector(it.id, i, it.content_hash, secret) for i, it in enumerate(items)]
    )
    assert await store.delete_response(ALICE.tenant, "resp_2")
    kept = {it.id for it in await store.history(ALICE)}
    client = Redis.from_url(require_redis())
    try:
        sid = items[0].session_id
        entries = await client.lrange(f"{store.prefix}v:{sid}", 0, -1)
        with_vector = await client.smembers(f"{store.prefix}y:{sid}")
    finally:
        await client.aclose()
    assert len(entries) == len(items)  # positions kept for readers' cursors
    assert {int(e.split(b":")[0]) for e in entries if e.endswith(secret)} == kept
    assert {int(i) for i in with_vector} == kept

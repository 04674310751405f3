"""The Store contract, run against the SQLite store and the in-memory fake alike."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.store.base import MessageIn, SessionRef, Store, positions
from tests.stores import ALICE, BACKENDS, make_store, msg, req

SYSTEM = msg("system", "be brief")
U1, A1, U2 = msg("user", "hi"), msg("assistant", "hello"), msg("user", "weather?")


def messages(items: list[Any]) -> list[dict[str, Any]]:
    return [item.message for item in items]


async def test_first_exchange_stores_every_message_and_makes_the_reply_head(store: Store) -> None:
    result = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())

    assert result is not None
    assert result.new_messages == 2
    assert len(result.item_ids) == 2
    history = await store.history(ALICE)
    assert messages(history) == messages([SYSTEM, U1, A1])
    assert [h.id for h in history] == [*result.item_ids, result.reply_id]
    assert [h.parent_id for h in history] == [None, history[0].id, history[1].id]
    info = await store.get_session(ALICE)
    assert info is not None
    assert (info.id, info.head_item_id) == (result.session_id, result.reply_id)
    assert (info.item_count, info.request_count, info.stored_tokens) == (3, 1, 9)


async def test_record_exchange_soon_stores_what_record_exchange_stores(store: Store) -> None:
    first = await store.record_exchange_soon(ALICE, [SYSTEM, U1], A1, req())
    U2 = msg("user", "second")
    # Queued together: the second resends the first's history plus a new message.
    second, none = await asyncio.gather(
        store.record_exchange_soon(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "r2"), req()),
        store.record_exchange_soon(None, [U1], None, req(session_key=None)),
    )
    assert first is not None and second is not None and none is None
    assert second.new_messages == 1
    assert second.item_ids[:3] == [*first.item_ids, first.reply_id]
    history = await store.history(ALICE)
    assert messages(history) == messages([SYSTEM, U1, A1, U2, msg("assistant", "r2")])
    info = await store.get_session(ALICE)
    assert info is not None and info.request_count == 2


async def test_resent_history_stores_only_the_new_message_and_reuses_prefix_ids(
    store: Store,
) -> None:
    first = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    reply = msg("assistant", "sunny")
    second = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], reply, req())

    assert first is not None and second is not None
    assert second.new_messages == 1
    assert second.item_ids[:3] == [*first.item_ids, first.reply_id]
    assert messages(await store.history(ALICE)) == messages([SYSTEM, U1, A1, U2, reply])
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 5 and info.head_item_id == second.reply_id


async def test_conversation_without_reply_makes_its_last_message_head(store: Store) -> None:
    result = await store.record_exchange(ALICE, [SYSTEM, U1], None, req())

    assert result is not None and result.reply_id is None
    info = await store.get_session(ALICE)
    assert info is not None and info.head_item_id == result.item_ids[-1]
    assert messages(await store.history(ALICE)) == messages([SYSTEM, U1])


async def test_edited_earlier_message_grows_a_branch_and_keeps_the_old_chain(
    store: Store,
) -> None:
    old = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "r"), req())
    edited = msg("user", "hi there")
    new = await store.record_exchange(ALICE, [SYSTEM, edited], msg("assistant", "r2"), req())

    assert old is not None and new is not None
    assert new.new_messages == 1
    assert new.item_ids[0] == old.item_ids[0]  # the shared root is not duplicated
    assert messages(await store.history(ALICE)) == messages(
        [SYSTEM, edited, msg("assistant", "r2")]
    )
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 7
    # The old chain is untouched: resending it finds every message, same ids.
    again = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "r"), req())
    assert again is not None
    assert (again.new_messages, again.item_ids, again.reply_id) == (0, old.item_ids, old.reply_id)


async def test_same_key_under_two_tenants_is_two_isolated_sessions(store: Store) -> None:
    bob = SessionRef("tenant-b", ALICE.key)
    a = await store.record_exchange(ALICE, [U1], A1, req())
    b = await store.record_exchange(bob, [U1], msg("assistant", "other"), req(tenant=bob.tenant))

    assert a is not None and b is not None
    assert a.session_id != b.session_id
    assert b.new_messages == 1  # alice's identical message is not bob's
    assert messages(await store.history(ALICE)) == messages([U1, A1])
    assert messages(await store.history(bob)) == messages([U1, msg("assistant", "other")])
    assert [r["tenant"] for r in await store.requests(bob)] == [bob.tenant]
    assert await store.delete_session(bob)
    assert await store.get_session(ALICE) is not None


async def test_failed_exchange_writes_only_the_request_row(
    store: Store, clock: Callable[[float], None]
) -> None:
    ok = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    before = await store.get_session(ALICE)
    clock(2_000.0)
    failed = req(status=502, upstream_status=500, error="boom", dropped_indexes=[0])
    result = await store.record_exchange(ALICE, [], None, failed)

    assert ok is not None and before is not None and result is not None
    assert (result.session_id, result.item_ids, result.reply_id) == (ok.session_id, [], None)
    after = await store.get_session(ALICE)
    assert after is not None and after.request_count == 2
    assert replace(after, request_count=1) == before  # head, updated_at, items: as they were
    assert messages(await store.history(ALICE)) == messages([SYSTEM, U1, A1])
    row = await store.request(failed.id)
    assert row is not None
    assert (row["session_id"], row["error"]) == (ok.session_id, "boom")
    assert row["dropped_spans"] == [[0, 1]]


async def test_failed_first_exchange_creates_no_session_but_keeps_its_name(store: Store) -> None:
    failed = req(status=502)
    assert await store.record_exchange(ALICE, [], None, failed) is None

    assert await store.get_session(ALICE) is None
    assert await store.list_sessions() == []
    rows = await store.requests(ALICE)
    assert [(r["id"], r["session_id"], r["session_key"]) for r in rows] == [
        (failed.id, None, ALICE.key)
    ]


async def test_incomplete_reply_keeps_its_status_and_the_request_flag(store: Store) -> None:
    cut = msg("assistant", "the answer is", status="incomplete")
    record = req(incomplete=True)
    result = await store.record_exchange(ALICE, [U1], cut, record)

    assert result is not None
    assert [h.status for h in await store.history(ALICE)] == ["complete", "incomplete"]
    row = await store.request(record.id)
    assert row is not None and row["incomplete"] is True and row["reply_item_id"] == result.reply_id


async def test_dropped_positions_are_stored_as_spans_that_name_the_chain(store: Store) -> None:
    record = req(dropped_indexes=[1, 2], messages_dropped=2)
    result = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, record)

    assert result is not None
    row = await store.request(record.id)
    assert row is not None
    assert row["dropped_spans"] == [[1, 3]]
    assert (row["first_item_id"], row["last_item_id"]) == (result.item_ids[0], result.item_ids[-1])
    # The chain up to the row's last item names the dropped items.
    chain = await store.history(ALICE)
    assert [chain[i].id for i in positions(row["dropped_spans"])] == result.item_ids[1:3]


async def test_a_request_rows_size_does_not_grow_with_the_session(store: Store) -> None:
    """Dropping the oldest 10 or 1,000 messages stores the same few spans."""
    sizes = []
    for n in (12, 1002):
        ref = SessionRef("tenant-a", f"long-{n}")
        chain = [SYSTEM, *(msg("user" if i % 2 else "assistant", f"m{n}-{i}") for i in range(n))]
        record = req(dropped_indexes=list(range(1, n - 1)), messages_dropped=n - 2)
        await store.record_exchange(ref, chain, None, record)
        row = await store.request(record.id)
        assert row is not None and row["dropped_spans"] == [[1, n - 1]]
        sizes.append(len(orjson.dumps(row)))
    # Only digits differ (the key, ids, span ends): a list per message was ~9 KB more.
    assert sizes[1] - sizes[0] <= 32


async def test_concurrent_exchanges_on_one_session_store_each_message_once(store: Store) -> None:
    prefix = [SYSTEM, U1, A1]
    results = await asyncio.gather(
        *(
            store.record_exchange(
                ALICE, [*prefix, msg("user", f"q{i}")], msg("assistant", f"a{i}"), req()
            )
            for i in range(20)
        )
    )

    assert all(r is not None for r in results)
    prefixes = {tuple(r.item_ids[:3]) for r in results if r is not None}
    assert len(prefixes) == 1
    assert sum(r.new_messages for r in results if r is not None) == 3 + 20
    info = await store.get_session(ALICE)
    assert info is not None
    assert (info.item_count, info.request_count) == (3 + 20 + 20, 20)


async def test_delete_session_removes_every_row(store: Store) -> None:
    other = SessionRef(ALICE.tenant, "chat-2")
    orphan = req(status=502)
    await store.record_exchange(ALICE, [], None, orphan)  # named it before it existed
    first = req()
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, first)
    await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, req())
    await store.record_exchange(other, [U1], A1, req(session_key=other.key))

    assert await store.delete_session(ALICE) is True
    assert await store.get_session(ALICE) is None
    assert await store.history(ALICE) == []
    assert await store.requests(ALICE) == []
    assert await store.request(first.id) is None and await store.request(orphan.id) is None
    assert await store.delete_session(ALICE) is False
    assert messages(await store.history(other)) == messages([U1, A1])
    # The same name starts from scratch: nothing from the deleted session is reused.
    again = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert again is not None and again.new_messages == 2
    assert messages(await store.history(ALICE)) == messages([SYSTEM, U1, A1])


async def test_delete_idle_sessions_removes_only_sessions_idle_before_the_cutoff(
    store: Store, clock: Callable[[float], None]
) -> None:
    idle, active = SessionRef("t", "idle"), SessionRef("t", "active")
    orphan = req(tenant="t", session_key="idle", status=502)
    await store.record_exchange(idle, [], None, orphan)
    await store.record_exchange(idle, [U1], A1, req(tenant="t", session_key="idle"))
    clock(1_500.0)
    await store.record_exchange(active, [U1], A1, req(tenant="t", session_key="active"))

    assert await store.delete_idle_sessions(older_than=1_500.0) == 1
    assert await store.get_session(idle) is None
    assert await store.requests(idle) == []
    assert await store.request(orphan.id) is None
    assert await store.get_session(active) is not None
    assert len(await store.requests(active)) == 1
    assert await store.delete_idle_sessions(older_than=1_500.0) == 0


async def test_list_sessions_is_newest_first_paged_and_filtered_by_tenant(
    store: Store, clock: Callable[[float], None]
) -> None:
    refs = [SessionRef("t1" if i % 2 == 0 else "t2", f"s{i}") for i in range(5)]
    for i, ref in enumerate(refs):
        clock(1_000.0 + i)
        await store.record_exchange(ref, [U1], None, req(tenant=ref.tenant, session_key=ref.key))
    clock(2_000.0)
    await store.record_exchange(refs[0], [U1, A1], None, req(tenant="t1", session_key="s0"))

    keys = [[s.key for s in await store.list_sessions(limit=2, offset=o)] for o in (0, 2, 4)]
    assert keys == [["s0", "s4"], ["s3", "s2"], ["s1"]]
    assert [s.key for s in await store.list_sessions(tenant="t2")] == ["s3", "s1"]
    assert await store.list_sessions(tenant="nobody") == []


async def test_list_sessions_finds_a_session_by_part_of_its_key_in_any_tenant(
    store: Store, clock: Callable[[float], None]
) -> None:
    refs = [SessionRef("t1", "chat-42"), SessionRef("t2", "chat-420"), SessionRef("t1", "Chat-7")]
    for i, ref in enumerate(refs):
        clock(1_000.0 + i)
        await store.record_exchange(ref, [U1], None, req(tenant=ref.tenant, session_key=ref.key))

    found = await store.list_sessions(key_contains="chat-42")
    assert [(s.tenant, s.key) for s in found] == [("t2", "chat-420"), ("t1", "chat-42")]
    assert [s.key for s in await store.list_sessions(key_contains="chat-42", tenant="t1")] == [
        "chat-42"
    ]
    # Case-sensitive, no wildcards: "%" and "_" are plain characters.
    assert [s.key for s in await store.list_sessions(key_contains="Chat")] == ["Chat-7"]
    assert await store.list_sessions(key_contains="%") == []
    assert await store.list_sessions(key_contains="_") == []
    assert [s.key for s in await store.list_sessions(key_contains="", limit=1)] == ["Chat-7"]
    assert [s.key for s in await store.list_sessions(key_contains="chat", offset=1)] == ["chat-42"]


async def test_no_session_writes_only_the_request_row(store: Store) -> None:
    record = req(session_key=None)
    assert await store.record_exchange(None, [U1], A1, record) is None

    assert await store.list_sessions() == []
    row = await store.request(record.id)
    assert row is not None
    assert (row["session_id"], row["first_item_id"], row["reply_item_id"]) == (None, None, None)


async def test_request_round_trips_every_field(store: Store) -> None:
    record = req(
        id="req-full",
        route="r1",
        policy="budget",
        model="m",
        stream=True,
        status=200,
        upstream_status=200,
        endpoint="/v1/responses",
        mode="concise",
        messages_before=4,
        messages_after=2,
        tokens_before=100,
        tokens_after=40,
        turns_dropped=1,
        messages_dropped=2,
        dropped_indexes=[1, 2],
        reason="over budget",
        error="client went away",
        incomplete=True,
        upstream_ms=12.5,
        total_ms=14.25,
        usage={"prompt_tokens": 40, "completion_tokens": 3},
        detail={"kept": [0, 3], "clips": [{"index": 3, "chars": 10}]},
        created_at=1234.5,
    )
    result = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A1, record)
    assert result is not None

    # Written out independently of request_row, so a field it forgot would show.
    # Dropped positions come back as spans (dropped_spans), not as the list recorded.
    expected = {k: v for k, v in asdict(record).items() if k != "dropped_indexes"} | {
        "session_id": result.session_id,
        "dropped_spans": [[1, 3]],
        "first_item_id": result.item_ids[0],
        "last_item_id": result.item_ids[-1],
        "reply_item_id": result.reply_id,
    }
    assert await store.request("req-full") == expected
    assert await store.requests(ALICE) == [expected]
    assert await store.request("missing") is None


async def test_duplicate_request_id_rejects_the_whole_exchange(store: Store) -> None:
    record = req()
    await store.record_exchange(ALICE, [U1], A1, record)
    before = await store.get_session(ALICE)

    with pytest.raises(ValueError, match="already stored"):
        await store.record_exchange(ALICE, [U1, A1, U2], msg("assistant", "x"), req(id=record.id))

    assert await store.get_session(ALICE) == before
    assert messages(await store.history(ALICE)) == messages([U1, A1])


async def test_stored_messages_are_copies_the_caller_cannot_change(store: Store) -> None:
    message = {"role": "user", "content": "original"}
    await store.record_exchange(ALICE, [MessageIn(message, "h1", "user")], None, req())
    message["content"] = "mutated"
    (item,) = await store.history(ALICE)
    item.message["content"] = "mutated too"

    assert [h.message for h in await store.history(ALICE)] == [
        {"role": "user", "content": "original"}
    ]


# Conversations over a tiny alphabet, so prefixes are shared, forked and resent.
_conversation = st.lists(st.integers(0, 2), min_size=0, max_size=6)
_exchange = st.tuples(_conversation, st.none() | st.integers(0, 2))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=100, deadline=None)
@given(exchanges=st.lists(_exchange, min_size=1, max_size=6))
def test_any_exchange_sequence_stores_each_distinct_prefix_once(
    backend: str, exchanges: list[tuple[list[int], int | None]]
) -> None:
    def as_message(n: int) -> MessageIn:
        return msg("user" if n % 2 == 0 else "assistant", f"m{n}")

    async def run(directory: Path) -> None:
        store = make_store(backend, directory)
        await store.open()
        try:
            prefix_ids: dict[tuple[int, ...], int] = {}  # model: one item per distinct prefix
            head: list[int] = []
            for contents, reply in exchanges:
                chain = [*contents, *([] if reply is None else [reply])]
                result = await store.record_exchange(
                    ALICE,
                    [as_message(n) for n in contents],
                    None if reply is None else as_message(reply),
                    req(),
                )
                if chain:  # else a failed call: nothing stored, the head stays
                    assert result is not None
                    new = [
                        p for p in range(1, len(contents) + 1) if tuple(chain[:p]) not in prefix_ids
                    ]
                    assert result.new_messages == len(new)
                    head = [*result.item_ids, *([result.reply_id] if result.reply_id else [])]
                    for p, item_id in enumerate(head, start=1):
                        assert prefix_ids.setdefault(tuple(chain[:p]), item_id) == item_id
                assert [h.id for h in await store.history(ALICE)] == head
            info = await store.get_session(ALICE)
            assert (info.item_count if info else 0) == len(prefix_ids)
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run(Path(directory)))


# -- behaviour the cases above leave open, pinned so every backend agrees --------


async def test_a_request_without_a_session_that_names_one_is_listed_under_that_name(
    store: Store,
) -> None:
    await store.record_exchange(ALICE, [U1], A1, req())
    named = req()  # no SessionRef given, but the row names ALICE's key
    assert await store.record_exchange(None, [U2], None, named) is None

    rows = await store.requests(ALICE)
    assert [(r["id"], r["session_id"]) for r in rows][1:] == [(named.id, None)]
    info = await store.get_session(ALICE)
    assert info is not None and (info.request_count, info.item_count) == (2, 2)


async def test_requests_are_ordered_by_their_time_then_by_the_order_written(store: Store) -> None:
    late, early, tie = req(created_at=2_000.0), req(created_at=1_500.0), req(created_at=2_000.0)
    for record in (late, early, tie):
        await store.record_exchange(ALICE, [U1], A1, record)

    assert [r["id"] for r in await store.requests(ALICE)] == [early.id, late.id, tie.id]


async def test_sessions_active_at_the_same_time_list_the_newest_first(
    store: Store, clock: Callable[[float], None]
) -> None:
    for key in ("a", "b", "c"):
        await store.record_exchange(SessionRef("t", key), [U1], None, req("t", session_key=key))

    listed = await store.list_sessions()
    assert [s.key for s in listed] == ["c", "b", "a"]
    assert [s.id for s in listed] == sorted((s.id for s in listed), reverse=True)


async def test_stored_tokens_count_each_distinct_item_once(store: Store) -> None:
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, req())  # resent: 1 new
    await store.record_exchange(ALICE, [SYSTEM, msg("user", "fork", tokens=10)], None, req())

    info = await store.get_session(ALICE)
    assert info is not None
    assert (info.item_count, info.stored_tokens) == (5, 4 * 3 + 10)

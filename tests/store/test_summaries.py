"""The Store's summaries contract, run against the SQLite store and the in-memory fake alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.store.base import (
    SessionRef,
    Store,
    SummaryIn,
    chain_path_hashes,
)
from proxy.store.memory import MemoryStore
from proxy.store.sqlite import SqliteStore
from tests.stores import ALICE, msg, req

CHAT = [msg("system", "be brief")] + [
    msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(8)
]
PATHS = chain_path_hashes([m.content_hash for m in CHAT])


def summary(text: str = "they talked", **fields: Any) -> SummaryIn:
    return SummaryIn(text=text, **fields)


async def test_a_saved_summary_round_trips_every_field(store: Store) -> None:
    saved = await store.save_summary(
        ALICE,
        CHAT[:5],
        SummaryIn(
            text="order 1234 is late",
            start_unit=1,
            facts=({"kind": "id", "value": "order 1234"},),
            flagged=("order 9999",),
            model="gpt-4o-mini",
            prompt_hash="abc",
            usage={"prompt_tokens": 10, "completion_tokens": 3},
            previous_summary_id=None,
        ),
    )
    assert saved.covers_path_hash == PATHS[4]
    assert saved.start_unit == 1
    assert saved.text == "order 1234 is late"
    assert saved.facts == [{"kind": "id", "value": "order 1234"}]
    assert saved.flagged == ["order 9999"]
    assert (saved.model, saved.prompt_hash) == ("gpt-4o-mini", "abc")
    assert saved.usage == {"prompt_tokens": 10, "completion_tokens": 3}
    assert await store.summaries(ALICE) == [saved]


async def test_saving_stores_the_covered_items_once_and_does_not_move_the_head(
    store: Store,
) -> None:
    saved = await store.save_summary(ALICE, CHAT[:5], summary())
    # A new session: nothing is its history until an exchange is recorded.
    assert await store.history(ALICE) == []
    result = await store.record_exchange(ALICE, CHAT, None, req())
    assert result is not None
    assert result.new_messages == len(CHAT) - 5
    assert result.item_ids[4] == saved.covers_item_id
    assert [i.message for i in await store.history(ALICE)] == [m.message for m in CHAT]


async def test_saving_a_summary_leaves_an_existing_sessions_activity_time_alone(
    store: Store, clock: Callable[[float], None]
) -> None:
    await store.record_exchange(ALICE, CHAT[:3], msg("assistant", "reply"), req())
    before = await store.get_session(ALICE)
    clock(2_000.0)
    await store.save_summary(ALICE, CHAT[:3], summary())
    after = await store.get_session(ALICE)
    assert before is not None and after is not None
    assert after.updated_at == before.updated_at == 1_000.0
    assert after.head_item_id == before.head_item_id


async def test_summaries_for_finds_those_covering_a_prefix_longest_first(store: Store) -> None:
    short = await store.save_summary(ALICE, CHAT[:3], summary("short"))
    long = await store.save_summary(ALICE, CHAT[:7], summary("long", previous_summary_id=short.id))
    assert long.previous_summary_id == short.id
    assert await store.summaries_for(ALICE, PATHS) == [long, short]
    assert await store.summaries_for(ALICE, PATHS, limit=1) == [long]
    # A shorter chain only reaches the short one.
    assert await store.summaries_for(ALICE, PATHS[:5]) == [short]


async def test_summaries_on_another_branch_are_not_found(store: Store) -> None:
    await store.save_summary(ALICE, CHAT[:5], summary())
    edited = [*CHAT[:3], msg("assistant", "an edited reply"), *CHAT[4:]]
    paths = chain_path_hashes([m.content_hash for m in edited])
    found = await store.summaries_for(ALICE, paths)
    assert found == []
    # The shared prefix still finds a summary covering only it.
    prefix = await store.save_summary(ALICE, CHAT[:3], summary("prefix"))
    assert await store.summaries_for(ALICE, paths) == [prefix]


async def test_one_summary_per_range_the_first_stored_wins(store: Store) -> None:
    first = await store.save_summary(ALICE, CHAT[:5], summary("first"))
    again = await store.save_summary(ALICE, CHAT[:5], summary("second"))
    assert again == first
    assert [s.text for s in await store.summaries(ALICE)] == ["first"]
    # Another start is another range.
    other = await store.save_summary(ALICE, CHAT[:5], summary("from turn 1", start_unit=1))
    assert other.id != first.id
    assert len(await store.summaries(ALICE)) == 2


async def test_summaries_are_scoped_by_tenant(store: Store) -> None:
    await store.save_summary(ALICE, CHAT[:5], summary())
    bob = SessionRef("tenant-b", ALICE.key)
    assert await store.summaries(bob) == []
    assert await store.summaries_for(bob, PATHS) == []


async def test_deleting_the_session_deletes_its_summaries(store: Store) -> None:
    await store.save_summary(ALICE, CHAT[:5], summary())
    assert await store.delete_session(ALICE)
    assert await store.summaries(ALICE) == []
    assert await store.summaries_for(ALICE, PATHS) == []


async def test_expiry_deletes_an_idle_sessions_summaries(
    store: Store, clock: Callable[[float], None]
) -> None:
    await store.save_summary(ALICE, CHAT[:5], summary())
    clock(5_000.0)
    assert await store.delete_idle_sessions(older_than=4_000.0) == 1
    assert await store.summaries(ALICE) == []


async def test_a_summary_must_cover_something(store: Store) -> None:
    with pytest.raises(ValueError):
        await store.save_summary(ALICE, [], summary())
    assert await store.summaries(ALICE) == []


async def _known_agrees(store: Store, ref: SessionRef, paths: list[str]) -> list[Any]:
    """What ``summaries_known`` tells with no read, then what a read finds: the same, or
    None; the read's answer."""
    known = store.summaries_known(ref, paths)
    found = await store.summaries_for(ref, paths)
    assert known is None or known == found, (known, found)
    return found


async def test_summaries_known_with_no_read_is_what_a_read_finds_after_every_write(
    store: Store,
) -> None:
    assert await _known_agrees(store, ALICE, PATHS) == []
    short = await store.save_summary(ALICE, CHAT[:3], summary("short"))
    assert await _known_agrees(store, ALICE, PATHS) == [short]
    long = await store.save_summary(ALICE, CHAT[:7], summary("long", previous_summary_id=short.id))
    assert await _known_agrees(store, ALICE, PATHS) == [long, short]
    assert await _known_agrees(store, ALICE, PATHS[:5]) == [short]
    edited = [*CHAT[:3], msg("assistant", "an edited reply"), *CHAT[4:]]
    branch = chain_path_hashes([m.content_hash for m in edited])
    assert await _known_agrees(store, ALICE, branch) == [short]
    assert await _known_agrees(store, SessionRef("tenant-b", ALICE.key), PATHS) == []
    await store.record_exchange(ALICE, CHAT, msg("assistant", "reply"), req())
    assert await _known_agrees(store, ALICE, PATHS) == [long, short]
    assert await store.delete_session(ALICE)
    assert await _known_agrees(store, ALICE, PATHS) == []
    # Made again, the session has none.
    await store.record_exchange(ALICE, CHAT[:3], None, req())
    assert await _known_agrees(store, ALICE, PATHS) == []


async def test_the_process_local_stores_know_a_read_sessions_summaries_with_no_read(
    tmp_path: Path,
) -> None:
    # SQLite memoizes what it read (every write goes through this process); the fake
    # holds everything. The shared stores always read (tested above to answer None or
    # the truth).
    for store in (SqliteStore(tmp_path / "s.sqlite"), MemoryStore()):
        await store.open()
        try:
            saved = await store.save_summary(ALICE, CHAT[:5], summary())
            await store.summaries_for(ALICE, PATHS)
            assert store.summaries_known(ALICE, PATHS) == [saved]
            assert store.summaries_known(ALICE, PATHS[:3]) == []
        finally:
            await store.close()

"""The Store's Responses API contract, run against the SQLite store and the in-memory fake alike."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from proxy.responses.chain import previous_chain
from proxy.store.base import (
    MessageIn,
    RequestRecord,
    ResponseIn,
    SessionRef,
    Store,
    StoredItem,
    SummaryIn,
)
from proxy.store.search_backends import recall_index_for
from tests.stores import ALICE
from tests.stores import req as store_req


def req(tenant: str = ALICE.tenant, **fields: Any) -> RequestRecord:
    """A request row of the Responses endpoint."""
    return store_req(tenant, **({"endpoint": "/v1/responses"} | fields))


BOB_TENANT = "tenant-b"


def item(data: dict[str, Any], tokens: int = 2) -> MessageIn:
    digest = hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()
    role = data.get("role") or data.get("type") or "message"
    return MessageIn(data, digest, str(role), tokens)


def user(text: str) -> MessageIn:
    return item({"role": "user", "content": text})


def said(text: str, n: int) -> MessageIn:
    return item(
        {
            "type": "message",
            "id": f"msg_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    )


def resp(rid: str, previous: str | None = None, status: str = "completed") -> ResponseIn:
    body = {"id": rid, "object": "response", "status": status, "previous_response_id": previous}
    return ResponseIn(
        id=rid, response=body, status=status, model="m", previous_response_id=previous
    )


def raw(items: list[StoredItem] | list[MessageIn]) -> list[dict[str, Any]]:
    return [i.message for i in items]


FIRST_IN = [item({"role": "developer", "content": "be brief"}), user("hi")]
FIRST_OUT = [said("hello", 1)]


async def test_response_maps_its_id_to_the_session_and_both_chain_ends(store: Store) -> None:
    record = req()
    result = await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), record)

    stored = await store.get_response(ALICE.tenant, "resp_1")
    assert stored is not None
    assert (stored.session_id, stored.session_key) == (result.session_id, ALICE.key)
    assert stored.input_head_item_id == result.item_ids[-1]
    assert stored.head_item_id == result.reply_id
    assert (stored.status, stored.model, stored.previous_response_id) == ("completed", "m", None)
    assert stored.response == resp("resp_1").response
    assert raw(await store.response_chain(ALICE.tenant, "resp_1")) == raw(FIRST_IN + FIRST_OUT)
    assert raw(await store.response_input_items(ALICE.tenant, "resp_1")) == raw(FIRST_IN)
    # The items are the session's: its history is the chain, its head the last output.
    assert raw(await store.history(ALICE)) == raw(FIRST_IN + FIRST_OUT)
    row = await store.request(record.id)
    assert row is not None
    assert (row["session_id"], row["reply_item_id"]) == (result.session_id, result.reply_id)
    assert row["endpoint"] == "/v1/responses"


async def test_chained_response_reuses_the_stored_prefix(store: Store) -> None:
    first = await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())
    conversation = [*FIRST_IN, *FIRST_OUT, user("and you?")]
    second = await store.record_response(
        ALICE, conversation, [said("fine", 2)], resp("resp_2", "resp_1"), req()
    )

    assert second.new_messages == 1
    assert second.item_ids[:3] == [*first.item_ids, first.reply_id]
    chain = await store.response_chain(ALICE.tenant, "resp_2")
    assert raw(chain) == raw([*conversation, said("fine", 2)])
    assert [c.parent_id for c in chain[1:]] == [c.id for c in chain[:-1]]
    # The earlier response still ends where it ended.
    assert raw(await store.response_chain(ALICE.tenant, "resp_1")) == raw(FIRST_IN + FIRST_OUT)
    stored = await store.get_response(ALICE.tenant, "resp_2")
    assert stored is not None and stored.previous_response_id == "resp_1"


async def test_a_response_says_which_ids_its_output_items_got(store: Store) -> None:
    """The background embedder finds a response's output items by these ids."""
    call = item({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"})
    output = [said("thinking aloud", 1), call]
    result = await store.record_response(ALICE, FIRST_IN, output, resp("resp_1"), req())

    chain = await store.response_chain(ALICE.tenant, "resp_1")
    assert list(result.output_ids) == [c.id for c in chain[len(FIRST_IN) :]]
    assert result.output_ids[-1] == result.reply_id


async def test_two_responses_to_one_previous_fork_the_chain(store: Store) -> None:
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())
    base = [*FIRST_IN, *FIRST_OUT]
    await store.record_response(ALICE, [*base, user("a")], [said("A", 2)], resp("resp_a"), req())
    await store.record_response(ALICE, [*base, user("b")], [said("B", 3)], resp("resp_b"), req())

    a = await store.response_chain(ALICE.tenant, "resp_a")
    b = await store.response_chain(ALICE.tenant, "resp_b")
    assert [i.id for i in a[:3]] == [i.id for i in b[:3]]
    assert raw(a[3:]) == raw([user("a"), said("A", 2)])
    assert raw(b[3:]) == raw([user("b"), said("B", 3)])


async def test_another_tenant_can_neither_read_chain_nor_delete_a_response(store: Store) -> None:
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())

    assert await store.get_response(BOB_TENANT, "resp_1") is None
    assert await store.response_chain(BOB_TENANT, "resp_1") == []
    assert await store.response_input_items(BOB_TENANT, "resp_1") == []
    assert not await store.delete_response(BOB_TENANT, "resp_1")
    assert await store.get_response(ALICE.tenant, "resp_1") is not None
    # Known to exist (so the proxy refuses it) without saying whose it is.
    assert await store.response_exists("resp_1")
    assert not await store.response_exists("resp_unknown")


async def test_deleting_the_only_response_leaves_nothing_of_it(store: Store) -> None:
    record = req(detail={"response_id": "resp_1"})
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), record)
    await store.save_summary(ALICE, FIRST_IN, SummaryIn(text="a developer said hi"))

    assert await store.delete_response(ALICE.tenant, "resp_1")
    assert not await store.delete_response(ALICE.tenant, "resp_1")
    assert await store.get_response(ALICE.tenant, "resp_1") is None
    assert await store.response_chain(ALICE.tenant, "resp_1") == []
    assert not await store.response_exists("resp_1")
    # Its items, its request row, the summary of its items, the recall index
    # entries, and the session it alone filled.
    assert await store.history(ALICE) == []
    assert await store.request(record.id) is None
    assert await store.summaries(ALICE) == []
    assert await store.get_session(ALICE) is None
    assert await search(store, "hello") == []


async def chained(store: Store) -> tuple[RequestRecord, RequestRecord]:
    """resp_1, then resp_2 continuing it; their request rows."""
    first, second = req(detail={"response_id": "resp_1"}), req(detail={"response_id": "resp_2"})
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), first)
    await store.record_response(ALICE, SECOND_IN, SECOND_OUT, resp("resp_2", "resp_1"), second)
    return first, second


SECOND_IN = [*FIRST_IN, *FIRST_OUT, user("and you?")]
SECOND_OUT = [said("fine, thanks", 2)]


async def test_deleting_the_last_response_keeps_the_chain_it_continued(store: Store) -> None:
    first, second = await chained(store)
    await store.save_summary(ALICE, FIRST_IN, SummaryIn(text="kept"))
    await store.save_summary(ALICE, SECOND_IN, SummaryIn(text="goes"))

    assert await store.delete_response(ALICE.tenant, "resp_2")
    assert raw(await store.response_chain(ALICE.tenant, "resp_1")) == raw(FIRST_IN + FIRST_OUT)
    # The session's head moves back to the last item that stays.
    assert raw(await store.history(ALICE)) == raw(FIRST_IN + FIRST_OUT)
    info = await store.get_session(ALICE)
    assert info is not None and (info.item_count, info.stored_tokens) == (3, 6)
    assert [r["id"] for r in await store.requests(ALICE)] == [first.id]
    assert await store.request(second.id) is None
    assert [s.text for s in await store.summaries(ALICE)] == ["kept"]
    assert await search(store, "thanks") == []
    assert len(await search(store, "hello")) == 1
    # The chain grows again from there, through the same items.
    again = await store.record_response(
        ALICE, SECOND_IN, [said("great", 3)], resp("resp_3", "resp_1"), req()
    )
    chain = await store.response_chain(ALICE.tenant, "resp_3")
    assert raw(chain) == raw([*SECOND_IN, said("great", 3)])
    assert [c.parent_id for c in chain[1:]] == [c.id for c in chain[:-1]]
    assert again.new_messages == 1


async def test_a_response_recorded_again_after_its_deletion_is_stored_whole(store: Store) -> None:
    # The same content as the deleted one: no cached id of a deleted item is reused.
    await chained(store)
    assert await store.delete_response(ALICE.tenant, "resp_2")
    again = await store.record_response(ALICE, SECOND_IN, SECOND_OUT, resp("resp_2b"), req())

    chain = await store.response_chain(ALICE.tenant, "resp_2b")
    assert raw(chain) == raw(SECOND_IN + SECOND_OUT)
    assert [c.parent_id for c in chain[1:]] == [c.id for c in chain[:-1]]
    assert [c.id for c in chain[:-1]] == again.item_ids
    assert raw(await store.history(ALICE)) == raw(SECOND_IN + SECOND_OUT)
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 5
    assert len(await search(store, "thanks")) == 1


async def test_deleting_an_earlier_response_keeps_what_a_later_one_chains_through(
    store: Store,
) -> None:
    _, second = await chained(store)

    assert await store.delete_response(ALICE.tenant, "resp_1")
    assert await store.get_response(ALICE.tenant, "resp_1") is None
    assert raw(await store.response_chain(ALICE.tenant, "resp_2")) == raw(SECOND_IN + SECOND_OUT)
    assert raw(await store.response_input_items(ALICE.tenant, "resp_2")) == raw(SECOND_IN)
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 5
    assert [r["id"] for r in await store.requests(ALICE)] == [second.id]
    assert len(await search(store, "hello")) == 1


async def test_deleting_one_branch_of_a_fork_keeps_the_other(store: Store) -> None:
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), own("resp_1"))
    base = [*FIRST_IN, *FIRST_OUT]
    await store.record_response(
        ALICE, [*base, user("a")], [said("A", 2)], resp("resp_a"), own("resp_a")
    )
    await store.record_response(
        ALICE, [*base, user("b")], [said("B", 3)], resp("resp_b"), own("resp_b")
    )

    assert await store.delete_response(ALICE.tenant, "resp_b")
    assert raw(await store.response_chain(ALICE.tenant, "resp_a")) == raw(
        [*base, user("a"), said("A", 2)]
    )
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 5
    # resp_1 now ends where a branch hangs: deleting it deletes no item.
    assert await store.delete_response(ALICE.tenant, "resp_1")
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 5


async def test_items_a_chat_request_ends_at_stay(store: Store) -> None:
    # A history: server chat turn in the same session, ending at the response's reply.
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), own("resp_1"))
    chat = store_req(ALICE.tenant)
    await store.record_exchange(ALICE, FIRST_IN, FIRST_OUT[0], chat)

    assert await store.delete_response(ALICE.tenant, "resp_1")
    assert raw(await store.history(ALICE)) == raw(FIRST_IN + FIRST_OUT)
    assert await store.request(chat.id) is not None
    info = await store.get_session(ALICE)
    assert info is not None and info.item_count == 3


async def test_items_of_a_chat_turn_after_the_response_stay(store: Store) -> None:
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), own("resp_1"))
    later = [*FIRST_IN, *FIRST_OUT, user("more")]
    await store.record_exchange(ALICE, later, msg_item("sure"), store_req(ALICE.tenant))

    assert await store.delete_response(ALICE.tenant, "resp_1")
    assert raw(await store.history(ALICE)) == raw([*later, msg_item("sure")])


def own(response_id: str) -> RequestRecord:
    """The response's own request row (the pipeline names the response in its detail)."""
    return req(detail={"response_id": response_id})


def msg_item(text: str) -> MessageIn:
    return item({"role": "assistant", "content": text})


async def search(store: Store, word: str) -> list[int]:
    index = recall_index_for(store)
    assert index is not None
    return [hit.item_id for hit in await index.search(ALICE, [word], limit=10)]


@pytest.mark.parametrize("how", ["delete_session", "expire"])
async def test_deleting_the_session_deletes_its_responses(
    store: Store, clock: Callable[[float], None], how: str
) -> None:
    other = SessionRef(ALICE.tenant, "other")
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())
    clock(5_000.0)
    await store.record_response(other, FIRST_IN, FIRST_OUT, resp("resp_2"), req())

    if how == "delete_session":
        assert await store.delete_session(ALICE)
    else:
        assert await store.delete_idle_sessions(older_than=2_000.0) == 1

    assert await store.get_response(ALICE.tenant, "resp_1") is None
    assert not await store.response_exists("resp_1")
    assert await store.get_response(ALICE.tenant, "resp_2") is not None


async def test_a_response_id_recorded_again_is_remapped(store: Store) -> None:
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())
    elsewhere = SessionRef(ALICE.tenant, "elsewhere")
    again = await store.record_response(
        elsewhere, [user("new")], [said("x", 9)], resp("resp_1", status="incomplete"), req()
    )

    stored = await store.get_response(ALICE.tenant, "resp_1")
    assert stored is not None
    assert (stored.session_key, stored.status) == ("elsewhere", "incomplete")
    assert stored.head_item_id == again.reply_id
    assert raw(await store.response_chain(ALICE.tenant, "resp_1")) == raw(
        [user("new"), said("x", 9)]
    )


async def test_response_without_output_ends_at_its_input(store: Store) -> None:
    result = await store.record_response(ALICE, FIRST_IN, [], resp("resp_1"), req())

    stored = await store.get_response(ALICE.tenant, "resp_1")
    assert stored is not None and result.reply_id is None
    assert stored.head_item_id == stored.input_head_item_id == result.item_ids[-1]
    assert raw(await store.response_chain(ALICE.tenant, "resp_1")) == raw(FIRST_IN)


async def test_response_with_no_items_at_all_has_an_empty_chain(store: Store) -> None:
    result = await store.record_response(ALICE, [], [], resp("resp_1"), req())

    stored = await store.get_response(ALICE.tenant, "resp_1")
    assert stored is not None
    assert (stored.head_item_id, stored.input_head_item_id) == (None, None)
    assert await store.response_chain(ALICE.tenant, "resp_1") == []
    assert (result.item_ids, result.reply_id) == ([], None)


async def test_rejected_response_leaves_nothing_behind(store: Store) -> None:
    duplicate = req()
    await store.record_response(ALICE, [user("x")], [], resp("resp_0"), duplicate)

    with pytest.raises(ValueError, match="already stored"):
        await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), duplicate)

    assert await store.get_response(ALICE.tenant, "resp_1") is None
    assert raw(await store.history(ALICE)) == raw([user("x")])


async def test_a_remapped_response_survives_the_deletion_of_its_first_session(
    store: Store,
) -> None:
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())
    elsewhere = SessionRef(ALICE.tenant, "elsewhere")
    await store.record_response(elsewhere, [user("new")], [said("x", 9)], resp("resp_1"), req())

    assert await store.delete_session(ALICE)
    stored = await store.get_response(ALICE.tenant, "resp_1")
    assert stored is not None and stored.session_key == "elsewhere"
    assert await store.response_exists("resp_1")
    assert raw(await store.response_chain(ALICE.tenant, "resp_1")) == raw(
        [user("new"), said("x", 9)]
    )


async def test_a_previous_response_chain_is_the_sessions_or_its_prefix(store: Store) -> None:
    """``previous_chain`` (proxy/responses/chain.py) answers as the store's own walk
    does: the session's chain when the response is its last, its prefix for an
    earlier one, the walk for a branch the session's head is not on."""
    await store.record_response(ALICE, FIRST_IN, FIRST_OUT, resp("resp_1"), req())
    base = [*FIRST_IN, *FIRST_OUT]
    await store.record_response(ALICE, [*base, user("a")], [said("A", 2)], resp("resp_a"), req())
    await store.record_response(ALICE, [*base, user("b")], [said("B", 3)], resp("resp_b"), req())
    two = [*base, user("b"), said("B", 3)]
    await store.record_response(ALICE, [*two, user("c")], [said("C", 4)], resp("resp_c"), req())

    for rid in ("resp_1", "resp_a", "resp_b", "resp_c"):
        previous = await store.get_response(ALICE.tenant, rid)
        assert previous is not None
        got = await previous_chain(store, previous)
        walked = await store.response_chain(ALICE.tenant, rid)
        assert [(i.id, i.parent_id) for i in got] == [(i.id, i.parent_id) for i in walked], rid
        assert raw(got) == raw(walked)
        # The caller's own copies: the session's cached chain is not changed through them.
        got[-1].message["content"] = "changed"
    assert raw(await store.response_chain(ALICE.tenant, "resp_c"))[-1] == said("C", 4).message

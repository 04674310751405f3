"""A `history: server` turn checks and counts only the items stored since the session's last."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import InvalidRequest
from proxy.http.history_view import HistoryViews
from proxy.http.shape import check_chat_history
from proxy.store.base import SessionRef, StoredItem

REF = SessionRef("t", "s")
HOW = ("o200k_base", 1.0)


def tokens(item: StoredItem) -> int:
    return item.token_count or 0


def left_out(views: HistoryViews, chain: list[StoredItem], ref: SessionRef = REF) -> list[int]:
    return views.view(ref, chain, HOW, tokens).left_out


def item(i: int, message: dict[str, Any], status: str = "complete") -> StoredItem:
    role = str(message.get("role", "assistant"))
    return StoredItem(i, 1, i - 1 or None, f"p{i}", f"c{i}", role, i, message, status, 0.0)


def user(i: int) -> StoredItem:
    return item(i, {"role": "user", "content": f"q{i}"})


def reply(i: int, *, whole: bool = True) -> StoredItem:
    if whole:
        return item(i, {"role": "assistant", "content": f"a{i}"})
    return item(i, {"role": "assistant", "content": ""}, status="incomplete")


def test_left_out_replies_carry_over_and_new_ones_are_added():
    checks = HistoryViews()
    chain = [user(1), reply(2, whole=False), user(3), reply(4)]
    assert left_out(checks, chain) == [1]
    chain += [user(5), reply(6, whole=False)]
    assert left_out(checks, chain) == [1, 5]


def test_items_already_checked_are_not_walked_again():
    checks = HistoryViews()
    chain = [user(1), reply(2)]
    left_out(checks, chain)
    # The same ids with other contents cannot happen in a store (items are never
    # rewritten); here it shows the first two are taken as checked, not read.
    changed = [item(1, {"type": "message"}), reply(2, whole=False), user(3)]
    assert left_out(checks, changed) == []


def test_another_chain_is_checked_afresh():
    checks = HistoryViews()
    left_out(checks, [user(1), reply(2)])
    # Another item at the position checked last: a branch, or a session made again.
    other = [item(7, {"type": "function_call"}), reply(8), user(9)]
    with pytest.raises(InvalidRequest) as caught:
        left_out(checks, other)
    assert caught.value.code == "session_conflict"
    shorter = [user(1)]
    assert left_out(checks, shorter) == []


def test_sessions_are_remembered_apart_and_bounded():
    checks = HistoryViews(max_sessions=2)
    for key in ("a", "b", "c"):
        left_out(checks, [user(1), reply(2, whole=False)], SessionRef("t", key))
    assert len(checks) == 2
    # Another tenant's session of the same key is its own: nothing of "t"'s is reused
    # (keyed by the key alone, the cut reply's position would come back here).
    assert left_out(checks, [user(1), reply(2)], SessionRef("u", "c")) == []
    assert left_out(checks, [user(1), reply(2), user(3)], SessionRef("t", "c")) == [1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.booleans()), max_size=12))
def test_the_outcome_is_always_the_full_check_and_count_of_the_chain(steps):
    """Appends, cuts back and replacements in any order: the same answer as a full walk."""
    checks = HistoryViews()
    chain: list[StoredItem] = []
    next_id = 1
    for cut, added, whole in steps:
        chain = chain[: max(0, len(chain) - cut)]
        for _ in range(added):
            new = reply(next_id, whole=whole) if len(chain) % 2 else user(next_id)
            chain.append(new)
            next_id += 1
        view = checks.view(REF, chain, HOW, tokens)
        assert view.left_out == check_chat_history(chain, REF.key)
        assert view.counts == [tokens(item) for item in chain]


def test_counts_are_made_once_per_item_and_again_for_another_tokenizer():
    views = HistoryViews()
    asked: list[int] = []

    def count(item: StoredItem) -> int:
        asked.append(item.id)
        return 10 * item.id

    chain = [user(1), reply(2)]
    assert views.view(REF, chain, HOW, count).counts == [10, 20]
    chain += [user(3), reply(4)]
    assert views.view(REF, chain, HOW, count).counts == [10, 20, 30, 40]
    assert asked == [1, 2, 3, 4]
    # Another model's tokenizer: every item counted for it (the checks still hold).
    assert views.view(REF, chain, ("cl100k_base", 1.0), count).counts == [10, 20, 30, 40]
    assert asked == [1, 2, 3, 4, 1, 2, 3, 4]


def test_the_memo_holds_a_bounded_number_of_counts():
    views = HistoryViews(max_items=5)
    views.view(SessionRef("t", "a"), [user(1), reply(2), user(3)], HOW, tokens)
    views.view(SessionRef("t", "b"), [user(4), reply(5), user(6)], HOW, tokens)
    assert len(views) == 1 and views.items == 3  # "a" gave way
    # A chain longer than the whole bound is answered, not kept.
    long = [user(i) for i in range(10, 17)]
    assert len(views.view(SessionRef("t", "c"), long, HOW, tokens).counts) == 7
    assert views.items <= 5

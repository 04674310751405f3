"""A `history: server` turn checks only the items stored since the session's last check."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import InvalidRequest
from proxy.http.history_check import HistoryChecks
from proxy.http.shape import check_chat_history
from proxy.store.base import SessionRef, StoredItem

REF = SessionRef("t", "s")


def item(i: int, message: dict[str, Any], status: str = "complete") -> StoredItem:
    role = str(message.get("role", "assistant"))
    return StoredItem(i, 1, i - 1 or None, f"p{i}", f"c{i}", role, 1, message, status, 0.0)


def user(i: int) -> StoredItem:
    return item(i, {"role": "user", "content": f"q{i}"})


def reply(i: int, *, whole: bool = True) -> StoredItem:
    if whole:
        return item(i, {"role": "assistant", "content": f"a{i}"})
    return item(i, {"role": "assistant", "content": ""}, status="incomplete")


def test_left_out_replies_carry_over_and_new_ones_are_added():
    checks = HistoryChecks()
    chain = [user(1), reply(2, whole=False), user(3), reply(4)]
    assert checks.left_out(REF, chain) == [1]
    chain += [user(5), reply(6, whole=False)]
    assert checks.left_out(REF, chain) == [1, 5]


def test_items_already_checked_are_not_walked_again():
    checks = HistoryChecks()
    chain = [user(1), reply(2)]
    checks.left_out(REF, chain)
    # The same ids with other contents cannot happen in a store (items are never
    # rewritten); here it shows the first two are taken as checked, not read.
    changed = [item(1, {"type": "message"}), reply(2, whole=False), user(3)]
    assert checks.left_out(REF, changed) == []


def test_another_chain_is_checked_afresh():
    checks = HistoryChecks()
    checks.left_out(REF, [user(1), reply(2)])
    # Another item at the position checked last: a branch, or a session made again.
    other = [item(7, {"type": "function_call"}), reply(8), user(9)]
    with pytest.raises(InvalidRequest) as caught:
        checks.left_out(REF, other)
    assert caught.value.code == "session_conflict"
    shorter = [user(1)]
    assert checks.left_out(REF, shorter) == []


def test_sessions_are_remembered_apart_and_bounded():
    checks = HistoryChecks(max_sessions=2)
    for key in ("a", "b", "c"):
        checks.left_out(SessionRef("t", key), [user(1), reply(2, whole=False)])
    assert len(checks) == 2
    assert checks.left_out(SessionRef("u", "a"), [user(1)]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.booleans()), max_size=12))
def test_the_outcome_is_always_the_full_check_of_the_chain(steps):
    """Appends, cuts back and replacements in any order: the same answer as a full walk."""
    checks = HistoryChecks()
    chain: list[StoredItem] = []
    next_id = 1
    for cut, added, whole in steps:
        chain = chain[: max(0, len(chain) - cut)]
        for _ in range(added):
            new = reply(next_id, whole=whole) if len(chain) % 2 else user(next_id)
            chain.append(new)
            next_id += 1
        assert checks.left_out(REF, chain) == check_chat_history(chain, REF.key)

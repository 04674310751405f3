"""A deletion leaves no copy of the deleted words in the store object itself, on every backend.

The bytes on disk and in Redis are searched end to end by
tests/reliability/test_deletion_purge.py; this contract test covers what that
one cannot reach and the in-memory fake is made of: every object of the store
(its chain, history and summary caches, the fake's tables and search index),
walked from the store down through every ``proxy.`` object and container.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.store.base import Store
from tests.store.test_responses import req as response_req
from tests.store.test_responses import resp, said, user
from tests.stores import ALICE, msg, req

MARKER = "zqxdeletedword"
KINDS = ["delete_session", "delete_response", "delete_idle_sessions"]


def strings(root: object) -> Iterator[str | bytes]:
    """Every str and bytes reachable from ``root`` through containers and proxy's own objects."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, str | bytes | bytearray | memoryview):
            yield bytes(obj) if isinstance(obj, bytearray | memoryview) else obj
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset | deque):
            stack.extend(obj)
        elif obj is root or type(obj).__module__.startswith("proxy."):
            stack.extend(getattr(obj, "__dict__", {}).values())
            for slot in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, slot, None))


def copies(store: Store) -> int:
    word = MARKER.encode()
    return sum(s.count(word) if isinstance(s, bytes) else s.count(MARKER) for s in strings(store))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deletion_leaves_no_copy_of_the_words_in_the_store_object(
    store: Store, kind: str
) -> None:
    if kind == "delete_response":
        await store.record_response(
            ALICE,
            [user(f"say {MARKER}")],
            [said(f"{MARKER} said", 1)],
            resp("resp_1"),
            response_req(detail={"response_id": "resp_1"}),
        )
    else:
        await store.record_exchange(
            ALICE, [msg("user", f"say {MARKER}")], msg("assistant", f"{MARKER} said"), req()
        )
    # Read back: what the store caches on a read is a copy too.
    assert MARKER in str([i.message for i in await store.history(ALICE)])
    assert copies(store) > 0, "the walk finds not even the stored words"

    if kind == "delete_session":
        assert await store.delete_session(ALICE)
    elif kind == "delete_response":
        assert await store.delete_response(ALICE.tenant, "resp_1")
    else:
        assert await store.delete_idle_sessions(time.time() + 3600) == 1

    assert await store.history(ALICE) == []
    assert copies(store) == 0

"""An item's token count: the chat view's count, taken from the cache by the item's key."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.responses import items as items_module
from proxy.responses.items import ItemCounter, chat_view, item_hash


def test_a_keyed_item_counted_before_is_not_viewed_again_and_counts_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counter = ItemCounter("gpt-4o")
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    key = item_hash(item) + "-test-item-counts"
    first = counter.count(item, key)
    assert first == counter.counter.count_message(chat_view(item))

    def no_view(_: Any) -> dict[str, Any]:
        raise AssertionError("the chat view was built for a cached item")

    monkeypatch.setattr(items_module, "chat_view", no_view)
    assert counter.count(item, key) == first
    # Without a key there is no cache to look in: the view is built.
    with pytest.raises(AssertionError):
        counter.count(item)

"""An item's token count: the chat view's count, taken from the cache by the item's key."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.responses import items as items_module
from proxy.responses.items import ItemCounter, chat_view, item_hash
from tests import codex_items as codex


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


def test_codex_items_and_tools_are_counted_by_what_they_carry() -> None:
    counter = ItemCounter("gpt-5.1-codex")
    small, big = codex.patch_call("c1", "a.py"), codex.patch_call("c1", "a.py" * 400)
    assert counter.count(big) > counter.count(small) + 300  # a custom call: its input
    output = codex.patch_output("c1", "b.py" * 400)
    assert counter.count(output) > 300
    reasoning = codex.reasoning("Planning the refactor of the payment module", 1)
    # Reasoning: its summary text (the encrypted content is opaque and is not the model's
    # own count of it); unknown items and web searches: their JSON.
    assert 5 < counter.count(reasoning) < 40
    for item in (codex.web_search("zstd frame format"), codex.unknown(7)):
        assert counter.count(item) > 10
    # Namespace, custom and web search tools all cost their definitions.
    base = counter.fixed({"tools": [codex.EXEC_COMMAND]})
    for tool in (codex.NAMESPACE, codex.APPLY_PATCH, codex.WEB_SEARCH):
        assert counter.fixed({"tools": [codex.EXEC_COMMAND, tool]}) > base

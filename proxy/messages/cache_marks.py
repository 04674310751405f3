"""The proxy's own prompt-cache breakpoint on a request to an Anthropic upstream.

Anthropic caches a prefix only where a ``cache_control`` marker ends it, at
most 4 per request. The client's markers stay exactly where it put them; the
proxy adds one at the end of the stable prefix (the last message before the newest
user message and any recall block before it: what the next request of the session
starts with too) only
where the request leaves room, and never on a message the client marked or on
a thinking block (which cannot carry one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.messages.view import THINKING
from proxy.upstream.cache_hints import EPHEMERAL, MAX_BREAKPOINTS


def _marks(blocks: object) -> int:
    if not isinstance(blocks, list):
        return 0
    return sum(1 for b in blocks if isinstance(b, Mapping) and b.get("cache_control"))


def markers(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> int:
    """The ``cache_control`` markers a request carries: tools, system, message blocks."""
    n = _marks(body.get("tools")) + _marks(body.get("system"))
    return n + sum(_marks(m.get("content")) for m in messages)


def with_breakpoint(
    body: Mapping[str, Any], messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], int | None]:
    """``messages`` with the proxy's breakpoint, and the index it went to (None: none)."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return messages, None
    if markers(body, messages) >= MAX_BREAKPOINTS:
        return messages, None
    # The last message before the closing run of user messages (the newest, and a
    # recall block the proxy put before it, which changes from request to request).
    target = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] != "user"), -1
    )
    if target < 0:
        return messages, None
    message = messages[target]
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return messages, None
        marked: list[Any] = [{"type": "text", "text": content, "cache_control": dict(EPHEMERAL)}]
    elif isinstance(content, list) and not _marks(content):
        last = next(
            (
                i
                for i in range(len(content) - 1, -1, -1)
                if isinstance(content[i], Mapping) and content[i].get("type") not in THINKING
            ),
            None,
        )
        if last is None:
            return messages, None
        marked = list(content)
        marked[last] = {**content[last], "cache_control": dict(EPHEMERAL)}
    else:
        return messages, None
    out = list(messages)
    out[target] = {**message, "content": marked}
    return out, target

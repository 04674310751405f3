"""Stateless replay: stored items in a form the upstream accepts without stored state of its own.

The proxy sends a chain as explicit ``input`` and never ``previous_response_id``,
so no replayed item may make the upstream look up an object it may not have
(it stored nothing with ``store: false``, under zero data retention, for
another upstream, or after a retention window). The rules:

- A ``reasoning`` item with ``encrypted_content`` is sent as stored. The
  encrypted content is the reasoning itself: it is what the API's
  ``include: ["reasoning.encrypted_content"]`` exists for, stateless
  multi-turn use; its id pairs it with the item that follows it.
- A ``reasoning`` item without it is dropped: its id alone names an object
  stored upstream, and an upstream without it answers 404 "Item with id
  'rs_...' not found" (the failure openai-agents-python#3514 and its peers
  hit replaying history).
- The item that followed a dropped reasoning item loses its ``id``: OpenAI
  links an output message or function call to its reasoning item by id and
  rejects one sent without the other (400 "Item 'msg_...' of type 'message'
  was provided without its required 'reasoning' item"). Without an id an
  assistant message is no longer an output message (the schema requires one
  there), so it is sent as an input message carrying its text. Other
  followers (hosted tool calls) keep their id: the schema requires it.
- An ``item_reference`` naming an item of the conversation is replaced by
  that item (then replayed by these rules): the upstream may not have it.

Everything else is sent exactly as stored. Items the client sent in this very
request are the client's business and pass unchanged, references aside.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.items import kind_of

# Followers whose id can go: the schema keeps them valid without one.
_STRIPPABLE = frozenset({"message", "function_call", "custom_tool_call"})
_TEXT_PARTS = frozenset({"output_text", "refusal"})


@dataclass(frozen=True)
class Replay:
    items: list[Mapping[str, Any]]
    reasoning_dropped: int = 0
    ids_stripped: int = 0
    references_resolved: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.reasoning_dropped or self.ids_stripped or self.references_resolved)


def replay(
    items: Sequence[Mapping[str, Any]],
    replayed: Sequence[bool],
    known: Mapping[str, Mapping[str, Any]],
) -> Replay:
    """``items`` made stateless; ``replayed[i]``: item i came from the store.

    ``known``: items of the whole conversation by their ``id``, for resolving
    references (the item referred to may have been trimmed from ``items``).
    """
    out: list[Mapping[str, Any]] = []
    dropped = stripped = resolved = 0
    orphaned = False  # the previous replayed item was reasoning we dropped
    for item, stored in zip(items, replayed, strict=True):
        if kind_of(item) == "item_reference":
            target = known.get(str(item.get("id")))
            if target is not None and kind_of(target) != "item_reference":
                item, stored = target, True
                resolved += 1
        if not stored:
            out.append(item)
            orphaned = False
            continue
        kind = kind_of(item)
        if kind == "reasoning":
            if item.get("encrypted_content"):
                out.append(item)
            else:
                dropped += 1
                orphaned = True
            continue
        if orphaned and kind in _STRIPPABLE and "id" in item:
            item = without_id(item)
            stripped += 1
        orphaned = False
        out.append(item)
    return Replay(out, dropped, stripped, resolved)


def without_id(item: Mapping[str, Any]) -> dict[str, Any]:
    """The item without its server id; an assistant message becomes an input message."""
    out = {k: v for k, v in item.items() if k != "id"}
    content = out.get("content")
    if (
        kind_of(out) == "message"
        and out.get("role") == "assistant"
        and isinstance(content, list)
        and all(isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS for p in content)
    ):
        text = "".join(str(p.get("text") or p.get("refusal") or "") for p in content)
        return {"type": "message", "role": "assistant", "content": text}
    return out


def ids_of(items: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Items by their ``id``, for :func:`replay`'s ``known``."""
    return {item["id"]: item for item in items if isinstance(item.get("id"), str)}

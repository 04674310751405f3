"""Responses API items on the proxy side: input, identity, token counts, stateless replay.

The policy side (turns, pairs, trimming) is ``policies.items``; this module
adapts items to what the proxy already has: the chat token counter, the
store's content hashes, and the upstream's rules for replayed items.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from policies.items import apply_items, kind_of, role_of, summarize_fallback
from policies.recall import recall_budget, reserve
from policies.trim import budget_limit
from policies.types import (
    Budget,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    PolicySpec,
    SummarizeSpec,
    TrimSpec,
)
from proxy.context.model_info import context_window
from proxy.context.tokens import TiktokenCounter, counter_for
from proxy.errors import ContextLengthExceeded, InvalidRequest

# Fields of a stored item that say where it came from, not what it says: its status,
# and the metadata Codex attaches to each item it resends (turn id, creation time),
# which the model's own output item never had.
_DECORATION = frozenset({"status", "internal_chat_message_metadata_passthrough"})


def input_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as an item list: a string is one user message."""
    value = body.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest(
            "'input' must be a string or an array of items.", param="input", code="invalid_type"
        )
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(
                f"input[{i}] must be an object.", param=f"input[{i}]", code="invalid_type"
            )
    return value


def item_hash(item: Mapping[str, Any]) -> str:
    """An item's identity in the store: its JSON without empty fields or decoration.

    SDKs resend earlier output items with ``null`` and empty fields filled in
    (or left out), with the status they had, and Codex with its own metadata,
    so none of those make an item a different one.
    """
    data = orjson.dumps(_canonical(item, top=True), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(b"item:" + data, digest_size=16).hexdigest()


def _canonical(value: Any, top: bool = False) -> Any:
    if isinstance(value, Mapping):
        return {
            k: _canonical(v)
            for k, v in value.items()
            if v is not None and v != [] and not (top and k in _DECORATION)
        }
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def item_role(item: Mapping[str, Any]) -> str:
    """The store's ``role`` column for an item: a message's role, else its type."""
    return role_of(item) or kind_of(item)


# -- token counts -----------------------------------------------------------------


def _texts(parts: object) -> str:
    """The ``text`` of every part that has one."""
    if not isinstance(parts, list):
        return ""
    return "\n".join(
        p["text"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str)
    )


def chat_view(item: Mapping[str, Any]) -> dict[str, Any]:
    """The chat message an item costs about as much as, for the chat token counter.

    Reasoning counts its summary and text (its encrypted content is opaque and
    its real size unknown here); compaction and unknown items count as their
    JSON, a pessimistic estimate rather than none.
    """
    kind = kind_of(item)
    if kind == "message":
        return {"role": item_role(item), "content": item.get("content")}
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        call = {"name": item.get("name"), "arguments": arguments}
        return {"role": "assistant", "tool_calls": [{"type": "function", "function": call}]}
    if kind.endswith("_output") and "output" in item:
        output = item["output"]
        return {
            "role": "tool",
            "content": output if isinstance(output, str | list) else str(output),
        }
    if kind == "reasoning":
        text = _texts(item.get("summary")) + _texts(item.get("content"))
        return {"role": "assistant", "content": text}
    shown = {k: v for k, v in item.items() if k not in ("id", "status")}
    return {"role": kind, "content": orjson.dumps(shown).decode()}


class ItemCounter:
    """Token counts for items and for what a Responses request costs besides them."""

    def __init__(self, model: str) -> None:
        self.counter: TiktokenCounter = counter_for(model)

    def count(self, item: Mapping[str, Any], key: Hashable | None = None) -> int:
        if key is None:
            return self.counter.count_message(chat_view(item))
        # Keyed apart from chat messages: the same hash means the same item here. A
        # cached count is taken before the chat view is built: a replayed chain's
        # items are counted every turn, and the view cost more than the lookup.
        keyed = ("i", key)
        cached = self.counter.cached_count(keyed)
        if cached is not None:
            return cached
        return self.counter.count_message(chat_view(item), keyed)

    def fixed(self, body: Mapping[str, Any]) -> int:
        """Instructions, tool definitions, a named tool choice and reply priming."""
        tools = body.get("tools")
        chat_tools = [_chat_tool(t) for t in tools] if isinstance(tools, list) else None
        choice = body.get("tool_choice")
        total = self.counter.count_request_fixed({"tools": chat_tools, "tool_choice": choice})
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            total += self.counter.count_message({"role": "system", "content": instructions})
        elif isinstance(instructions, list):
            total += sum(self.count(i) for i in instructions if isinstance(i, Mapping))
        return total


def _chat_tool(tool: object) -> object:
    """A Responses function tool in the chat shape the counter renders."""
    if isinstance(tool, Mapping) and tool.get("type") == "function" and "function" not in tool:
        keys = ("name", "description", "parameters")
        return {"type": "function", "function": {k: tool[k] for k in keys if k in tool}}
    return tool


def reserved_for_output(body: Mapping[str, Any]) -> int:
    value = body.get("max_output_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def decide(
    spec: PolicySpec,
    items: Sequence[Message],
    keys: Sequence[str],
    body: Mapping[str, Any],
    model: str,
    calibration: Callable[[str], float],
    window: Callable[[str], int | None] = context_window,
) -> Decision:
    """The route's policy over the item list (the rewriter's ``decide``, for items)."""
    counter = ItemCounter(model)
    by_id = {id(item): key for item, key in zip(items, keys, strict=True)}

    def count(item: Message) -> int:
        # Items the policy made itself (clipped copies) have no key: hashed anew.
        return counter.count(item, by_id.get(id(item)))

    limit: int | None = None
    trim_spec = summarize_fallback(spec) if isinstance(spec, SummarizeSpec) else spec
    if isinstance(trim_spec, TrimSpec):
        tokens = window(model) if trim_spec.context_fraction is not None else None
        limit = budget_limit(trim_spec, tokens, reserved_for_output(body))
    factor = calibration(model) if limit is not None else 1.0
    if limit is not None and factor != 1.0:
        # As for chat: the budget is in the upstream's tokens, the counts local.
        limit = int(limit / factor)
    fixed = counter.fixed(body)
    budget = _budget(spec, items, count, limit, fixed)
    try:
        decision = apply_items(items, spec, count, budget)
    except ContextTooLong as exc:
        if not budget.recall or limit is None:
            raise ContextLengthExceeded(
                f"{exc} Shorten the newest turn or raise the policy's budget.", param="input"
            ) from exc
        # Only the recall reserve made it too long (as for chat): decide with the
        # whole budget, and recall gets what is left of it (often nothing).
        budget = Budget(limit=limit, fixed=fixed, spare=budget.recall)
        try:
            decision = apply_items(items, spec, count, budget)
        except ContextTooLong as again:
            raise ContextLengthExceeded(
                f"{again} Shorten the newest turn or raise the policy's budget.", param="input"
            ) from again
    room = recall_budget(budget, decision)
    if room:
        decision = replace(decision, extra={**decision.extra, "recall_budget": room})
    return decision


def _budget(
    spec: PolicySpec, items: Sequence[Message], count: CountFn, limit: int | None, fixed: int
) -> Budget:
    """The policy's budget, less the recall reserve when the items do not fit it whole
    (proxy.context.rewriter.Rewriter.budget's rule, for items)."""
    recall_spec = getattr(spec, "recall", None)
    if recall_spec is None or limit is None:
        return Budget(limit=limit, fixed=fixed)
    held = reserve(recall_spec, limit)
    if sum(count(item) for item in items) + fixed <= limit:
        return Budget(limit=limit, fixed=fixed, spare=held)
    return Budget(limit=limit - held, fixed=fixed, recall=held)

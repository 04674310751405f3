"""Clearing old tool results once the context passes a trigger, in steps (Anthropic's
``clear_tool_uses`` context edit, carried out for any model).

A client asks for it with ``trigger`` (input tokens), ``keep`` (the newest tool uses
left alone), ``clear_at_least`` (tokens a clearing must free to be worth it) and
``exclude_tools`` (tools whose results are never cleared). A cleared result keeps its
place and its call id; its content becomes masking's placeholder (policies.mask), so
a tool use and its result are never split. With ``clear_inputs`` the call's arguments
are cleared too (``{}``).

Stepped, for the prompt cache, and without state: the *clearing horizon* (the tool
uses whose results are cleared) is found by replaying the conversation's growth one
tool use at a time. It jumps to "all but the newest ``keep``" when the context (what
is left after the clearing so far) passes ``trigger`` and the jump frees at least
``clear_at_least`` tokens; between two jumps the cleared set stays the same, so one
request's forwarded list is a prefix of the next one's.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.mask import MaskView, placeholder
from policies.types import CountFn, Decision, Mask, Message

CLEARED_INPUT = "{}"


@dataclass(frozen=True)
class ClearToolUses:
    trigger: int = 100_000
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = field(default_factory=frozenset)
    clear_inputs: bool = False


def _call_names(messages: Sequence[Message]) -> dict[object, str]:
    """Each tool call's id -> its tool's name."""
    names: dict[object, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                names[call.get("id")] = function["name"]
    return names


def clearing_horizon(sizes: Sequence[int], context: Sequence[int], edit: ClearToolUses) -> int:
    """How many of the oldest tool results are cleared (see the module docstring).

    ``sizes[k]``: the tokens clearing the k-th result frees (0: it is not cleared);
    ``context[k]``: tokens of the conversation up to and including that result.
    """
    freed = [0]
    for size in sizes:
        freed.append(freed[-1] + size)
    h = 0
    for t in range(1, len(sizes) + 1):
        old = t - edit.keep
        if old <= h:
            continue
        if context[t - 1] - freed[h] <= edit.trigger:
            continue
        if freed[old] - freed[h] >= max(edit.clear_at_least, 1):
            h = old
    return h


def clear_tool_uses(messages: Sequence[Message], edit: ClearToolUses, count: CountFn) -> MaskView:
    """``messages`` with the old tool results cleared, and which (as masks)."""
    msgs = list(messages)
    counts = [count(m) for m in msgs]
    names = _call_names(msgs)
    running = 0
    positions: list[int] = []
    context: list[int] = []
    for i, message in enumerate(msgs):
        running += counts[i]
        if message.get("role") == "tool":
            positions.append(i)
            context.append(running)
    placeholders: list[dict[str, Any]] = []
    sizes: list[int] = []
    for i in positions:
        excluded = names.get(msgs[i].get("tool_call_id")) in edit.exclude_tools
        masked = placeholder(msgs[i], counts[i])
        placeholders.append(masked)
        sizes.append(0 if excluded else max(0, counts[i] - count(masked)))
    h = clearing_horizon(sizes, context, edit)
    masks: list[Mask] = []
    cleared_ids: set[object] = set()
    for k in range(h):
        i = positions[k]
        if sizes[k] <= 0:
            continue  # an excluded tool, or a result the placeholder would not shorten
        msgs[i] = placeholders[k]
        masks.append(Mask(index=i, tokens_before=counts[i], tokens_after=counts[i] - sizes[k]))
        cleared_ids.add(msgs[i].get("tool_call_id"))
    if edit.clear_inputs and cleared_ids:
        msgs = [_without_inputs(m, cleared_ids) for m in msgs]
    return MaskView(msgs, tuple(masks), h)


def _without_inputs(message: Message, ids: set[object]) -> Message:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not any(
        isinstance(c, Mapping) and c.get("id") in ids for c in calls
    ):
        return message
    cleared = [
        {**c, "function": {**c["function"], "arguments": CLEARED_INPUT}}
        if isinstance(c, Mapping) and c.get("id") in ids and isinstance(c.get("function"), Mapping)
        else c
        for c in calls
    ]
    return {**message, "tool_calls": cleared}


def cleared(decision: Decision, edit: ClearToolUses, count: CountFn) -> Decision:
    """``decision`` with its forwarded messages' old tool results cleared (as masks)."""
    view = clear_tool_uses(decision.messages, edit, count)
    if not view.masked:
        return decision
    # Masks name positions in the list the policy received (``kept`` maps them back).
    aligned = len(decision.kept) == len(decision.messages)
    masks = tuple(
        Mask(decision.kept[m.index], m.tokens_before, m.tokens_after) for m in view.masked
    )
    return decision.but(
        messages=view.messages,
        masked=decision.masked + (masks if aligned else ()),
        tokens_after=decision.tokens_after - view.saved,
        extra={**decision.extra, "cleared_tool_uses": len(view.masked)},
    )

"""Responses API items as policy units: what trimming keeps whole, and where turns start.

An item's kind is its ``type``; an item without one is a message (the
Responses API's "easy" input message). Trimming works exactly as for chat
messages (:func:`policies.trim.trim_units`: same limits, hysteresis, clipping
and reasons); only the layout differs:

- A turn starts at a ``user`` message and runs to the next one. Items before
  the first user message form the leading pseudo-turn, dropped first.
- ``system`` and ``developer`` messages are pinned: never dropped.
- ``compaction`` items are pinned too, and never altered: one stands for
  everything before it (the upstream's own encrypted summary), so dropping it
  would silently lose more than any turn.
- Items carrying the same ``call_id`` (a ``function_call`` and its
  ``function_call_output``, and likewise custom, computer, shell and
  apply-patch calls) stay in one unit; so do an ``mcp_approval_request`` and
  the ``mcp_approval_response`` naming it. A user message between them does
  not start a turn there.
- A ``reasoning`` item stays in one unit with the item that follows it (the
  Responses API rejects either without the other).
- Any other item, unknown types included, is a plain member of its turn:
  forwarded as the very same object, counted, dropped only with its turn.
- Function and custom tool calls without their output, and outputs without
  their call (a ``function_call_output`` may answer a ``local_shell_call``, as
  Codex sends it), are broken input the upstream would reject (400): they are
  dropped and listed in ``Decision.repaired``, with any reasoning item that
  leads into a dropped call.
- ``function_call_output`` and ``custom_tool_call_output`` items over
  ``tool_output_max_tokens`` are clipped like chat tool results (head and
  tail kept), when their output is a string; with ``mask_tool_outputs``
  old ones are masked like chat tool results (policies.mask), their
  ``output`` replaced by the one-line placeholder. Either way the item
  stays, with its ``call_id``, in its unit: a call is never without its output.

Recall (policies/recall.py) takes back the same units: :class:`ItemShape`
says where they are (a call with its output, reasoning with its item) and
quotes each item as text.

A summarize policy is not applied to items (yet): its budget and turn trigger
trim them instead, and the decision says so (``extra["fallback"]``).

Pure: no I/O, no imports from ``proxy``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate
from typing import Any

from policies.apply import passthrough, with_masks
from policies.mask import mask_view, output_placeholder
from policies.transcript import SUMMARY_HEADER, message_text
from policies.trim import Layout, clip_tool_result, mask_candidates, trim_units
from policies.types import (
    Budget,
    CountFn,
    Decision,
    Message,
    NoneSpec,
    PolicySpec,
    SummarizeSpec,
    TrimSpec,
)

PINNED_ROLES = frozenset({"system", "developer"})
PINNED_TYPES = frozenset({"compaction"})
# Items that stand for turns or ask for a fold: never a turn themselves.
NOT_TURNS = frozenset({"compaction", "compaction_trigger"})
# Calls the upstream rejects when unanswered (and outputs without their call).
REPAIRED_PAIRS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
}
CLIPPABLE_TYPES = frozenset(REPAIRED_PAIRS.values())


def kind_of(item: Message) -> str:
    """The item's type; a typeless item is a message (the API's easy input form)."""
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message"


def role_of(item: Message) -> str | None:
    role = item.get("role")
    return role if kind_of(item) == "message" and isinstance(role, str) else None


def is_summary(item: Message) -> bool:
    """The proxy's own summary as a message (an expanded compaction item, stored as the
    client's input was): never a conversation turn to summarize or recall."""
    if role_of(item) != "user":
        return False
    content = item.get("content")
    if isinstance(content, list):
        content = content[0].get("text") if content and isinstance(content[0], dict) else None
    return isinstance(content, str) and content.startswith(SUMMARY_HEADER)


def recallable(item: Message) -> bool:
    """Whether recall may quote ``item``: not the proxy's summary, not a compaction item
    or trigger (they stand for turns; the turns themselves stay recallable)."""
    return kind_of(item) not in NOT_TURNS and not is_summary(item)


def item_layout(items: Sequence[Message]) -> Layout:
    """Where ``items``' units are (see the module docstring)."""
    kinds = [kind_of(item) for item in items]
    roles = [role_of(item) for item in items]
    pinned = [
        i
        for i, (kind, role) in enumerate(zip(kinds, roles, strict=True))
        if role in PINNED_ROLES or kind in PINNED_TYPES
    ]
    orphans = _orphans(items, kinds)
    # reach[b] > 0: some span that must stay whole covers both b - 1 and b, so
    # no turn may start at b. Spans: call groups, approvals, reasoning runs.
    opened = [0] * (len(items) + 1)
    for first, last in _spans(items, kinds):
        if last > first:
            opened[first + 1] += 1
            opened[last + 1] -= 1
    reach = list(accumulate(opened))
    starts = [i for i, r in enumerate(roles) if r == "user" and not reach[i]]
    clippable = [
        i
        for i, kind in enumerate(kinds)
        if kind in CLIPPABLE_TYPES and isinstance(items[i].get("output"), str)
    ]
    return Layout(system=pinned, orphans=orphans, starts=starts, clippable=clippable)


def _spans(items: Sequence[Message], kinds: Sequence[str]) -> list[tuple[int, int]]:
    """(first, last) index pairs that must end up in one unit."""
    groups: dict[tuple[str, object], list[int]] = {}
    for i, item in enumerate(items):
        call_id = item.get("call_id")
        if isinstance(call_id, str):
            groups.setdefault(("call", call_id), []).append(i)
        if kinds[i] == "mcp_approval_request" and isinstance(item.get("id"), str):
            groups.setdefault(("approval", item["id"]), []).append(i)
        elif kinds[i] == "mcp_approval_response":
            groups.setdefault(("approval", item.get("approval_request_id")), []).append(i)
    spans = [(group[0], group[-1]) for group in groups.values() if len(group) > 1]
    # A reasoning run belongs to the first item after it.
    i = 0
    while i < len(kinds):
        if kinds[i] != "reasoning":
            i += 1
            continue
        j = i
        while j < len(kinds) and kinds[j] == "reasoning":
            j += 1
        spans.append((i, min(j, len(kinds) - 1)))
        i = j
    return spans


def _orphans(items: Sequence[Message], kinds: Sequence[str]) -> tuple[int, ...]:
    """Unanswered calls, outputs without a call or answering one twice, and their reasoning."""
    outputs = {output: call for call, output in REPAIRED_PAIRS.items()}
    calls: dict[tuple[str, object], int] = {}
    answers: dict[tuple[str, object], int] = {}
    # Codex answers its local_shell_call with a function_call_output of the same call_id
    # (the API's own answer is a local_shell_call_output): such an output is answered.
    shells: set[object] = set()
    orphans: set[int] = set()
    for i, (item, kind) in enumerate(zip(items, kinds, strict=True)):
        if kind in REPAIRED_PAIRS:
            key = (kind, item.get("call_id"))
            if key in calls or not isinstance(key[1], str):
                orphans.add(i)  # a second call with the same id cannot be told apart
            else:
                calls[key] = i
        elif kind == "local_shell_call":
            shells.add(item.get("call_id"))
        elif kind in outputs:
            key = (outputs[kind], item.get("call_id"))
            if key not in calls and kind == "function_call_output" and key[1] in shells:
                shells.discard(key[1])  # one answer
            elif key not in calls or key in answers:
                orphans.add(i)  # before its call, without one, or a second answer
            else:
                answers[key] = i
    orphans.update(i for key, i in calls.items() if key not in answers)
    # A reasoning run leading into a dropped call goes with it.
    for i in sorted(orphans):
        j = i - 1
        while j >= 0 and kinds[j] == "reasoning":
            orphans.add(j)
            j -= 1
    return tuple(sorted(orphans))


def clip_item_output(
    item: Message, target: int, count: CountFn, before: int | None = None
) -> tuple[Message, int] | None:
    """A copy of a tool output item whose string ``output`` fits ``target`` tokens.

    The chat clipper does the work on a view of the item with its output as
    ``content``, counted as the item it stands for.
    """
    output = item.get("output")
    if not isinstance(output, str):
        return None

    def as_item(view: Message) -> dict[str, Any]:
        return {**item, "output": view["content"]}

    def count_view(view: Message) -> int:
        return count(as_item(view))

    clipped = clip_tool_result({"content": output}, target, count_view, before)
    if clipped is None:
        return None
    return as_item(clipped[0]), clipped[1]


def trim_items(
    items: Sequence[Message], spec: TrimSpec, count: CountFn, budget: Budget
) -> Decision:
    """:func:`policies.trim.trim` for Responses items; raises ContextTooLong when nothing fits.

    ``mask_tool_outputs``: old tool outputs (string ``output`` of a function or
    custom tool call) become placeholders at the budget crossings, as chat tool
    results do; the call, its ``call_id`` and the output item itself stay.
    """
    items = list(items)
    layout = item_layout(items)
    masks = None
    if spec.mask_tool_outputs is not None:
        masks = mask_candidates(
            items, layout.clippable, spec.mask_tool_outputs, count, output_placeholder
        )
    return trim_units(items, layout, spec, count, budget, clip_item_output, masks)


def apply_items(
    items: Sequence[Message], spec: PolicySpec, count: CountFn, budget: Budget
) -> Decision:
    """The decision ``spec`` makes for an item list (``policies.apply.apply`` for items)."""
    if isinstance(spec, TrimSpec):
        return trim_items(items, spec, count, budget)
    if isinstance(spec, NoneSpec):
        if spec.mask_tool_outputs is not None:
            layout = item_layout(items)
            view = mask_view(
                items,
                layout.starts,
                layout.clippable,
                spec.mask_tool_outputs,
                count,
                output_placeholder,
            )
            if view.masked:
                return with_masks(passthrough(view.messages, count, budget), view)
        return passthrough(items, count, budget)
    if isinstance(spec, SummarizeSpec):
        # Items are not summarized (yet): the trimming a summarize policy's
        # limits imply, marked as a fallback so it is counted and shown.
        decision = trim_items(items, summarize_fallback(spec), count, budget)
        return replace(decision, extra={**decision.extra, "fallback": "items_not_summarized"})
    raise TypeError(f"unknown policy spec: {spec!r}")


def summarize_fallback(spec: SummarizeSpec) -> TrimSpec:
    """Trimming within a summarize policy's budget and verbatim-turn trigger."""
    return TrimSpec(
        max_turns=spec.trigger_turns,
        max_tokens=spec.max_tokens if spec.max_tokens is not None else spec.trigger_tokens,
        low_water=spec.low_water,
        tool_output_max_tokens=spec.tool_output_max_tokens,
    )


class ItemShape:
    """Items' units for recall (:class:`policies.recall.Shape`): the spans trimming keeps whole.

    Items that must stay together (a call and its output, an approval and its
    response, a reasoning run and the item after it) are one unit, with
    everything between them; any other item is a unit alone; system and
    developer messages and compaction items are pinned (always forwarded), and
    so are the proxy's expanded summaries (never quoted: not turns).
    Built once per request from the list (as the policy's layout is).
    """

    def __init__(self, items: Sequence[Message]) -> None:
        self.items = items
        kinds = [kind_of(item) for item in items]
        self._kinds = kinds
        self._pinned = [
            role_of(item) in PINNED_ROLES or kind in PINNED_TYPES or is_summary(item)
            for item, kind in zip(items, kinds, strict=True)
        ]
        # Each item's unit: overlapping must-stay-whole spans merged.
        self._unit = [(i, i + 1) for i in range(len(items))]
        merged: list[list[int]] = []
        for first, last in sorted(_spans(items, kinds)):
            if merged and first <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        for first, last in merged:
            for i in range(first, last + 1):
                self._unit[i] = (first, last + 1)

    def pinned(self, i: int) -> bool:
        return self._pinned[i]

    def unit(self, i: int) -> tuple[int, int] | None:
        return None if self._pinned[i] else self._unit[i]

    def quoted(self, i: int) -> dict[str, object]:
        item = self.items[i]
        kind = self._kinds[i]
        quoted: dict[str, object] = {"role": role_of(item) or kind}
        call_id = item.get("call_id")
        if isinstance(call_id, str):
            quoted["call_id"] = call_id
        quoted["text"] = item_text(item, kind)
        return quoted


def item_text(item: Message, kind: str | None = None) -> str:
    """What an item says as plain text: a message's text, a call's name and
    arguments, an output, a reasoning summary; other items their fields as JSON."""
    kind = kind_of(item) if kind is None else kind
    if kind == "message":
        return message_text(item)
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        name = item.get("name") or "?"
        namespace = item.get("namespace")  # an MCP server's tools, as Codex names them
        if isinstance(namespace, str) and namespace:
            name = f"{namespace}.{name}"
        return f"{name}({arguments if isinstance(arguments, str) else ''})"
    if kind.endswith("_output") and "output" in item:
        output = item["output"]
        if isinstance(output, str):
            return output
        return message_text({"content": output}) if isinstance(output, list) else str(output)
    if kind == "reasoning":
        parts = [*_texts(item.get("summary")), *_texts(item.get("content"))]
        return "\n".join(parts)
    shown = {k: v for k, v in item.items() if k not in ("id", "status", "encrypted_content")}
    return json.dumps(shown, ensure_ascii=False, default=str)


def _texts(parts: object) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]

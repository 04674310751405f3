"""Anthropic's ``context_management.edits``, read from a request; carried out here for
upstreams that do not speak Anthropic's API (an Anthropic upstream gets them as sent).

- ``clear_tool_uses_20250919`` (``trigger``, ``keep``, ``clear_at_least``,
  ``exclude_tools``, ``clear_tool_inputs``): the proxy's stepped clearing of old tool
  results (policies/tool_clearing.py), over the policy's decision.
- ``clear_thinking_20251015`` (``keep``: ``{"type": "thinking_turns", "value": N}`` or
  ``"all"``): thinking blocks left out of all but the newest N assistant turns that
  have them (Anthropic's default: 1).
- ``compact_20260112`` (``trigger``, ``pause_after_compaction``, ``instructions``):
  threshold compaction, read here and answered by proxy/messages/compaction.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.tool_clearing import ClearToolUses
from proxy.errors import InvalidRequest
from proxy.messages.view import THINKING

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
# Anthropic's default trigger of compact_20260112 (input tokens).
COMPACT_TRIGGER = 150_000


@dataclass(frozen=True)
class CompactEdit:
    """A ``compact_20260112`` edit: compact past ``trigger`` input tokens."""

    trigger: int = COMPACT_TRIGGER
    # Answer with the compaction block alone (stop_reason "compaction"), nothing sampled.
    pause: bool = False


@dataclass(frozen=True)
class ContextEdits:
    tool_uses: ClearToolUses | None = None
    # Thinking turns kept (None: no clear_thinking edit; "all" reads as None too).
    thinking_turns: int | None = None
    compact: CompactEdit | None = None


NO_EDITS = ContextEdits()


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code="invalid_value")


def _count(edit: Mapping[str, Any], key: str, kind: str, default: int, at: str) -> int:
    value = edit.get(key)
    if value is None:
        return default
    if (
        not isinstance(value, Mapping)
        or value.get("type") != kind
        or not isinstance(value.get("value"), int)
        or isinstance(value.get("value"), bool)
        or value["value"] < 0
    ):
        raise _bad(f"{at}.{key}", f"must be {{'type': '{kind}', 'value': <a count >= 0>}}.")
    count: int = value["value"]
    return count


def context_edits(body: Mapping[str, Any]) -> ContextEdits:
    """The request's edits, checked (a malformed one is a 400 naming it)."""
    management = body.get("context_management")
    if management is None:
        return NO_EDITS
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if not isinstance(edits, list):
        raise _bad("context_management.edits", "must be an array of edits.")
    tool_uses: ClearToolUses | None = None
    thinking: int | None = None
    compact: CompactEdit | None = None
    for i, edit in enumerate(edits):
        at = f"context_management.edits.{i}"
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if kind == CLEAR_TOOL_USES:
            assert isinstance(edit, Mapping)
            exclude = edit.get("exclude_tools") or []
            if not isinstance(exclude, list) or not all(isinstance(n, str) for n in exclude):
                raise _bad(f"{at}.exclude_tools", "must be an array of tool names.")
            inputs = edit.get("clear_tool_inputs", False)
            if not isinstance(inputs, bool):
                raise _bad(f"{at}.clear_tool_inputs", "must be a boolean.")
            tool_uses = ClearToolUses(
                trigger=_count(edit, "trigger", "input_tokens", 100_000, at),
                keep=_count(edit, "keep", "tool_uses", 3, at),
                clear_at_least=_count(edit, "clear_at_least", "input_tokens", 0, at),
                exclude_tools=frozenset(exclude),
                clear_inputs=inputs,
            )
        elif kind == CLEAR_THINKING:
            assert isinstance(edit, Mapping)
            keep = edit.get("keep")
            if keep != "all":
                thinking = _count(edit, "keep", "thinking_turns", 1, at)
        elif kind == COMPACT:
            assert isinstance(edit, Mapping)
            pause = edit.get("pause_after_compaction", False)
            if not isinstance(pause, bool):
                raise _bad(f"{at}.pause_after_compaction", "must be a boolean.")
            trigger = _count(edit, "trigger", "input_tokens", COMPACT_TRIGGER, at)
            compact = CompactEdit(trigger=max(1, trigger), pause=pause)
        else:
            kinds = f"{CLEAR_TOOL_USES}, {CLEAR_THINKING} or {COMPACT}"
            raise _bad(f"{at}.type", f"must be {kinds}.")
    return ContextEdits(tool_uses, thinking, compact)


def clear_thinking(messages: Sequence[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """``messages`` with thinking blocks only in the newest ``keep`` assistant turns that
    have them (a message of thinking alone keeps it: Anthropic rejects an empty one)."""
    thinking = [
        i
        for i, m in enumerate(messages)
        if m.get("role") == "assistant"
        and isinstance(m.get("content"), list)
        and any(isinstance(b, Mapping) and b.get("type") in THINKING for b in m["content"])
    ]
    cleared = set(thinking[: max(0, len(thinking) - keep)])
    out = []
    for i, message in enumerate(messages):
        if i in cleared:
            rest = [b for b in message["content"] if b.get("type") not in THINKING]
            if rest:
                message = {**message, "content": rest}
        out.append(message)
    return out

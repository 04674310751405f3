"""Recall's units: where they are in a list, and whether the policy left each out.

A unit is a message alone, except that a tool call comes back with all its
results (and they with it), as trimming's tool windows (policies/units.py);
Responses items have their own units (:class:`policies.items.ItemShape`).
System and developer messages belong to no unit (they are always kept).

:class:`Picker` answers, for one request, which unit holds a message and
whether it may come back (every message of it left out by the policy, none
repaired, all before the newest turn), and steps from a unit to the one
before or after it. Stepping is recall's hot path (a few hundred steps a
request at 5,000 stored turns, bench/recall.py), so a step is one call: it
never looks past the policy's first or last dropped message (no unit there
can have been left out), and each message's unit is found once per request.
Work is proportional to the units visited, never to the history.

Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Protocol

from policies.transcript import message_text
from policies.types import Decision, Message
from policies.units import SYSTEM_ROLES

# A unit as [start, end) message positions.
Span = tuple[int, int]

# What a tool call's window holds after the assistant message that makes it.
_IN_WINDOW = SYSTEM_ROLES | {"tool"}

# Message keys a client may send with a time on it (not OpenAI's; some clients do).
_TIME_KEYS = ("timestamp", "created_at", "time", "date")


class Shape(Protocol):
    """Where a list's units are and how its messages are quoted (chat messages, or items)."""

    def pinned(self, i: int) -> bool:
        """Message ``i`` belongs to no unit (system messages: always forwarded)."""
        ...

    def unit(self, i: int) -> tuple[int, int] | None:
        """[start, end) of the atomic unit holding message ``i``; None: it is pinned."""
        ...

    def quoted(self, i: int) -> dict[str, object]:
        """Message ``i`` as its recall line's JSON object, without its position."""
        ...


class ChatShape:
    """Chat messages: a message alone, except a tool call with its results."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages

    def _role(self, i: int) -> object:
        return self.messages[i].get("role")

    def _calls(self, i: int) -> bool:
        return self._role(i) == "assistant" and bool(self.messages[i].get("tool_calls"))

    def pinned(self, i: int) -> bool:
        return self.messages[i].get("role") in SYSTEM_ROLES

    def unit(self, i: int) -> tuple[int, int] | None:
        """A message alone, except a tool call: the assistant message that makes
        it and the tool results right after it (system messages between them
        included) form one unit, whichever of them was hit."""
        message = self.messages[i]
        role = message.get("role")
        if role != "tool" and (role != "assistant" or not message.get("tool_calls")):
            if role in SYSTEM_ROLES:
                return None
            return i, i + 1  # the common case: a message alone
        start = i
        if role == "tool":
            start = i - 1
            while start >= 0 and self._role(start) in _IN_WINDOW:
                start -= 1
            if start < 0 or not self._calls(start):
                return i, i + 1  # a result outside any window (repaired: never recalled)
        end = start + 1
        n = len(self.messages)
        while end < n and self._role(end) in _IN_WINDOW:
            end += 1
        while end - 1 > start and self._role(end - 1) in SYSTEM_ROLES:
            end -= 1
        return start, end

    def quoted(self, i: int) -> dict[str, object]:
        message = self.messages[i]
        role = message.get("role")
        content = message.get("content")
        if len(message) == 2 and isinstance(content, str) and role is not None:
            return {"role": role, "text": content}  # what the general case makes of it
        quoted: dict[str, object] = {"role": role}
        name = message.get("name")
        if isinstance(name, str) and name:
            quoted["name"] = name
        for key in _TIME_KEYS:
            value = message.get(key)
            if isinstance(value, str | int | float) and not isinstance(value, bool):
                quoted["time"] = value
                break
        calls = message.get("tool_calls")
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            quoted["tool_call_id"] = message["tool_call_id"]
        if isinstance(calls, list):
            ids = [c.get("id") for c in calls if isinstance(c, Mapping)]
            quoted["tool_call_ids"] = [x for x in ids if isinstance(x, str)]
        quoted["text"] = message_text(message)
        return quoted


# Cached for a message that belongs to no unit (stepped over), and for one not looked at yet.
_PINNED: Span = (-1, -1)
_UNKNOWN: Span = (-2, -2)


class Picker:
    """Units around hits, and whether the policy left each out entirely."""

    def __init__(self, n: int, decision: Decision, newest: int, shape: Shape) -> None:
        self.n = n
        self.dropped = dropped = decision.dropped
        self.repaired = decision.repaired
        self.newest = newest
        self.shape = shape
        # A unit that may come back lies within [low, high): every message of it
        # was dropped, and it ends before the newest turn.
        self._low = dropped[0] if dropped else 0
        self._high = min(newest, dropped[-1] + 1) if dropped else 0
        # Each message's unit (None: it may not come back; _PINNED: no unit), found once.
        self._units: dict[int, Span | None] = {}

    def unit_at(self, i: int) -> Span | None:
        """The unit of message ``i`` as a span, if it may come back; None otherwise."""
        if not self._low <= i < self._high:
            return None
        unit = self._units.get(i, _UNKNOWN)
        if unit is _UNKNOWN:
            unit = self._units[i] = self._unit(i)
        return None if unit is _PINNED else unit

    def walk(self, span: Span, side: int, most: int) -> list[Span]:
        """Up to ``most`` units before (``side`` 0) or after (1) ``span``, nearest
        first, system messages stepped over; the first that may not come back
        (kept, the newest turn, none) ends the walk."""
        out: list[Span] = []
        units, find = self._units, self._unit
        low, high = self._low, self._high
        i = span[1] if side else span[0] - 1
        while low <= i < high and len(out) < most:
            unit = units.get(i, _UNKNOWN)
            if unit is _UNKNOWN:
                unit = units[i] = find(i)
            if unit is _PINNED:
                i += 1 if side else -1
                continue
            if unit is None:
                break
            out.append(unit)
            i = unit[1] if side else unit[0] - 1
        return out

    def step(self, span: Span, side: int) -> Span | None:
        """The unit right before (``side`` 0) or after (1) ``span``; None: that side ended."""
        near = self.walk(span, side, 1)
        return near[0] if near else None

    def _unit(self, i: int) -> Span | None:
        """The unit of message ``i`` (in [low, high)) if it may come back."""
        shape = self.shape
        bounds = shape.unit(i)
        if bounds is None:
            return _PINNED
        start, end = bounds
        if end > self.newest:
            return None  # the newest turn is always forwarded
        dropped, repaired = self.dropped, self.repaired
        if end == start + 1:  # message i alone: dropped, and not for a repair
            # Dropped indexes ascend from low, so i is at i - low or before it:
            # right there when the run is unbroken up to i (trimming's usual cut).
            k = i - self._low
            if k >= len(dropped) or dropped[k] != i:
                k = bisect_left(dropped, i)
                if k == len(dropped) or dropped[k] != i:
                    return None
            if repaired and _has(repaired, i):
                return None
            return start, end
        members = [j for j in range(start, end) if not shape.pinned(j)]
        if not members or not all(_has(dropped, j) for j in members):
            return None
        if any(_has(repaired, j) for j in members):
            return None  # broken client input: dropped for a reason
        return start, end


def _has(sorted_indexes: Sequence[int], i: int) -> bool:
    k = bisect_left(sorted_indexes, i)
    return k < len(sorted_indexes) and sorted_indexes[k] == i

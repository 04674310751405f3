"""Split a chat conversation into the units trimming drops: turns, and tool pairs.

A turn is a real user message (role ``user``) and every non-system message
after it until the next user message: assistant replies, tool calls, tool
results, legacy ``function`` messages. System and developer messages belong to
no turn: they are never dropped, so they are listed apart. Non-system messages
before the first user message (an assistant greeting, say) form a leading
pseudo-turn, the first thing dropped.

Tool calls and results pair up inside a *window*: an assistant message with
``tool_calls`` and the run of ``tool`` messages right after it. System and
developer messages inside the run are tolerated (we never move them, and the
client put them there); any other message ends the window. A window never
spans a user message, so dropping whole turns can never split a pair; only a
client can send one broken, and :func:`find_orphans` finds those.

Everything here makes whole-list passes rather than a branch per message: a
request is read in full on every call, so the per-message constant is what
scales with a conversation's length.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.types import Message

SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Turns:
    """A conversation's messages by role in trimming, as indexes into it."""

    # System and developer messages, wherever they are: never dropped.
    system: tuple[int, ...]
    # Non-system messages before the first user message.
    leading: tuple[int, ...]
    # Each turn: a user message and the non-system messages after it, in order.
    turns: tuple[tuple[int, ...], ...]

    @property
    def units(self) -> tuple[tuple[int, ...], ...]:
        """What trimming drops whole, oldest first: the pseudo-turn (if any), then turns."""
        return ((self.leading,) if self.leading else ()) + self.turns


def roles_of(messages: Sequence[Message]) -> list[object]:
    """Each message's role, read once and shared by the functions below."""
    return [m.get("role") for m in messages]


def where(roles: Sequence[object], role: str) -> list[int]:
    """The positions whose role is ``role``, ascending."""
    return [i for i, r in enumerate(roles) if r == role]


def where_system(roles: Sequence[object]) -> list[int]:
    """The positions of system and developer messages, ascending."""
    return [i for i, r in enumerate(roles) if r in SYSTEM_ROLES]


def split_turns(messages: Sequence[Message], roles: Sequence[object] | None = None) -> Turns:
    """The conversation's turns as index lists (trim itself needs only where units start)."""
    if roles is None:
        roles = roles_of(messages)
    users = where(roles, "user")
    system = where_system(roles)
    members = without(0, len(roles), system)
    edges = [u - bisect_left(system, u) for u in users]  # each user's place in members
    edges.append(len(members))
    turns = tuple(tuple(members[edges[k] : edges[k + 1]]) for k in range(len(users)))
    return Turns(system=tuple(system), leading=tuple(members[: edges[0]]), turns=turns)


def without(start: int, stop: int, skip: Sequence[int]) -> list[int]:
    """The indexes in [start, stop) not in ``skip`` (ascending), range by range."""
    out: list[int] = []
    for i in skip[bisect_left(skip, start) : bisect_left(skip, stop)]:
        out += range(start, i)
        start = i + 1
    out += range(start, stop)
    return out


def find_orphans(
    messages: Sequence[Message], roles: Sequence[object] | None = None
) -> tuple[int, ...]:
    """Indexes of messages an API would reject as unpaired, ascending.

    An assistant message whose tool calls are not all answered inside its
    window is an orphan, and so are the results it did get (their call goes
    with it). A ``tool`` message outside any window, answering an id its
    window's call does not have, or answering one already answered, is an
    orphan too. Legacy ``function`` messages are never checked.
    """
    if roles is None:
        roles = roles_of(messages)
    tools = where(roles, "tool")
    callers = [i for i in where(roles, "assistant") if messages[i].get("tool_calls")]
    orphans: list[int] = []
    paired: set[int] = set()
    n = len(roles)
    for i in callers:
        calls = messages[i]["tool_calls"]
        if not isinstance(calls, list):
            continue  # not a tool-call message the API would accept; nothing to pair
        wanted = {call.get("id") if isinstance(call, Mapping) else None for call in calls}
        answered: dict[object, int] = {}
        j = i + 1
        while j < n:
            role = roles[j]
            if role == "tool":
                call_id = messages[j].get("tool_call_id")
                if call_id in wanted and call_id not in answered:
                    answered[call_id] = j
            elif role not in SYSTEM_ROLES:
                break
            j += 1
        if None not in wanted and len(answered) == len(wanted):
            paired.update(answered.values())
        else:
            orphans.append(i)
    if len(paired) != len(tools):
        orphans.extend(i for i in tools if i not in paired)
        orphans.sort()
    return tuple(orphans)

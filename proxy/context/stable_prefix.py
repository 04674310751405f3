"""How much of what a request forwards is what the session's previous request forwarded.

A provider's prompt cache serves the longest prefix it has seen; this module
measures the proxy's side of that bargain: the number of leading forwarded
messages identical to the previous request's forwarded list (the
``X-Context-Stable-Prefix`` header, the request row's ``stable_prefix``).

Each forwarded message is named by its content hash. Messages forwarded as
the client sent them already have one (the pipeline hashed the conversation
to store it); only messages a policy made (a summary, a clipped or masked
tool result: a few, and small) are hashed here. The previous list is kept per
session, in a bounded LRU; comparing is one C-level list comparison in the
usual case (the whole previous list is still the prefix), a scan only when it
is not. A process that never saw the session's previous request (a restart,
another instance) reports 0, as it does for a session's first request.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from itertools import compress
from typing import Any

from policies.types import Decision, Message
from proxy.http.sessions import content_hash
from proxy.store.base import SessionRef


def forwarded_keys(
    decision: Decision, conversation: Sequence[Message], hashes: Sequence[str]
) -> list[str]:
    """The content hash of each message ``decision`` forwards (``hashes``: the conversation's)."""
    messages = decision.messages
    kept = decision.kept
    if len(kept) == len(messages):
        # Trimming and masking forward kept messages in order, some replaced by copies.
        keys = take(hashes, kept)
        sources = take(conversation, kept)
        if messages == sources:  # in C, by identity first: nothing was replaced
            return keys
        # The copies a policy makes are the ones it reports (clipped, masked): a few.
        for index in (*(c.index for c in decision.clipped), *(m.index for m in decision.masked)):
            j = bisect_left(kept, index)
            if j < len(kept) and kept[j] == index:
                keys[j] = content_hash(messages[j])
                sources[j] = messages[j]
        if messages != sources:
            # Anything else a policy replaced without saying so: find it.
            for j in compress(range(len(keys)), map(operator.is_not, messages, sources)):
                keys[j] = content_hash(messages[j])
        return keys
    # A summary (or another made message) sits between the kept ones: look up by object.
    by_id = dict(zip(map(id, conversation), hashes, strict=True))
    return [by_id.get(id(m)) or content_hash(m) for m in messages]


def take(values: Sequence[Any], indexes: Sequence[int]) -> list[Any]:
    """``[values[i] for i in indexes]`` (ascending): a few leading ones, then one slice.

    A policy keeps the system messages and then one run of the newest turns,
    so all but a handful of indexes are one contiguous run, copied in C.
    """
    n = len(indexes)
    if not n:
        return []
    # indexes[j] - j grows with j and is at its largest over the final run.
    run = bisect_left(range(n), indexes[-1] - (n - 1), key=lambda j: indexes[j] - j)
    head = [values[i] for i in indexes[:run]]
    return head + list(values[indexes[run] : indexes[-1] + 1])


def common_prefix(previous: Sequence[str], current: Sequence[str]) -> int:
    """Leading elements the two lists share."""
    n = len(previous)
    if n <= len(current) and current[:n] == previous:
        return n
    same = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        same += 1
    return same


# A key held: a list slot and its hash string (32 hex digits: 81 bytes). The
# string is shared with the message cache while that holds the session, but a
# session it evicted keeps its strings alive here alone, so they are counted.
KEY_BYTES = 89
# As the other per-session caches: past 1,024 sessions nothing more is kept.
SESSIONS = 1024


class StablePrefixes:
    """Each session's last forwarded list (as content hashes), bounded by sessions and keys."""

    def __init__(
        self, max_sessions: int = SESSIONS, max_keys: int = 2_000_000, max_bytes: int | None = None
    ) -> None:
        self.max_sessions = max_sessions
        self.max_keys = max_keys if max_bytes is None else max(1, max_bytes // KEY_BYTES)
        self._last: OrderedDict[tuple[str, str], list[str]] = OrderedDict()
        self._keys = 0

    def __len__(self) -> int:
        return len(self._last)

    def measure(self, ref: SessionRef, keys: list[str], *, remember: bool = True) -> int:
        """Leading ``keys`` equal to the session's previous list; ``keys`` becomes that list."""
        slot = (ref.tenant, ref.key)
        previous = self._last.get(slot)
        stable = common_prefix(previous, keys) if previous is not None else 0
        if remember:
            if previous is not None:
                self._keys -= len(previous)
                del self._last[slot]
            if len(keys) <= self.max_keys:
                self._last[slot] = keys
                self._keys += len(keys)
                while self._keys > self.max_keys or len(self._last) > self.max_sessions:
                    _, dropped = self._last.popitem(last=False)
                    self._keys -= len(dropped)
        return stable

    def forget(self, ref: SessionRef) -> None:
        dropped = self._last.pop((ref.tenant, ref.key), None)
        if dropped is not None:
            self._keys -= len(dropped)

"""Each session's last messages, ready to store: a resent history is not hashed or counted again.

A client resends its whole history on every call. Hashing every message
(its canonical JSON, then blake2b) and counting its tokens again was most
of what a session cost per request, and grew with the history. This cache
keeps, per session, the :class:`MessageIn` (content hash, role, token count)
of each message the session sent last time, with the message's JSON as the
client sent it (orjson, no key sorting). Serialising is several times
cheaper than hashing the canonical form, and comparing bytes is exact:
``1``, ``1.0`` and ``true`` serialise differently, so an edited message is
never taken for the old one.

Messages are compared position by position first (a client appending to its
history matches all the way, without hashing any bytes); once they differ
while older messages remain (an edit, or a client dropping old turns
itself), the rest are looked up by content among the remaining ones.

A pure memo: every value returned is what ``content_hash`` and the token
counter give for that message (a reused ``MessageIn`` holds the equal
message first parsed, serialising to the same bytes). Bounded by sessions
and by the bytes of JSON held; the parsed messages they stand for take
about twice as much again.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from proxy.context.tokens import TokenCounter
from proxy.http.sessions import content_hash
from proxy.store.base import MessageIn, SessionRef


class _Entry(NamedTuple):
    # What the counts are for: the counter's encoding and scale.
    how: tuple[str, float]
    # Each message's JSON as sent, and what it became.
    dumped: list[bytes]
    stored: list[MessageIn]
    size: int


class MessageCache:
    def __init__(self, max_sessions: int = 1024, max_bytes: int = 32 * 2**20) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        # Keyed by (tenant, key): a plain tuple hashes in C, a SessionRef in Python.
        self._sessions: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def size(self) -> int:
        """Bytes of message JSON held."""
        return self._bytes

    def messages(
        self, ref: SessionRef, messages: Sequence[dict[str, Any]], counter: TokenCounter
    ) -> list[MessageIn]:
        """Each message as the store takes it, counted by ``counter``; remembered for next time."""
        try:
            dumped = [orjson.dumps(m) for m in messages]
        except TypeError:  # orjson's JSONEncodeError: not plain JSON after all
            return [_message_in(m, content_hash(m), counter) for m in messages]
        how = (counter.encoding_name, counter.scale)
        key = (ref.tenant, ref.key)
        entry = self._sessions.pop(key, None)
        out: list[MessageIn] = []
        if entry is not None:
            self._bytes -= entry.size
            out = _known(dumped, entry)
            if entry.how != how:
                # Another model's tokenizer: the hashes hold, the counts do not.
                out = [_recount(m, counter) if m is not None else m for m in out]
        if len(out) < len(dumped) or None in out:
            out = [
                _message_in(message, content_hash(message), counter) if m is None else m
                for m, message in zip(_padded(out, len(dumped)), messages, strict=True)
            ]
        size = sum(map(len, dumped))
        if size <= self.max_bytes:
            self._sessions[key] = _Entry(how, dumped, out, size)
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._sessions) > self.max_sessions:
                _, dropped = self._sessions.popitem(last=False)
                self._bytes -= dropped.size
        return out


def _known(dumped: list[bytes], entry: _Entry) -> list[Any]:
    """What ``entry`` knows of each message (None where nothing), in order.

    Position by position while the JSON is the same, then, if older messages
    remain, by content among those.
    """
    old, stored = entry.dumped, entry.stored
    if dumped[: len(old)] == old:  # the history resent as it was: one comparison in C
        same = len(old)
    else:
        same = 0
        for new, previous in zip(dumped, old, strict=False):
            if new != previous:
                break
            same += 1
    out: list[Any] = stored[:same]
    if same < len(dumped) and same < len(old):
        rest = dict(zip(old[same:], stored[same:], strict=True))
        out.extend(rest.get(data) for data in dumped[same:])
    return out


def _padded(found: list[Any], n: int) -> list[Any]:
    return found + [None] * (n - len(found)) if len(found) < n else found


def _recount(message: MessageIn, counter: TokenCounter) -> MessageIn:
    count = counter.count_message(message.message, message.content_hash)
    return dataclasses.replace(message, token_count=count)


def _message_in(message: dict[str, Any], key: str, counter: TokenCounter) -> MessageIn:
    return MessageIn(
        message=message,
        content_hash=key,
        role=str(message["role"]),
        token_count=counter.count_message(message, key),
    )

"""Each session's last messages, ready to store: a resent history is not hashed or counted again.

A client resends its whole history on every call. Hashing every message
(its canonical JSON, then blake2b) and counting its tokens again was most
of what a session cost per request, and grew with the history. This cache
keeps, per session, the :class:`MessageIn` (content hash, role, token count)
of each message the session sent last time, with an exact key for each:

- a message whose values are all strings (or null), the usual chat
  message, is keyed by its keys, then its values, in one flat tuple
  (``("role", "content", "user", "hi")``: the first half are the keys, so
  it is unambiguous), sharing the strings of the message kept; comparing
  compares the strings byte for byte, in C;
- any other message by its JSON as the client sent it (orjson, no key
  sorting), copied to an exact-size buffer (orjson's own is allocated
  several times larger than the JSON). ``1``, ``1.0`` and ``true``
  serialise differently, so an edited message is never taken for the old one.

A ``history: server`` session does not come here: its stored items are
their own identity (proxy/http/history_view.py counts them once), and
holding their messages here kept alive text that the store's chain cache
had let go, outside every budget.

A key order that differs is a miss, as a differing JSON would be.

Messages are compared position by position first (a client appending to its
history matches all the way in one list comparison); once they differ
while older messages remain (an edit, or a client dropping old turns
itself), the rest are looked up by key among the remaining ones. A message
found is returned as the object kept (the equal message first parsed), so
the copy just parsed is not kept as well.

A pure memo: every value returned is what ``content_hash`` and the token
counter give for that message; a stored item's count is taken from the
store when the counter has none cached (it was counted when stored).
Bounded by sessions and by an estimate of the bytes held (the strings of
the messages, their keys and the objects around them): see
:func:`message_bytes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import is_
from typing import Any, NamedTuple

import orjson

from proxy.context.tokens import TokenCounter
from proxy.http.sessions import content_hash
from proxy.store.base import MessageIn, SessionRef, StoredItem
from proxy.store.sized import SizedLRU

# What holding one message costs besides its text (the dict, its role string,
# the MessageIn, the content hash string, the flat key, the two list slots):
# 533 bytes measured with tracemalloc on CPython 3.11 (670 before MessageIn had
# slots and keys were flat), so a little over; a message with nested values
# (tool calls, content parts) holds more objects.
PER_MESSAGE = 580
PER_NESTED = 1100
Key = tuple[str | None, ...] | bytes


class _Entry(NamedTuple):
    # What the counts are for: the counter's encoding and scale.
    how: tuple[str, float]
    keys: list[Key | None]
    stored: list[MessageIn]
    size: int


class Lookup(NamedTuple):
    """What the cache knows of a list of messages (see :meth:`MessageCache.lookup`)."""

    keys: list[Key | None]
    # The message as stored before, or None where nothing is known.
    found: list[MessageIn | None]
    how: tuple[str, float] | None
    # The session's whole last list was resent first: its bytes, and its length
    # (only what follows is sized anew). -1: it was not.
    base: int = -1
    matched: int = 0
    # How many leading messages are the entry's, position by position.
    same: int = 0


def message_key(message: dict[str, Any]) -> tuple[str | None, ...] | bytes | None:
    """An exact key for a message (None: not plain JSON after all)."""
    for value in message.values():
        if value is not None and type(value) is not str:
            break
    else:
        # Flat, not a tuple of pairs: 72 bytes instead of 168 for a two-field
        # message, and as fast to build as ``tuple(message.items())``.
        return (*message.keys(), *message.values())
    try:
        # An exact-size copy: orjson's buffer is several times the JSON's size.
        return bytes(memoryview(orjson.dumps(message)))
    except TypeError:  # orjson's JSONEncodeError: e.g. an integer over 64 bits
        return None


def message_bytes(key: Key | None, message: MessageIn) -> int:
    """The bytes holding ``message`` and its key is estimated to take."""
    if isinstance(key, tuple):
        text = sum(len(v) for v in key[len(key) // 2 :] if v is not None)
        return text + PER_MESSAGE
    # The JSON copy, and the parsed message about as large.
    return 2 * len(key) + PER_NESTED if key is not None else PER_NESTED


class MessageCache:
    def __init__(self, max_sessions: int = 1024, max_bytes: int = 128 * 2**20) -> None:
        # Keyed by (tenant, key): a plain tuple hashes in C, a SessionRef in Python.
        # With admission: a loop over more sessions than fit keeps hitting on a
        # share of them (proxy/store/sized.py).
        self._sessions: SizedLRU[tuple[str, str], _Entry] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def max_bytes(self) -> int:
        return self._sessions.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._sessions.max_bytes = value

    @property
    def size(self) -> int:
        """Bytes held (estimated: see :func:`message_bytes`)."""
        return self._sessions.size

    def lookup(
        self,
        ref: SessionRef,
        messages: Sequence[dict[str, Any]],
    ) -> Lookup:
        """What is known of ``messages``."""
        keys: list[Key | None] = [message_key(m) for m in messages]
        entry = self._sessions.get((ref.tenant, ref.key))
        if entry is None:
            return Lookup(keys, [None] * len(keys), None)
        found, same = _known(keys, entry)
        if same == len(entry.keys):  # (no None in them: _known stops at one)
            return Lookup(keys, found, entry.how, entry.size, same, same)
        return Lookup(keys, found, entry.how, same=same)

    def messages(
        self,
        ref: SessionRef,
        messages: Sequence[dict[str, Any]],
        counter: TokenCounter,
        *,
        lookup: Lookup | None = None,
    ) -> list[MessageIn]:
        """Each message as the store takes it, counted by ``counter``; remembered for next time.

        ``lookup``: this call's :meth:`lookup`, when the caller made it first.
        """
        if lookup is None:
            lookup = self.lookup(ref, messages)
        how = (counter.encoding_name, counter.scale)
        found = lookup.found
        if lookup.how is not None and lookup.how != how:
            # Another model's tokenizer: the hashes hold, the counts do not.
            found = [_recount(m, counter) if m is not None else m for m in found]
        out: list[MessageIn]
        first = _first_unknown(found)
        if first >= 0:
            # The leading messages known as they are (a list copy in C), then the rest.
            out = found[:first]  # type: ignore[assignment]  # no None before ``first``
            out.extend(
                m if m is not None else message_in(messages[i], counter)
                for i, m in enumerate(found[first:], first)
            )
        else:
            out = found  # type: ignore[assignment]  # no None in it
        self._remember(ref, how, lookup, out)
        return out

    def _remember(
        self, ref: SessionRef, how: tuple[str, float], lookup: Lookup, out: list[MessageIn]
    ) -> None:
        slot = (ref.tenant, ref.key)
        old = self._sessions.peek(slot)
        keys = lookup.keys
        if lookup.base >= 0 and old is not None and old.size == lookup.base:
            # The list as kept, then what is new: only the new messages are sized.
            # The kept keys, not the ones just built: those share their strings
            # with the copy just parsed, which would then be held as well as the
            # message kept (twice each message's text).
            n = lookup.matched
            size = lookup.base + sum(map(message_bytes, keys[n:], out[n:]))
            keys = old.keys[:n] + keys[n:]
        else:
            n = lookup.same if old is not None else 0
            if old is not None and n:
                # The leading messages kept are sized as they were: the entry's size
                # less what followed them (only the messages after them are sized).
                kept = old.size - sum(map(message_bytes, old.keys[n:], old.stored[n:]))
                size = kept + sum(map(message_bytes, keys[n:], out[n:]))
            else:
                size = sum(map(message_bytes, keys, out))
            # The same for the leading messages kept, and for a message found by
            # key among the older ones (its key rebuilt over the kept strings).
            tail = [
                message_key(m.message) if f is not None and isinstance(k, tuple) else k
                for k, m, f in zip(keys[n:], out[n:], lookup.found[n:], strict=True)
            ]
            keys = old.keys[:n] + tail if old is not None else tail
        self._sessions.put(slot, _Entry(how, keys, out, size), size)

    def forget(self, ref: SessionRef) -> None:
        self._sessions.drop((ref.tenant, ref.key))


def _known(keys: list[Key | None], entry: _Entry) -> tuple[list[MessageIn | None], int]:
    """What ``entry`` knows of each message (None where nothing), in order, and how
    many leading messages are the entry's own, position by position.

    Position by position while the keys are the same, then, if older messages
    remain, by key among those.
    """
    old, stored = entry.keys, entry.stored
    resent = len(keys) >= len(old) and keys[: len(old)] == old and None not in old
    last = len(old) - 1
    if resent:  # the history resent: one comparison in C
        same = len(old)
    elif last > 0 and len(keys) > last and keys[:last] == old[:last] and None not in old[:last]:
        # All but the last: a ``history: server`` turn, whose new message of last
        # time is a stored item now (keyed by its id), or a client's retry with
        # its last message edited. Also one comparison in C.
        same = last
    else:
        same = 0
        for new, previous in zip(keys, old, strict=False):
            if new is None or new != previous:
                break
            same += 1
    out: list[MessageIn | None] = list(stored[:same])
    if same < len(keys):
        if same < len(old):
            rest = {k: m for k, m in zip(old[same:], stored[same:], strict=True) if k is not None}
            out.extend(rest.get(k) if k is not None else None for k in keys[same:])
        else:
            out.extend([None] * (len(keys) - same))
    return out, same


def _first_unknown(found: list[MessageIn | None]) -> int:
    """The position of the first None in ``found`` (-1: none).

    By identity, in C: ``None in found`` compares with ``==``, which calls the
    dataclass's ``__eq__`` (Python) once per message.
    """
    unknown = list(map(is_, found, repeat(None)))
    return unknown.index(True) if True in unknown else -1


def _recount(message: MessageIn, counter: TokenCounter) -> MessageIn:
    count = counter.count_message(message.message, message.content_hash)
    return dataclasses.replace(message, token_count=count)


def message_in(message: dict[str, Any], counter: TokenCounter) -> MessageIn:
    """``message`` as the store takes it: hashed, and counted by ``counter``."""
    key = content_hash(message)
    return MessageIn(
        message=message,
        content_hash=key,
        role=str(message["role"]),
        token_count=counter.count_message(message, key),
    )


def item_counter(counter: TokenCounter) -> Callable[[StoredItem], int]:
    """A stored item's count by ``counter``: as cached for its content, else as stored
    with it (counted when stored), else counted now."""

    def count(item: StoredItem) -> int:
        n = counter.cached_count(item.content_hash)
        if n is None:
            n = item.token_count
        if n is None:
            n = counter.count_message(item.message, item.content_hash)
        return n

    return count

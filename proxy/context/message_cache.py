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
  serialise differently, so an edited message is never taken for the old one;
- an item a ``history: server`` session replays from the store by its item
  id (items are never rewritten and ids never reused).

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
import sys
from collections.abc import Sequence
from itertools import compress, repeat
from operator import is_
from typing import Any, NamedTuple

import orjson

from proxy.context.tokens import TokenCounter
from proxy.http.sessions import content_hash
from proxy.store.base import MessageIn, SessionRef, StoredItem
from proxy.store.sized import SizedLRU

# What holding one client-held message costs besides its text (the dict, the
# MessageIn, the content hash string, its slots in the entry's four lists; the
# role is one interned string, the key order a shared tuple): 410 bytes measured
# with tracemalloc on CPython 3.11 (533 with a flat key of its own per message),
# so a little over; a message with nested values (tool calls, content parts)
# holds more objects.
PER_MESSAGE = 440
PER_NESTED = 1100
# A message replayed from the store (keyed by item id): the MessageIn and its slot.
PER_ITEM = 200
# A ``history: server`` entry keeps each new message's flat key besides (tuple and slot).
PER_KEY = 80
# A key order not shared (the table of shared ones is full): its own tuple.
PER_ORDER = 64
# Distinct key orders shared by every entry (a few in practice: role/content,
# role/content/name, tool results, tool calls...); past this many, a message
# keeps its own.
ORDERS = 4096

Key = tuple[str | None, ...] | bytes | int
# The keys of a message in order (``("role", "content")``).
Order = tuple[str, ...]

_orders: dict[Order, Order] = {}


class _Entry(NamedTuple):
    # What the counts are for: the counter's encoding and scale.
    how: tuple[str, float]
    # Each message's key (``history: server`` entries); None for a client-held
    # entry, whose keys are made from ``dicts`` when an edit needs them.
    keys: list[Key | None] | None
    stored: list[MessageIn]
    size: int
    # Client-held entries: the messages kept (``stored[i].message``), the order of
    # each one's keys, and the positions of those not all strings with their
    # JSON key (None: no key, never matched). What a resent history is compared
    # with, in C (see _resent).
    dicts: list[dict[str, Any]] | None = None
    orders: list[Order] | None = None
    nested: tuple[tuple[int, bytes | None], ...] = ()


class Lookup(NamedTuple):
    """What the cache knows of a list of messages (see :meth:`MessageCache.lookup`)."""

    # Each message's key; the first ``matched`` are None when the session's
    # whole last list was resent (the entry's own are reused, none were made).
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
    # The positions where ``found`` is None, ascending (checked, hashed and counted anew).
    unknown: Sequence[int] = ()
    # The client-held entry whose whole list was resent (its lists are extended).
    kept: _Entry | None = None


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
    """The bytes holding ``message`` (client-held) is estimated to take."""
    if isinstance(key, tuple):
        text = sum(len(v) for v in key[len(key) // 2 :] if v is not None)
        return text + PER_MESSAGE
    if isinstance(key, bytes):
        # The JSON copy, and the parsed message about as large.
        return 2 * len(key) + PER_NESTED
    # A stored item's: the message is the store's history cache's (shared), not counted twice.
    return PER_ITEM


def _order(message: dict[str, Any]) -> tuple[Order, int]:
    """The message's key order, shared when it can be; the bytes it takes when not."""
    order = tuple(message)
    shared = _orders.get(order)
    if shared is not None:
        return shared, 0
    if len(_orders) < ORDERS:
        _orders[order] = order
        return order, 0
    return order, PER_ORDER


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
        items: Sequence[StoredItem] = (),
    ) -> Lookup:
        """What is known of ``messages`` (the first ``len(items)`` being those stored items)."""
        entry = self._sessions.get((ref.tenant, ref.key))
        unknown: Sequence[int]
        if entry is not None and not items and entry.dicts is not None:
            n = len(entry.dicts)
            if len(messages) >= n and _resent(messages, entry):
                # The client resent its whole last list: keys only for what follows.
                keys: list[Key | None] = [None] * n
                keys.extend(message_key(m) for m in messages[n:])
                found: list[MessageIn | None] = [*entry.stored, *[None] * (len(messages) - n)]
                unknown = range(n, len(messages))
                return Lookup(keys, found, entry.how, entry.size, n, n, unknown, entry)
        keys = [item.id for item in items]
        keys.extend(message_key(m) for m in messages[len(items) :])
        if entry is None:
            return Lookup(keys, [None] * len(keys), None, unknown=range(len(keys)))
        found, same = _known(keys, entry)
        # By identity, in C: ``m is None`` per message (``None in found`` would call
        # the dataclass's ``__eq__``, Python, once per message).
        unknown = list(compress(range(len(found)), map(is_, found, repeat(None))))
        if same == len(entry.stored):  # (no None in them: _known stops at one)
            return Lookup(keys, found, entry.how, entry.size, same, same, unknown)
        return Lookup(keys, found, entry.how, same=same, unknown=unknown)

    def messages(
        self,
        ref: SessionRef,
        messages: Sequence[dict[str, Any]],
        counter: TokenCounter,
        *,
        items: Sequence[StoredItem] = (),
        lookup: Lookup | None = None,
    ) -> list[MessageIn]:
        """Each message as the store takes it, counted by ``counter``; remembered for next time.

        ``items``: the stored items the first messages are (``history: server``);
        ``lookup``: this call's :meth:`lookup`, when the caller made it first.
        """
        if lookup is None:
            lookup = self.lookup(ref, messages, items)
        how = (counter.encoding_name, counter.scale)
        found = lookup.found
        if lookup.how is not None and lookup.how != how:
            # Another model's tokenizer: the hashes hold, the counts do not.
            found = [_recount(m, counter) if m is not None else m for m in found]
        out: list[MessageIn] = list(found)  # type: ignore[arg-type]  # its Nones filled in below
        n = len(items)
        for i in lookup.unknown:
            out[i] = _from_item(items[i], counter) if i < n else _message_in(messages[i], counter)
        self._remember(ref, how, lookup, out, bool(items))
        return out

    def _remember(
        self,
        ref: SessionRef,
        how: tuple[str, float],
        lookup: Lookup,
        out: list[MessageIn],
        replayed: bool,
    ) -> None:
        slot = (ref.tenant, ref.key)
        old = self._sessions.peek(slot)
        if not replayed:
            self._remember_held(slot, how, lookup, out, old)
            return
        keys = lookup.keys
        if (
            lookup.base >= 0
            and old is not None
            and old.keys is not None
            and old.size == lookup.base
        ):
            # The list as kept, then what is new: only the new messages are sized.
            # The kept keys, not the ones just built: those share their strings
            # with the copy just parsed, which would then be held as well as the
            # message kept (twice each message's text).
            n = lookup.matched
            size = lookup.base + sum(map(_replayed_bytes, keys[n:], out[n:]))
            keys = _keys_of(old)[:n] + keys[n:]
        else:
            n = lookup.same if old is not None else 0
            if old is not None and old.keys is not None and n:
                # The leading messages kept are sized as they were: the entry's size
                # less what followed them (only the messages after them are sized).
                kept = old.size - sum(map(_replayed_bytes, old.keys[n:], old.stored[n:]))
                size = kept + sum(map(_replayed_bytes, keys[n:], out[n:]))
            else:
                size = sum(map(_replayed_bytes, keys, out))
            # The same for the leading messages kept, and for a message found by
            # key among the older ones (its key rebuilt over the kept strings).
            tail = [
                message_key(m.message) if f is not None and isinstance(k, tuple) else k
                for k, m, f in zip(keys[n:], out[n:], lookup.found[n:], strict=True)
            ]
            keys = _keys_of(old)[:n] + tail if old is not None else tail
        self._sessions.put(slot, _Entry(how, keys, out, size), size)

    def _remember_held(
        self,
        slot: tuple[str, str],
        how: tuple[str, float],
        lookup: Lookup,
        out: list[MessageIn],
        old: _Entry | None,
    ) -> None:
        """A client-held list: the messages kept (found ones are the entry's own objects)."""
        keys = lookup.keys
        n = 0
        size = 0
        dicts: list[dict[str, Any]] = []
        orders: list[Order] = []
        nested: list[tuple[int, bytes | None]] = []
        if lookup.kept is not None and lookup.kept is old:
            assert old.dicts is not None and old.orders is not None
            # The list as kept, then what is new: only the new messages are sized.
            n = lookup.matched
            size = lookup.base
            dicts = old.dicts[:n]
            orders = old.orders[:n]
            nested = [p for p in old.nested if p[0] < n]
        for i in range(n, len(out)):
            m = out[i]
            key = keys[i]
            order, extra = _order(m.message)
            dicts.append(m.message)
            orders.append(order)
            if not isinstance(key, tuple):
                nested.append((i, None if isinstance(key, int) else key))
            size += message_bytes(key, m) + extra
        entry = _Entry(how, None, out, size, dicts, orders, tuple(nested))
        self._sessions.put(slot, entry, size)

    def forget(self, ref: SessionRef) -> None:
        self._sessions.drop((ref.tenant, ref.key))


def _resent(messages: Sequence[dict[str, Any]], entry: _Entry) -> bool:
    """Whether ``messages`` begin with the entry's whole list, exactly.

    Two comparisons in C over the whole prefix: the messages as dicts (exact
    where all values are strings or null: a string equals only a string, byte
    for byte), and their keys' order; then, one by one, the JSON of those with
    other values (``1``, ``1.0`` and ``true`` are equal in Python, not as JSON).
    """
    assert entry.dicts is not None and entry.orders is not None
    head = messages[: len(entry.dicts)]
    if head != entry.dicts or list(map(tuple, head)) != entry.orders:
        return False
    return all(key is not None and message_key(head[i]) == key for i, key in entry.nested)


def _keys_of(entry: _Entry) -> list[Key | None]:
    """Each message's key (a client-held entry's made over the kept strings)."""
    if entry.keys is not None:
        return entry.keys
    assert entry.dicts is not None
    keys: list[Key | None] = list(map(message_key, entry.dicts))
    for i, key in entry.nested:
        keys[i] = key
    return keys


def entry_bytes(entry: _Entry) -> int:
    """What ``entry``'s messages are estimated to take, summed afresh (its size says the same)."""
    if entry.keys is not None:
        return sum(map(_replayed_bytes, entry.keys, entry.stored))
    assert entry.orders is not None
    own = sum(1 for order in entry.orders if _orders.get(order) is not order)
    return sum(map(message_bytes, _keys_of(entry), entry.stored)) + own * PER_ORDER


def _replayed_bytes(key: Key | None, message: MessageIn) -> int:
    """``message_bytes``, with the flat key a ``history: server`` entry keeps besides."""
    return message_bytes(key, message) + (PER_KEY if isinstance(key, tuple) else 0)


def _known(keys: list[Key | None], entry: _Entry) -> tuple[list[MessageIn | None], int]:
    """What ``entry`` knows of each message (None where nothing), in order, and how
    many leading messages are the entry's own, position by position.

    Position by position while the keys are the same, then, if older messages
    remain, by key among those.
    """
    old, stored = _keys_of(entry), entry.stored
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


def _recount(message: MessageIn, counter: TokenCounter) -> MessageIn:
    count = counter.count_message(message.message, message.content_hash)
    return dataclasses.replace(message, token_count=count)


def _message_in(message: dict[str, Any], counter: TokenCounter) -> MessageIn:
    key = content_hash(message)
    role = message["role"]
    if type(role) is str:
        # One string for every message of a role, not one per message kept.
        role = message["role"] = sys.intern(role)
    return MessageIn(
        message=message,
        content_hash=key,
        role=str(role),
        token_count=counter.count_message(message, key),
    )


def _from_item(item: StoredItem, counter: TokenCounter) -> MessageIn:
    """A stored item as the store takes it: its hash as stored; its count as cached, else stored."""
    count = counter.cached_count(item.content_hash)
    if count is None:
        count = item.token_count
    if count is None:
        count = counter.count_message(item.message, item.content_hash)
    return MessageIn(
        message=item.message, content_hash=item.content_hash, role=item.role, token_count=count
    )

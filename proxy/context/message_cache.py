"""Each session's last messages, ready to store: a resent history is not hashed or counted again.

A client resends its whole history on every call. Hashing every message
(its canonical JSON, then blake2b) and counting its tokens again was most
of what a session cost per request, and grew with the history. This cache
keeps, per session, the :class:`MessageIn` (content hash, role, token count)
of each message the session sent last time, and the message itself, matched
exactly:

- a history resent whole (the usual turn) is compared in C over its whole
  prefix: the messages as dicts (exact where every value is a string or
  null: a string equals only a string, byte for byte) and the order of
  each one's keys (one shared tuple per order); then, one by one, the JSON
  of those with other values;
- otherwise (an edit, a client dropping old turns itself) by an exact key
  for each message: a message whose values are all strings (or null), the
  usual chat message, by its keys, then its values, in one flat tuple
  (``("role", "content", "user", "hi")``: the first half are the keys, so
  it is unambiguous), built over the strings of the message kept;
- any other message by its JSON as the client sent it (orjson, no key
  sorting), copied to an exact-size buffer (orjson's own is allocated
  several times larger than the JSON). ``1``, ``1.0`` and ``true``
  serialise differently, so an edited message is never taken for the old one.

A ``history: server`` session does not come here: its stored items are
their own identity (proxy/http/history_view.py counts them once), and
holding their messages here kept alive text that the store's chain cache
had let go, outside every budget.

A key order that differs is a miss, as a differing JSON would be.

A long body (64 KiB or more) is kept too, where the budget has room no
session needs, so the next body that continues it is read from where its
messages ended (proxy/http/resent_body.py): its messages then begin with the
very objects held, and the resend is known without a comparison.

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
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import not_
from typing import Any, NamedTuple

import orjson

from proxy.context.tokens import TokenCounter
from proxy.http.resent_body import MIN_BYTES, BodyPrefix, continued, extended, found
from proxy.http.sessions import content_hash
from proxy.store.base import MessageIn, SessionRef, StoredItem
from proxy.store.sized import SizedCache, SizedLRU

# What holding one message costs besides its text (the dict, the MessageIn, the
# content hash string, its slots in the entry's lists; the role is one interned
# string, the key order a shared tuple): 410 bytes measured with tracemalloc on
# CPython 3.11 (533 with a flat key of its own per message, 670 before MessageIn
# had slots), so a little over; a message with nested values (tool calls,
# content parts) holds more objects.
PER_MESSAGE = 440
PER_NESTED = 1100
# A key order not shared (the table of shared ones is full): its own tuple.
PER_ORDER = 64
# A body kept for its prefix: its bytes, plus this for the BodyPrefix around them and
# the fields before its messages (an estimate, not measured: the tuple and a small
# dict such as {"model": ...}; fields as large as tool definitions placed before the
# messages are held as well and not counted: the openai SDK sends the messages first).
PER_PREFIX = 400
# Distinct key orders shared by every entry (a few in practice: role/content,
# role/content/name, tool results, tool calls...); past this many, a message
# keeps its own.
ORDERS = 4096

Key = tuple[str | None, ...] | bytes
# The keys of a message in order (``("role", "content")``).
Order = tuple[str, ...]

_orders: dict[Order, Order] = {}


class _Entry(NamedTuple):
    # What the counts are for: the counter's encoding and scale.
    how: tuple[str, float]
    stored: list[MessageIn]
    size: int
    # The messages kept (``stored[i].message``), the order of each one's keys,
    # and the positions of those not all strings with their JSON key (None: no
    # key, never matched): what a resent history is compared with (_resent).
    dicts: list[dict[str, Any]]
    orders: list[Order]
    nested: tuple[tuple[int, bytes | None], ...]
    # The last body's bytes up to its last message, whose messages are ``dicts``
    # (proxy/http/resent_body.py): the next body that begins with them is not
    # parsed again. None: not known, or a body too short to be worth keeping.
    prefix: BodyPrefix | None = None


class Lookup(NamedTuple):
    """What the cache knows of a list of messages (see :meth:`MessageCache.lookup`)."""

    # Each message's key; the first ``matched`` are None when the session's
    # whole last list was resent (none were made for them).
    keys: list[Key | None]
    # The message as stored before, or None where nothing is known.
    found: list[MessageIn | None]
    how: tuple[str, float] | None
    # The session's whole last list was resent first: its length (only what
    # follows is sized anew).
    matched: int = 0
    # The positions where ``found`` is None, ascending (checked, hashed and counted anew).
    unknown: Sequence[int] = ()
    # The entry whose whole list was resent (its lists are extended).
    kept: _Entry | None = None
    # The body was the kept entry's prefix continued (:meth:`MessageCache.resent_body`).
    continued: bool = False


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
    """The bytes holding ``message`` is estimated to take (``key``: its :func:`message_key`)."""
    if isinstance(key, tuple):
        # The values' lengths (None and "" add nothing), in C.
        return sum(map(len, filter(None, key[len(key) // 2 :]))) + PER_MESSAGE
    # The JSON copy, and the parsed message about as large.
    return 2 * len(key) + PER_NESTED if key is not None else PER_NESTED


def _orders_of(messages: Sequence[dict[str, Any]]) -> tuple[list[Order], int]:
    """Each message's key order, shared where the table has room; and how many are not."""
    orders = list(map(tuple, messages))
    if len(_orders) < ORDERS:
        return list(map(_orders.setdefault, orders, orders)), 0
    found = list(map(_orders.get, orders))
    return [o if f is None else f for o, f in zip(orders, found, strict=True)], found.count(None)


class MessageCache(SizedCache[tuple[str, str], _Entry]):
    """Bounded by sessions and by the bytes held (estimated: :func:`message_bytes`)."""

    def __init__(self, max_sessions: int = 1024, max_bytes: int = 128 * 2**20) -> None:
        # Keyed by (tenant, key): a plain tuple hashes in C, a SessionRef in Python.
        # With admission: a loop over more sessions than fit keeps hitting on a
        # share of them (proxy/store/sized.py).
        self._entries: SizedLRU[tuple[str, str], _Entry] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )
        # The last body :meth:`resent_body` parsed: its entry, and its messages list.
        self._continued: tuple[_Entry, list[dict[str, Any]]] | None = None

    def resent_body(self, ref: SessionRef, raw: bytes) -> dict[str, Any] | None:
        """``raw`` parsed, when it is the session's last body continued (its messages then
        begin with the very objects held); None: parse it whole."""
        entry = self._entries.peek((ref.tenant, ref.key))
        if entry is None or entry.prefix is None:
            return None
        body = continued(entry.prefix, entry.dicts, raw)
        if body is not None:
            self._continued = (entry, body["messages"])
        return body

    def lookup(
        self,
        ref: SessionRef,
        messages: Sequence[dict[str, Any]],
    ) -> Lookup:
        """What is known of ``messages``."""
        entry = self._entries.get((ref.tenant, ref.key))
        keys: list[Key | None]
        resent, self._continued = self._continued, None
        if entry is not None:
            n = len(entry.dicts)
            # The body :meth:`resent_body` just made of this entry's own messages: no
            # comparison needed (nothing is awaited between the two calls).
            known = resent is not None and resent[0] is entry and messages is resent[1]
            if known or (len(messages) >= n and _resent(messages, entry)):
                # The client resent its whole last list: keys only for what follows.
                keys = [None] * n
                keys.extend(map(message_key, messages[n:]))
                found: list[MessageIn | None] = [*entry.stored, *[None] * (len(messages) - n)]
                return Lookup(keys, found, entry.how, n, range(n, len(messages)), entry, known)
        keys = list(map(message_key, messages))
        if entry is None:
            return Lookup(keys, [None] * len(keys), None, unknown=range(len(keys)))
        found = _known(keys, entry)
        # By identity: ``None in found`` would call MessageIn's ``__eq__`` once per message.
        unknown = [i for i, m in enumerate(found) if m is None]
        return Lookup(keys, found, entry.how, unknown=unknown)

    def messages(
        self,
        ref: SessionRef,
        messages: Sequence[dict[str, Any]],
        counter: TokenCounter,
        *,
        lookup: Lookup | None = None,
        body: tuple[bytes, dict[str, Any]] | None = None,
    ) -> list[MessageIn]:
        """Each message as the store takes it, counted by ``counter``; remembered for next time.

        ``lookup``: this call's :meth:`lookup`, when the caller made it first.
        ``body``: the request's bytes and its parse, whose messages these are (a
        long one is kept, so the next body that continues it is not parsed again).
        """
        if lookup is None:
            lookup = self.lookup(ref, messages)
        how = (counter.encoding_name, counter.scale)
        found = lookup.found
        if lookup.how is not None and lookup.how != how:
            # Another model's tokenizer: the hashes hold, the counts do not.
            found = [_recount(m, counter) if m is not None else m for m in found]
        out: list[MessageIn] = list(found)  # type: ignore[arg-type]  # its Nones filled in below
        for i in lookup.unknown:
            out[i] = message_in(messages[i], counter, intern=True)
        self._remember(ref, how, lookup, out, body)
        return out

    def _remember(
        self,
        ref: SessionRef,
        how: tuple[str, float],
        lookup: Lookup,
        out: list[MessageIn],
        body: tuple[bytes, dict[str, Any]] | None,
    ) -> None:
        """The list as kept (found messages are the entry's own objects), then what is new:
        after a whole resend only the new messages are sized and added."""
        slot = (ref.tenant, ref.key)
        old = self._entries.peek(slot)
        n = 0
        size = 0
        dicts: list[dict[str, Any]] = []
        orders: list[Order] = []
        nested: list[tuple[int, bytes | None]] = []
        if lookup.kept is not None and lookup.kept is old:
            n = lookup.matched
            size = old.size
            dicts = old.dicts[:n]
            orders = old.orders[:n]
            nested = list(old.nested)
        # Whole-list passes in C where they can be: a miss adds thousands.
        added, keys = [m.message for m in out[n:]], lookup.keys[n:]
        dicts += added
        shared, own = _orders_of(added)
        orders += shared
        # Positions whose key is not a flat tuple (JSON, or None: never matched).
        flat = map(isinstance, keys, repeat(tuple))
        nested += compress(zip(range(n, len(out)), keys, strict=True), map(not_, flat))  # type: ignore[arg-type]
        size += sum(map(message_bytes, keys, out[n:])) + own * PER_ORDER
        # The body's prefix is a luxury: kept only in room no session needs now. On a
        # loop over more long sessions than fit, holding one more session's messages
        # saves more than sparing some sessions their parse.
        prefix = None
        if (
            body is not None
            and len(body[0]) >= MIN_BYTES
            and self._entries.spare(slot) >= size + len(body[0]) + PER_PREFIX
        ):
            prefix = _prefix(lookup, old, body)
        held = size + (len(prefix.raw) + PER_PREFIX if prefix is not None else 0)
        entry = _Entry(how, out, size, dicts, orders, tuple(nested), prefix)
        self._entries.put(slot, entry, held)

    def forget(self, ref: SessionRef) -> None:
        self._entries.drop((ref.tenant, ref.key))


def _prefix(
    lookup: Lookup, old: _Entry | None, body: tuple[bytes, dict[str, Any]]
) -> BodyPrefix | None:
    """The body's bytes up to its last message, to keep with the entry.

    Looked for only in a session in use (its whole last list was resent): a
    body continued from the last is extended from its prefix (parsing only
    the new messages); any other is searched from scratch, parsing it once
    more. A session's first body, or one the cache missed (it may not even be
    admitted), pays nothing.
    """
    if old is None or lookup.kept is not old:
        return None
    raw, parsed = body
    if lookup.continued and old.prefix is not None:
        return extended(old.prefix, raw, len(parsed["messages"]) - lookup.matched)
    return found(raw, parsed)


def _resent(messages: Sequence[dict[str, Any]], entry: _Entry) -> bool:
    """Whether ``messages`` begin with the entry's whole list, exactly.

    Two comparisons in C over the whole prefix: the messages as dicts (exact
    where all values are strings or null: a string equals only a string, byte
    for byte) and their keys' order; then, one by one, the JSON of those with
    other values (``1``, ``1.0`` and ``true`` are equal in Python, not as JSON).
    """
    head = messages[: len(entry.dicts)]
    if head != entry.dicts or list(map(tuple, head)) != entry.orders:
        return False
    return all(key is not None and message_key(head[i]) == key for i, key in entry.nested)


def entry_keys(entry: _Entry) -> list[Key | None]:
    """Each kept message's key, made over the kept strings (what an edit is matched by)."""
    keys: list[Key | None] = list(map(message_key, entry.dicts))
    for i, key in entry.nested:
        keys[i] = key
    return keys


def entry_bytes(entry: _Entry) -> int:
    """What ``entry``'s messages are estimated to take, summed afresh (its size says the same)."""
    own = sum(1 for order in entry.orders if _orders.get(order) is not order)
    return sum(map(message_bytes, entry_keys(entry), entry.stored)) + own * PER_ORDER


def _known(keys: list[Key | None], entry: _Entry) -> list[MessageIn | None]:
    """What ``entry`` knows of each message (None where nothing), in order.

    Position by position while the keys are the same, then, if older messages
    remain, by key among those.
    """
    old, stored = entry_keys(entry), entry.stored
    last = len(old) - 1
    if last > 0 and len(keys) > last and keys[:last] == old[:last] and None not in old[:last]:
        # All but the last: a client's retry with its last message edited. One
        # comparison in C.
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
    return out


def _recount(message: MessageIn, counter: TokenCounter) -> MessageIn:
    count = counter.count_message(message.message, message.content_hash)
    return dataclasses.replace(message, token_count=count)


def message_in(
    message: dict[str, Any], counter: TokenCounter, *, intern: bool = False
) -> MessageIn:
    """``message`` as the store takes it: hashed, and counted by ``counter``.

    ``intern``: its role made one string shared by every message of that role
    (an equal string: the message is the same), for a message kept here.
    """
    key = content_hash(message)
    role = message["role"]
    if intern and type(role) is str:
        role = message["role"] = sys.intern(role)
    return MessageIn(
        message=message,
        content_hash=key,
        role=str(role),
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

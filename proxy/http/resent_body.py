"""A long history resent by its client: what it shares with its last body is not parsed again.

A client-held history is resent whole on every turn: the body is the last
body's bytes up to its last message, then the new messages and the fields
that follow. Parsing those 1.7 MB again (2,000 messages) and comparing the
2,000 fresh dicts with the cached ones was a third of such a request's CPU,
both memory-bound. Here the body is checked to begin with the last body's
bytes (one ``memcmp``) and only the rest is parsed, behind an opening that
leaves a JSON parser in the state it is in after the last message:

    last body   {"model":"m","messages":[{...},...,{...}        ],"stream":true}
    this body   {"model":"m","messages":[{...},...,{...}  ,{new}],"stream":true}
    parsed      {"messages":["<sentinel>"                 ,{new}],"stream":true}

The result is exactly ``orjson.loads(body)``:

- :class:`BodyPrefix` ``end`` is only ever a place where a parser has exactly the
  top-level object and its ``messages`` array open, just after an element.
  That is proven, not guessed: the bytes before it, closed with
  ``,"<end sentinel>"]}``, parse as an object whose ``messages`` (the last such
  field, as a full parse keeps) ends with that sentinel. (``]}`` closes one
  array and one object, so nothing else is open and no string is; another
  field's array would have taken the sentinel.) A parser reads what follows
  the same from there as from after the opening above;
- the fields before ``messages`` are the last body's, parsed then; a field
  repeated after it wins, as orjson's last-wins does in a full parse;
- a later ``messages`` field (the last would win) replaces the sentinel's
  list, so it is refused: the sentinel is random per process, a client
  cannot forge it;
- anything else that does not parse falls back to the full parse, which
  gives the client its error.

Only a body of at least :data:`MIN_BYTES` keeps its bytes for next time: below
that the parse costs less than holding them.
"""

from __future__ import annotations

import secrets
from typing import Any, NamedTuple

import orjson

SENTINEL = secrets.token_hex(16)
# Another, for the end: the opening's own sentinel must not pass for it.
_LAST = secrets.token_hex(16)
_OPEN = b'{"messages":["' + SENTINEL.encode() + b'"'
# Closes the array left open with the sentinel as its last element: the array is
# the messages (the value a full parse keeps) only if that is where it lands.
_MARK = b',"' + _LAST.encode() + b'"]}'

# 64 KiB: ~75 messages of ~200 tokens; parsing them takes ~40 us.
MIN_BYTES = 64 * 1024
# Where the messages end is found from the right: fields after them (tools
# with arrays of their own) are passed over, at most this many.
TRIES = 16


class BodyPrefix(NamedTuple):
    """A session's last body, and where its ``messages`` array's last element ends."""

    raw: bytes
    # raw[:end] is the body up to (not including) the array's closing bracket.
    end: int
    # The top-level fields before "messages", as parsed from raw[:end].
    before: dict[str, Any]


def continued(
    prefix: BodyPrefix, messages: list[dict[str, Any]], raw: bytes
) -> dict[str, Any] | None:
    """``raw`` parsed, when it is ``prefix``'s bytes continued: the body, whose messages
    begin with ``messages`` (what ``prefix``'s messages parsed to). None: parse ``raw``
    whole."""
    end = prefix.end
    if len(raw) <= end or not raw.startswith(memoryview(prefix.raw)[:end]):
        return None
    try:
        tail = orjson.loads(_OPEN + raw[end:])
    except orjson.JSONDecodeError:
        return None
    listed = tail.get("messages") if type(tail) is dict else None
    if type(listed) is not list or not listed or listed[0] != SENTINEL:
        return None
    body = {**prefix.before, **tail}
    body["messages"] = [*messages, *listed[1:]]
    return body


def extended(prefix: BodyPrefix, raw: bytes, new: int) -> BodyPrefix | None:
    """``raw``'s prefix up to its last message (``raw``: ``prefix`` continued by ``new``)."""
    located = _end(_OPEN, raw, prefix.end, 1 + new)
    if located is None:
        return None
    return BodyPrefix(raw, located[0], prefix.before)


def found(raw: bytes, body: dict[str, Any]) -> BodyPrefix | None:
    """``raw``'s prefix up to its last message, from scratch (``body``: ``raw`` parsed)."""
    messages = body.get("messages")
    if len(raw) < MIN_BYTES or type(messages) is not list:
        return None
    keys = list(body)
    after = keys[keys.index("messages") + 1 :]
    located = _end(b"", raw, 0, len(messages), after)
    if located is None:
        return None
    end, whole = located
    del whole["messages"]
    return BodyPrefix(raw, end, whole)


def _end(
    head: bytes, raw: bytes, start: int, count: int, after: list[str] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """Where in ``raw`` (read from ``start``, after ``head``) the messages array's last
    element ends, and what ``head + raw[start:end]`` closed parses to; None: not found.

    ``after`` (the fields that follow the messages, in order): each candidate's
    rest is parsed first, behind the opening (cheap), and a candidate whose
    rest holds other fields is passed over before the prefix is parsed.
    """
    data = memoryview(raw)
    hi = len(raw)
    for _ in range(TRIES):
        end = raw.rfind(b"]", start, hi)
        if end < 0:
            return None
        hi = end
        if after is not None:
            try:
                tail = orjson.loads(_OPEN + data[end:])
            except orjson.JSONDecodeError:
                continue
            if type(tail) is not dict or tail["messages"] != [SENTINEL] or list(tail)[1:] != after:
                continue  # another field's array, or a later "messages" (the last wins)
        try:
            whole = orjson.loads(b"".join((head, data[start:end], _MARK)))
        except orjson.JSONDecodeError:
            continue
        listed = whole.get("messages") if type(whole) is dict else None
        if type(listed) is not list or not listed or listed[-1] != _LAST:
            continue  # the array left open is another field's
        if len(listed) != count + 1:
            return None
        listed.pop()
        return end, whole
    return None

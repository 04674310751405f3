"""The client's ``previous_response_id`` put back into the answer, the one field rewritten.

A chain the proxy stored goes upstream as explicit ``input``, without
``previous_response_id``, so the upstream answers ``"previous_response_id":
null``. The client asked to continue a response, and the object it gets back
must say so (SDKs and agents read it). Only that value is replaced, in the
bytes: every other byte of the answer, and of every stream event, stays the
upstream's. In a stream the value sits inside a ``data:`` line (JSON has no raw
newline), so only a line still arriving is held back, never a whole event.
"""

from __future__ import annotations

import re

import orjson

# A JSON key is a quoted string; inside a string a quote is escaped, so this
# cannot match text that merely mentions the name.
_NULL_FIELD = re.compile(rb'("previous_response_id"\s*:\s*)null')


def put_back(body: bytes, previous_id: str) -> bytes:
    """``body`` with every ``"previous_response_id": null`` naming ``previous_id`` instead."""
    if b'"previous_response_id"' not in body:
        return body
    value = orjson.dumps(previous_id)
    return _NULL_FIELD.sub(lambda m: m.group(1) + value, body)


class PutBackStream:
    """The same for a stream, chunk by chunk: complete lines out, a partial line held."""

    def __init__(self, previous_id: str) -> None:
        self.previous_id = previous_id
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(b"\n") + 1
        self._pending = data[end:]
        return put_back(data[:end], self.previous_id) if end else b""

    def flush(self) -> bytes:
        data, self._pending = self._pending, b""
        return put_back(data, self.previous_id)

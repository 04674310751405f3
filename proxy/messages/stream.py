"""Anthropic's message stream, read on the side of the relay: the answer it adds up to.

The client gets the upstream's bytes as they came; this reads a copy of
them (the events of https://docs.anthropic.com/en/api/messages-streaming)
and rebuilds the message: text, thinking with its signature, tool_use with
its input, any other block as it started. It never raises: an event that is
not JSON or not an object is counted in ``malformed``.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.chat.stream import SSEParser, unfinished
from proxy.errors import UpstreamError
from proxy.messages.view import chat_usage, reply_view


class MessageAssembler:
    """The relay's reply assembler for ``/v1/messages`` (see ``ExchangeRelay._relay_stream``)."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._parser = SSEParser()
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._size = 0
        self._max_bytes = max_bytes
        self.chunks = 0
        self.malformed = 0
        self.done = False
        self.truncated = False
        self.error: dict[str, Any] | None = None
        # The model that answered (message_start's), which calibration is kept under.
        self.model: str | None = None

    def feed(self, chunk: bytes) -> None:
        for data in self._parser.feed(chunk):
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                self.malformed += 1
                continue
            if not isinstance(event, dict):
                self.malformed += 1
                continue
            self.chunks += 1
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self._message = dict(event["message"])
            if isinstance(self._message.get("model"), str):
                self.model = self._message["model"]
            self._usage.update(_dict(self._message.get("usage")))
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            index = event.get("index")
            if isinstance(index, int):
                self._blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta":
            self._delta(event.get("index"), _dict(event.get("delta")))
        elif kind == "content_block_stop":
            self._stop(event.get("index"))
        elif kind == "message_delta":
            if self._message is not None:
                self._message.update(_dict(event.get("delta")))
            self._usage.update(_dict(event.get("usage")))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            # An in-stream error: the answer did not finish.
            self.error = _dict(event.get("error"))
            self.malformed += 1

    def _delta(self, index: object, delta: dict[str, Any]) -> None:
        block = self._blocks.get(index) if isinstance(index, int) else None
        if block is None:
            self.malformed += 1
            return
        assert isinstance(index, int)
        kind = delta.get("type")
        field = _DELTA_FIELDS.get(str(kind))
        if field is None:
            return  # citations and kinds to come: the block as it started
        value = delta.get(field)
        if not isinstance(value, str):
            self.malformed += 1
            return
        self._size += len(value)
        if self._size > self._max_bytes:
            self.truncated = True
            return
        if kind == "input_json_delta":
            self._json.setdefault(index, []).append(value)
        elif kind == "signature_delta":
            block["signature"] = value
        else:
            block[field] = str(block.get(field) or "") + value

    def _stop(self, index: object) -> None:
        if not isinstance(index, int) or index not in self._json:
            return
        text = "".join(self._json.pop(index))
        try:
            self._blocks[index]["input"] = orjson.loads(text) if text else {}
        except orjson.JSONDecodeError:
            self.malformed += 1

    @property
    def errored(self) -> bool:
        return self.error is not None

    def unfinished(self) -> UpstreamError | None:
        """Why the ended stream is not a whole answer (told in-stream, as on every door)."""
        return unfinished(self, "message_stop")

    def before_end(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` before its ``message_stop`` event (all of it, if that
        event began in an earlier chunk)."""
        marker = chunk.find(b"message_stop")
        start = chunk.rfind(b"event:", 0, marker) if marker >= 0 else -1
        if start < 0 and marker >= 0:
            start = chunk.rfind(b"data:", 0, marker)
        return chunk[:start] if start >= 0 else chunk

    @property
    def size(self) -> int:
        return self._size

    @property
    def whole(self) -> bool:
        """The stream ended with ``message_stop``, nothing malformed or cut off."""
        return self.done and not self.malformed and not self.truncated

    @property
    def usage(self) -> dict[str, Any] | None:
        return chat_usage(self._usage) if self._usage else None

    def answer(self) -> dict[str, Any]:
        """The message the events add up to (Anthropic's shape)."""
        message = dict(self._message or {"role": "assistant"})
        message["content"] = [self._blocks[i] for i in sorted(self._blocks)]
        message["usage"] = dict(self._usage)
        return message

    def message(self) -> dict[str, Any]:
        """The answer as the chat reply the store keeps."""
        view = reply_view(self.answer())
        return view if view is not None else {"role": "assistant", "content": None}


# Which field of a content_block_delta adds to which field of its block.
_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "signature",
    "input_json_delta": "partial_json",
}


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}

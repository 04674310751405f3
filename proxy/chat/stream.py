"""Server-sent events: parse a relayed stream on the side and assemble the reply.

The bytes the client receives are the upstream's own; this module only reads
a copy, so a malformed or unknown event never disturbs the relay.
"""

from __future__ import annotations

from typing import Any

import orjson


class SSEParser:
    """Incremental SSE parser: feed raw chunks, get the ``data:`` payloads of whole events."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        # Normalise CRLF so events split on a blank line whatever the sender used.
        if b"\r" in self._buffer:
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return events
            raw, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            data = [line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
            if data:
                events.append(b"\n".join(data))


class ChatReplyAssembler:
    """Rebuilds the assistant message of choice 0 from chat.completion.chunk events."""

    def __init__(self) -> None:
        self._parser = SSEParser()
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.chunks = 0

    def feed(self, chunk: bytes) -> None:
        for data in self._parser.feed(chunk):
            if data.strip() == b"[DONE]":
                self.done = True
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        self.chunks += 1
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._content.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                self._refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                self._tool_call(call)

    def _tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self._tool_calls))
        slot = self._tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.get("id"):
            slot["id"] = call["id"]
        if call.get("type"):
            slot["type"] = call["type"]
        fn = call.get("function") or {}
        if fn.get("name"):
            slot["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            slot["function"]["arguments"] += fn["arguments"]

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._refusal:
            msg["refusal"] = "".join(self._refusal)
        if self._tool_calls:
            msg["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        return msg


def reply_from_completion(body: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The assistant message of choice 0 and the usage of a chat.completion body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, usage
    message = choices[0].get("message")
    return (dict(message) if isinstance(message, dict) else None), usage

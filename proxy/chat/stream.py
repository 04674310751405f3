"""Server-sent events: parse a relayed stream on the side and assemble the reply.

The bytes the client receives are the upstream's own; this module only reads
a copy, so a malformed or unknown event never disturbs the relay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.errors import UpstreamError


class ReplyAssembler(Protocol):
    """What the relay reads a streamed reply with (chat's below; each door has its own)."""

    chunks: int
    malformed: int
    # The door's end marker arrived (chat: data: [DONE]; Messages: message_stop).
    done: bool
    # The model the answer names (None until it does).
    model: str | None

    def feed(self, chunk: bytes) -> None: ...

    @property
    def errored(self) -> bool:
        """The upstream sent an error event of its own (it reached the client as sent)."""
        ...

    def unfinished(self) -> UpstreamError | None:
        """Why the stream, now ended, is not a whole answer (None: it is one)."""
        ...

    def before_end(self, chunk: bytes) -> bytes:
        """The part of ``chunk`` before the end marker's event."""
        ...

    @property
    def size(self) -> int: ...

    @property
    def whole(self) -> bool: ...

    @property
    def usage(self) -> dict[str, Any] | None: ...

    def message(self) -> dict[str, Any]:
        """The reply as the chat message the store keeps."""
        ...


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
    """Rebuilds the assistant message of choice 0 from chat.completion.chunk events.

    It reads a copy of the relayed bytes and never raises: an event that is
    not JSON, or whose parts have the wrong types (a ``delta`` that is not an
    object...), is counted in ``malformed`` and otherwise ignored. Assembly
    stops past ``max_bytes`` of reply text (``truncated``); the relay goes on.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._parser = SSEParser()
        self._content: list[str] = []
        self._refusal: list[str] = []
        # By (index, n): the n-th call streamed under that index. OpenAI gives each
        # call its own index; Ollama streams every call whole under index 0, each
        # with its own id, so a new id at a used index is a new call.
        self._tool_calls: dict[tuple[int, int], dict[str, Any]] = {}
        self._latest: dict[int, tuple[int, int]] = {}
        self._size = 0
        self._max_bytes = max_bytes
        self.usage: dict[str, Any] | None = None
        # The model the chunks name (the one that answered).
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.chunks = 0
        self.malformed = 0
        # The upstream sent an error event of its own (it reached the client as sent).
        self.errored = False
        self.truncated = False

    def unfinished(self) -> UpstreamError | None:
        return unfinished(self)

    def before_end(self, chunk: bytes) -> bytes:
        return before_done(chunk)

    def feed(self, chunk: bytes) -> None:
        for data in self._parser.feed(chunk):
            if data.strip() == b"[DONE]":
                self.done = True
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                self.malformed += 1
                continue
            if not isinstance(event, dict):
                self.malformed += 1
            elif "error" in event and "choices" not in event:
                self.malformed += 1  # an in-stream error event: the reply did not finish
                self.errored = True
            else:
                self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        self.chunks += 1
        if self.model is None and isinstance(event.get("model"), str):
            self.model = event["model"]
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        choices = event.get("choices") or []
        if not isinstance(choices, list):
            self.malformed += 1
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                self.malformed += 1
                continue
            self._delta(delta)

    def _delta(self, delta: dict[str, Any]) -> None:
        content, refusal = delta.get("content"), delta.get("refusal")
        for text, parts in ((content, self._content), (refusal, self._refusal)):
            if isinstance(text, str) and text:
                self._size += len(text)
                if self._size > self._max_bytes:
                    self.truncated = True
                    return
                parts.append(text)
        calls = delta.get("tool_calls") or []
        if not isinstance(calls, list):
            self.malformed += 1
            return
        for call in calls:
            if isinstance(call, dict):
                self._tool_call(call)
            else:
                self.malformed += 1

    def _tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self._latest))
        if not isinstance(index, int) or isinstance(index, bool):
            self.malformed += 1
            return
        key = self._latest.get(index)
        call_id = call.get("id") if isinstance(call.get("id"), str) and call["id"] else None
        if key is None or (
            call_id is not None and self._tool_calls[key]["id"] not in (None, call_id)
        ):
            key = (index, 0 if key is None else key[1] + 1)
            self._latest[index] = key
            self._tool_calls[key] = {
                "id": None,
                "type": "function",
                "function": {"name": "", "arguments": ""},
            }
        slot = self._tool_calls[key]
        if call_id is not None:
            slot["id"] = call_id
        if isinstance(call.get("type"), str) and call["type"]:
            slot["type"] = call["type"]
        fn = call.get("function") or {}
        if not isinstance(fn, dict):
            self.malformed += 1
            return
        for field in ("name", "arguments"):
            value = fn.get(field)
            if isinstance(value, str) and value:
                self._size += len(value)
                if self._size > self._max_bytes:
                    self.truncated = True
                    return
                slot["function"][field] += value

    @property
    def size(self) -> int:
        """Characters of reply text assembled so far."""
        return self._size

    @property
    def whole(self) -> bool:
        """The stream ended as a finished answer: [DONE], nothing malformed or cut off."""
        return self.done and not self.malformed and not self.truncated

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._refusal:
            msg["refusal"] = "".join(self._refusal)
        if self._tool_calls:
            msg["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        return msg


def unfinished(assembler: ReplyAssembler, marker: str = "data: [DONE]") -> UpstreamError | None:
    """Why a stream that has ended is not a whole answer, or None if it is one.

    The client must be told in-stream: the openai SDK does not raise on a
    missing ``[DONE]`` (nor does a client of any door on a stream that simply
    stops), so such a stream reads as a whole answer. ``marker``: the door's end.
    """
    if assembler.errored:
        return UpstreamError(
            "The upstream ended its stream with an error event.", code="upstream_stream_error"
        )
    if assembler.malformed:
        return UpstreamError(
            f"The upstream's stream had {assembler.malformed} malformed event(s).",
            code="upstream_malformed_stream",
        )
    if not assembler.done:
        return UpstreamError(
            f"The upstream's stream ended without its end marker ({marker}):"
            " the answer may be cut short.",
            code="upstream_stream_incomplete",
        )
    return None


def before_done(chunk: bytes) -> bytes:
    """The part of ``chunk`` before its ``data: [DONE]`` event (all of it, if the
    marker began in an earlier chunk)."""
    marker = chunk.find(b"[DONE]")
    start = chunk.rfind(b"data:", 0, marker) if marker >= 0 else -1
    return chunk[:start] if start >= 0 else chunk


@dataclass(frozen=True)
class Completion:
    """What a chat.completion body says: choice 0's message, usage, the model that answered."""

    message: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None


def reply_from_completion(body: bytes) -> Completion:
    """The assistant message of choice 0, the usage and the model of a chat.completion body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Completion()
    if not isinstance(data, dict):
        return Completion()
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    model = data.get("model") if isinstance(data.get("model"), str) else None
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Completion(None, usage, model)
    message = choices[0].get("message")
    finish = choices[0].get("finish_reason")
    return Completion(
        dict(message) if isinstance(message, dict) else None,
        usage,
        model,
        finish if isinstance(finish, str) else None,
    )

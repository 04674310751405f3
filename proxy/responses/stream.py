"""A Responses API stream, read on the side: the typed events are relayed untouched.

Only a copy is parsed (``proxy.chat.stream.SSEParser``), so an unknown or
malformed event never disturbs the relay. What the proxy needs from a stream
is the response object at its end (``response.completed`` carries it whole)
or, for a stream cut short, what had finished by then.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from proxy.chat.stream import SSEParser

# Events that end a response and carry it whole.
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Events that carry the response as it starts.
_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})


class LineRewrite(Protocol):
    """Rewrites a stream for the client as it passes: whole lines out, a partial one held."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class ResponseAssembler:
    def __init__(self) -> None:
        self._parser = SSEParser()
        self.opening: dict[str, Any] | None = None
        # The terminal event's response object, once it has arrived whole.
        self.final: dict[str, Any] | None = None
        # Finished output items (response.output_item.done), by output index.
        self.items: dict[int, dict[str, Any]] = {}
        self.events = 0
        self.sequence = -1

    def feed(self, chunk: bytes) -> None:
        for data in self._parser.feed(chunk):
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        self.events += 1
        sequence = event.get("sequence_number")
        if isinstance(sequence, int):
            self.sequence = sequence
        kind = event.get("type")
        response = event.get("response")
        if kind in _OPENING and isinstance(response, dict):
            self.opening = response
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            index = event.get("output_index")
            self.items[index if isinstance(index, int) else len(self.items)] = event["item"]
        elif kind in TERMINAL and isinstance(response, dict):
            if not isinstance(response.get("output"), list):
                response = {**response, "output": self.finished()}
            self.final = response

    def finished(self) -> list[dict[str, Any]]:
        return [self.items[i] for i in sorted(self.items)]

    def partial(self) -> dict[str, Any] | None:
        """A stream cut short: the response as it opened, incomplete, with its finished items."""
        if self.opening is None:
            return None
        return {**self.opening, "status": "incomplete", "output": self.finished()}

    def error_event(self, body: dict[str, Any]) -> bytes:
        """An ``error`` event for a failure after the headers went out (as OpenAI sends one)."""
        error = body.get("error") or {}
        event = {
            "type": "error",
            "code": error.get("code"),
            "message": error.get("message"),
            "param": error.get("param"),
            "sequence_number": self.sequence + 1,
        }
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"

    def failed_event(self, body: dict[str, Any]) -> bytes:
        """A ``response.failed`` event for a stream that ended without its terminal event:
        the response as it opened, failed, with the error (an ``error`` event if it never
        opened)."""
        if self.opening is None:
            return self.error_event(body)
        error = body.get("error") or {}
        response = {
            **self.opening,
            "status": "failed",
            "output": self.finished(),
            # The spec's codes are the model's (an enum): ours leads the message.
            "error": {
                "code": "server_error",
                "message": f"{error.get('code')}: {error.get('message')}",
            },
        }
        event = {
            "type": "response.failed",
            "response": response,
            "sequence_number": self.sequence + 1,
        }
        return b"event: response.failed\ndata: " + orjson.dumps(event) + b"\n\n"


def response_from_body(body: bytes) -> dict[str, Any] | None:
    """The response object of a non-streamed answer, if it is one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("id"), str) else None

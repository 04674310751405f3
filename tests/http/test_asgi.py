"""Responses sent over raw ASGI (proxy.http.asgi.respond)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response, StreamingResponse

from proxy.http.asgi import respond


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append([data])

    def writelines(self, parts: list[bytes]) -> None:
        self.writes.append(list(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class Cycle:
    """uvicorn's request cycle as respond() meets it: ``receive`` is its bound method and
    ``send`` writes the head, then the body, each to its transport."""

    def __init__(self, keep_alive: bool = True) -> None:
        self.transport: Any = RecordingTransport()
        self.keep_alive = keep_alive

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.transport.write(b"HTTP/1.1 %d\r\n\r\n" % message["status"])
        else:
            self.transport.write(message["body"])
            if not self.keep_alive:
                self.transport.close()


async def test_a_whole_response_is_one_write_of_its_head_and_body() -> None:
    cycle = Cycle()
    transport = cycle.transport
    await respond(Response(b'{"ok":1}', status_code=200), cycle.receive, cycle.send)
    assert transport.writes == [[b"HTTP/1.1 200\r\n\r\n", b'{"ok":1}']]
    assert cycle.transport is transport  # the cycle has its own transport back


async def test_a_connection_closed_after_the_response_gets_it_whole_first() -> None:
    cycle = Cycle(keep_alive=False)
    transport = cycle.transport
    await respond(Response(b"bye", status_code=200), cycle.receive, cycle.send)
    assert transport.writes == [[b"HTTP/1.1 200\r\n\r\n", b"bye"]] and transport.closed


async def test_a_stream_sends_its_head_with_the_first_event_at_once_then_writes_per_turn() -> None:
    cycle = Cycle()
    transport = cycle.transport
    head = b"HTTP/1.1 200\r\n\r\n"

    async def events() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        # Out before the stream goes on: what follows may be at hand already, with the
        # exchange's ending, and the first event does not wait for them.
        assert transport.writes == [[head, b"data: 1\n\n"]]
        yield b"data: 2\n\n"
        yield b"data: 3\n\n"
        await asyncio.sleep(0.05)  # the upstream's next event is not there yet
        assert transport.writes[1:] == [[b"data: 2\n\n", b"data: 3\n\n"]]
        yield b"data: 4\n\n"

    await respond(StreamingResponse(events(), status_code=200), cycle.receive, cycle.send)
    assert transport.writes[2:] == [[b"data: 4\n\n", b""]]
    assert cycle.transport is transport


async def test_a_stream_whose_first_event_is_not_at_hand_sends_its_head_meanwhile() -> None:
    cycle = Cycle()
    transport = cycle.transport

    async def events() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.05)  # the upstream is still thinking
        assert transport.writes == [[b"HTTP/1.1 200\r\n\r\n"]]
        yield b"data: 1\n\n"

    await respond(StreamingResponse(events(), status_code=200), cycle.receive, cycle.send)
    assert transport.writes[1:] == [[b"data: 1\n\n"], [b""]]


async def test_without_a_cycle_behind_receive_the_messages_go_as_they_come() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await respond(Response(b"x", status_code=201), receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_two_answers_on_one_keep_alive_connection_arrive_whole(fake, start_proxy):
    proxy = start_proxy()
    host, port = proxy.url.removeprefix("http://").split(":")
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for _ in range(2):
            s.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            head, rest = data.split(b"\r\n\r\n", 1)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(rest) < length:
                rest += s.recv(65536)
            assert head.startswith(b"HTTP/1.1 200") and b"x-context-policy" in head
            assert len(rest) == length and rest.startswith(b"{")

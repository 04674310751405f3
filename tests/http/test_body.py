"""Request plumbing: the body read straight from ASGI messages, repeated headers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from proxy.errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from proxy.http.body import read_body
from tests.harness import query


def request(*messages: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    scope = {"type": "http", "method": "POST", "headers": headers or [], "path": "/"}
    return Request(scope, receive)


def chunk(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_a_body_in_several_messages_is_read_whole():
    r = request(chunk(b'{"a":', True), chunk(b"", True), chunk(b" 1}", False))
    assert await read_body(r, 100) == b'{"a": 1}'


async def test_a_body_in_one_message_is_returned_as_is():
    body = b'{"model": "gpt-4o"}'
    assert await read_body(request(chunk(body, False)), 100) is body


async def test_an_empty_body_is_empty():
    assert await read_body(request({"type": "http.request"}), 100) == b""


async def test_a_body_over_the_limit_is_refused_while_streaming():
    r = request(chunk(b"x" * 60, True), chunk(b"x" * 60, False))
    with pytest.raises(PayloadTooLarge):
        await read_body(r, 100)


async def test_a_declared_length_over_the_limit_is_drained_then_refused():
    # Read and dropped first, so a client still writing gets the 413 (lingering close).
    r = request(
        chunk(b"x" * 60, True), chunk(b"x" * 41, False), headers=[(b"content-length", b"101")]
    )
    with pytest.raises(PayloadTooLarge):
        await read_body(r, 100)


async def test_a_declared_length_over_the_limit_with_expect_100_is_refused_before_reading():
    headers = [(b"content-length", b"101"), (b"expect", b"100-continue")]
    r = request(headers=headers)  # no message to read at all
    with pytest.raises(PayloadTooLarge):
        await read_body(r, 100)


async def test_a_client_gone_before_the_end_of_its_body_is_a_bad_request():
    r = request(chunk(b"{", True), {"type": "http.disconnect"})
    with pytest.raises(InvalidRequest, match="disconnected"):
        await read_body(r, 100)


class Cycle:
    """What read_body sees of uvicorn's request cycle: its receive, its message event."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.message_event = asyncio.Event()
        if self.messages:
            self.message_event.set()

    async def receive(self) -> dict[str, Any]:
        await self.message_event.wait()
        return self.messages.pop(0)


async def test_a_body_the_server_holds_already_is_read_without_a_deadline(monkeypatch):
    def no_timer(delay: float) -> None:
        raise AssertionError("a deadline was armed")

    cycle = Cycle(chunk(b'{"a": 1}', False))
    monkeypatch.setattr(asyncio, "timeout", no_timer)
    r = Request({"type": "http", "method": "POST", "headers": [], "path": "/"}, cycle.receive)
    assert await read_body(r, 100) == b'{"a": 1}'


async def test_a_body_still_to_come_from_the_server_has_its_deadline():
    cycle = Cycle()  # nothing arrived yet, nothing will
    r = Request({"type": "http", "method": "POST", "headers": [], "path": "/"}, cycle.receive)
    with pytest.raises(RequestTimeout):
        await read_body(r, 100, idle_timeout_s=0.05)


def test_a_repeated_session_header_is_read_from_its_first_occurrence(fake, start_proxy, tmp_path):
    proxy = start_proxy()
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        headers=[
            ("X-Session-Id", "first"),
            ("X-Session-Id", "second"),
            ("Authorization", "Bearer sk-a"),
        ],
    )
    assert response.headers["x-session-id"] == "first"
    proxy.drain()
    assert [r["key"] for r in query(tmp_path / "ctxproxy.db", "SELECT key FROM sessions")] == [
        "first"
    ]

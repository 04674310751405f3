"""An OpenAI-compatible upstream that misbehaves on purpose, one fault per request.

``FaultUpstream.fault`` names what the next chat completion gets; every
fault exists plain and streamed (the request's ``stream`` picks which).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

FAULTS = (
    "ok",
    "status_500",
    "status_429",
    "hang",
    "stall_after_headers",
    "cut_mid_stream",
    "invalid_json",
    "malformed_sse",
    "no_done",
    "error_event",
    "null_content",
    "huge",
)
HUGE_CHARS = 4 * 1024 * 1024
ERROR_EVENT = (
    b'data: {"error": {"message": "overloaded", "type": "server_error", "param": null,'
    b' "code": "overloaded"}}\n\n'
)
HANG_S = 30.0


def _completion(content: str | None) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-f",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


def _chunk(delta: Any, finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-f",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _events(content: str) -> list[bytes]:
    pieces = [content[i : i + 1024 * 64] for i in range(0, len(content), 1024 * 64)] or [""]
    return [
        _chunk({"role": "assistant", "content": ""}),
        *(_chunk({"content": p}) for p in pieces),
        _chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]


@dataclass
class FaultUpstream:
    fault: str = "ok"
    received: list[dict[str, Any]] = field(default_factory=list)
    _hung: set[asyncio.Future[None]] = field(default_factory=set)

    async def _hang(self) -> None:
        """Wait as a hung upstream does, until ``unblock`` (the test's teardown)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._hung.add(future)
        try:
            await asyncio.wait_for(future, HANG_S)
        except TimeoutError:
            pass
        finally:
            self._hung.discard(future)

    async def unblock(self) -> None:
        for future in list(self._hung):
            if not future.done():
                future.set_result(None)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        stream = body.get("stream") is True
        fault = self.fault
        if fault in ("status_500", "status_429"):
            status = int(fault[-3:])
            error = {
                "error": {
                    "message": "upstream says no",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            }
            return web.json_response(error, status=status)
        if fault == "hang":
            await self._hang()
        if not stream:
            return await self._plain(request, fault)
        return await self._stream(request, fault)

    async def _plain(self, request: web.Request, fault: str) -> web.StreamResponse:
        if fault == "invalid_json":
            return web.Response(body=b"<html>oops</html>", content_type="application/json")
        if fault == "null_content":
            return web.Response(body=_completion(None), content_type="application/json")
        if fault == "error_event":  # a 200 whose body is an error, not a completion
            return web.Response(
                body=ERROR_EVENT[len(b"data: ") : -2], content_type="application/json"
            )
        body = _completion("x" * HUGE_CHARS if fault == "huge" else "fine")
        if fault in ("stall_after_headers", "cut_mid_stream", "malformed_sse", "no_done"):
            # Headers and half the body, then a stall or a cut.
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[: len(body) // 2])
            if fault == "stall_after_headers":
                await self._hang()
            assert request.transport is not None
            request.transport.close()
            return response
        return web.Response(body=body, content_type="application/json")

    async def _stream(self, request: web.Request, fault: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if fault == "invalid_json":
            events = [b"data: {not json\n\n", b"data: [DONE]\n\n"]
        elif fault == "malformed_sse":
            events = [
                _chunk({"role": "assistant", "content": "a"}),
                _chunk("not an object"),
                _chunk({}, "stop"),
                b"data: [DONE]\n\n",
            ]
        elif fault == "null_content":
            events = [_chunk({"role": "assistant"}), _chunk({}, "stop"), b"data: [DONE]\n\n"]
        elif fault == "error_event":  # OpenAI's in-stream error: the stream ends there
            events = [_chunk({"role": "assistant", "content": "a"}), ERROR_EVENT]
        else:
            events = _events("x" * HUGE_CHARS if fault == "huge" else "fine answer")
        for n, event in enumerate(events):
            if n == 2 and fault in ("stall_after_headers", "cut_mid_stream"):
                if fault == "stall_after_headers":
                    await self._hang()
                assert request.transport is not None
                request.transport.close()
                return response
            if fault == "no_done" and event.startswith(b"data: [DONE]"):
                break
            await response.write(event)
        await response.write_eof()
        return response

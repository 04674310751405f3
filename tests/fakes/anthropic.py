"""A fake Anthropic Messages API on loopback, for tests.

It serves ``POST /v1/messages`` (litellm appends ``/v1/messages`` to an
``anthropic/...`` model's ``api_base``), answers JSON or SSE with Anthropic's
real event types, records every request, and can be scripted to answer with a
tool call, thinking blocks with signatures, an error status, a delay, or a
stream that never ends. It also serves ``POST /v1/messages/count_tokens`` and
``GET /v1/models`` in Anthropic's shapes.

``strict=True`` checks every request body against the ``anthropic`` SDK's own
request types and every answer and event it sends against the SDK's response
types; what fails is listed in ``problems`` (a test asserts it stays empty).

    async with FakeAnthropic() as fake:
        fake.script(Reply.tool("get_weather", {"city": "Paris"}))
        ...  # point the client at fake.url
        assert fake.requests[0].json["system"] == ...
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.fakes.prefix_cache import AnthropicPrefixCache, Block

MESSAGES_PATH = "/v1/messages"


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = "toolu_fake_01"


@dataclass(frozen=True)
class Reply:
    """What the fake answers to one request."""

    text: str = "Hello from the fake Anthropic."
    tool_use: ToolUse | None = None
    # A thinking block (thinking text, signature) first, and a redacted one's data.
    thinking: tuple[str, str] | None = None
    redacted_thinking: str | None = None
    # How the text is cut into text_delta events when streaming; None: by words.
    pieces: tuple[str, ...] | None = None
    input_tokens: int = 11
    output_tokens: int = 7
    # An error status answers Anthropic's error JSON instead of a message.
    status: int = 200
    error_type: str = "invalid_request_error"
    error_message: str = "fake error"
    # Seconds to wait before answering (to provoke client timeouts).
    delay_s: float = 0.0
    retry_after: str | None = None
    # Streaming only: after the text deltas (if any), keep the stream open with
    # pings until the client goes away (to check that a client can abort) ...
    hold_open: bool = False
    # ... or fall silent for a while (to provoke a read timeout mid-stream) ...
    stall_s: float = 0.0
    # ... or end it with an in-stream error event: (error type, message) ...
    stream_error: tuple[str, str] | None = None
    # ... or just end it there, without message_delta or message_stop (a dropped upstream).
    cut_short: bool = False

    @classmethod
    def tool(cls, name: str, input: dict[str, Any], *, text: str = "") -> Reply:
        return cls(text=text, tool_use=ToolUse(name, input))

    @classmethod
    def error(
        cls, status: int, error_type: str, message: str, *, retry_after: str | None = None
    ) -> Reply:
        return cls(
            status=status, error_type=error_type, error_message=message, retry_after=retry_after
        )

    def text_pieces(self) -> list[str]:
        if self.pieces is not None:
            return list(self.pieces)
        # Word by word, whitespace kept, so the pieces join back to the text exactly.
        return re.findall(r"\s*\S+\s*", self.text) or [self.text]


@dataclass
class RecordedRequest:
    path: str
    # Header names lower-cased.
    headers: dict[str, str]
    json: dict[str, Any]
    query: str = ""


@dataclass
class FakeAnthropic:
    model: str = "claude-fake-1"
    requests: list[RecordedRequest] = field(default_factory=list)
    # Set when a stream noticed its client had gone.
    stream_aborted: asyncio.Event = field(default_factory=asyncio.Event)
    # A simulated Anthropic prompt cache: usage then reports cache_read_input_tokens
    # and cache_creation_input_tokens, and input_tokens is what neither covers.
    prefix_cache: AnthropicPrefixCache | None = None
    # Validate bodies and events against the anthropic SDK's types (see the docstring).
    strict: bool = False
    # usage.input_tokens: the request's own size (its blocks, counted) instead of the
    # reply's fixed figure, as a real upstream reports it (the proxy calibrates from it).
    count_input: bool = False
    problems: list[str] = field(default_factory=list)
    # Messages answered so far: each answer's id is numbered (msg_fake_01, ...), as the
    # API's are unique (Claude Code merges the blocks of answers that share an id).
    answered: int = 0
    # The bytes of the last stream sent, for byte-for-byte checks of a relay.
    last_stream: bytearray = field(default_factory=bytearray)
    _replies: deque[Reply] = field(default_factory=deque)
    # The cache's answer to the request being served.
    _cache_usage: dict[str, int] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    _port: int = 0

    @property
    def url(self) -> str:
        """The base URL to give litellm as ``api_base``."""
        if self._runner is None:
            raise RuntimeError("FakeAnthropic is not started")
        return f"http://127.0.0.1:{self._port}"

    def script(self, *replies: Reply) -> None:
        """Queue replies, used in order; when the queue is empty, a default text reply."""
        self._replies.extend(replies)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(MESSAGES_PATH, self._handle)
        app.router.add_post(MESSAGES_PATH + "/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        # A short shutdown: a test that timed out must not wait for a delayed reply.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        # Port 0: the OS picks a free port; bind the socket ourselves to read it back.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeAnthropic:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _record(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        self.requests.append(
            RecordedRequest(
                path=request.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                json=body,
                query=request.query_string,
            )
        )
        return body

    def _check(self, kind: Any, value: Any, what: str) -> None:
        """``value`` validated as the SDK's ``kind``; a failure listed in ``problems``."""
        if not self.strict:
            return
        from pydantic import TypeAdapter, ValidationError

        try:
            TypeAdapter(kind).validate_python(value, strict=False)
        except ValidationError as exc:
            self.problems.append(f"{what}: {exc}")

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        from anthropic.types import MessageCountTokensParams, MessageTokensCount

        self._check(MessageCountTokensParams, body, "count_tokens request")
        blocks, _ = anthropic_blocks(body)
        answer = {"input_tokens": sum(tokens for _, tokens in blocks)}
        self._check(MessageTokensCount, answer, "count_tokens answer")
        return web.json_response(answer)

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append(RecordedRequest(request.path, dict(request.headers), {}))
        model = {
            "type": "model",
            "id": self.model,
            "display_name": "Claude Fake",
            "created_at": "2025-01-01T00:00:00Z",
            "lifecycle": "active",
        }
        return web.json_response(
            {"data": [model], "has_more": False, "first_id": self.model, "last_id": self.model}
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        from anthropic.types import message_create_params as params

        kind = (
            params.MessageCreateParamsStreaming
            if body.get("stream")
            else params.MessageCreateParamsNonStreaming
        )
        self._check(kind, body, "request")
        reply = self.reply_for(body)
        self.answered += 1
        self._cache_usage = {}
        if self.prefix_cache is not None:
            blocks, marks = anthropic_blocks(body)
            result = self.prefix_cache.request(blocks, marks)
            self._cache_usage = {
                "input_tokens": result.uncached_tokens,
                "cache_read_input_tokens": result.cached_tokens,
                "cache_creation_input_tokens": result.written_tokens,
            }
        elif self.count_input:
            counted, _ = anthropic_blocks(body)
            self._cache_usage = {"input_tokens": sum(tokens for _, tokens in counted)}
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            error = {"type": reply.error_type, "message": reply.error_message}
            headers = {"retry-after": reply.retry_after} if reply.retry_after else None
            return web.json_response(
                {"type": "error", "error": error}, status=reply.status, headers=headers
            )
        if body.get("stream"):
            return await self._stream(request, reply)
        from anthropic.types import Message

        message = self._message(reply)
        self._check(Message, message, "message")
        return web.json_response(message)

    def reply_for(self, body: dict[str, Any]) -> Reply:
        """The answer to a request: the next scripted reply, else a default text."""
        return self._replies.popleft() if self._replies else Reply()

    def _content(self, reply: Reply) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if reply.thinking is not None:
            thinking, signature = reply.thinking
            content.append({"type": "thinking", "thinking": thinking, "signature": signature})
        if reply.redacted_thinking is not None:
            content.append({"type": "redacted_thinking", "data": reply.redacted_thinking})
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        if reply.tool_use is not None:
            tool = reply.tool_use
            content.append(
                {"type": "tool_use", "id": tool.id, "name": tool.name, "input": tool.input}
            )
        return content

    @staticmethod
    def _stop_reason(reply: Reply) -> str:
        return "tool_use" if reply.tool_use else "end_turn"

    def _message(self, reply: Reply) -> dict[str, Any]:
        return {
            "id": f"msg_fake_{self.answered:02d}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self._content(reply),
            "stop_reason": self._stop_reason(reply),
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                **self._cache_usage,
            },
        }

    async def _stream(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)

        from anthropic.types import RawMessageStreamEvent

        self.last_stream.clear()

        async def send(event: str, data: dict[str, Any]) -> None:
            if event not in ("ping", "error"):
                self._check(RawMessageStreamEvent, data, f"event {event}")
            raw = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
            self.last_stream += raw
            await response.write(raw)

        try:
            await self._events(send, reply)
        except ConnectionError:
            # The client went away mid-stream (a write to a closed connection
            # is how a server notices).
            self.stream_aborted.set()
            return response
        except asyncio.CancelledError:
            self.stream_aborted.set()
            raise
        await response.write_eof()
        return response

    async def _events(self, send: _Send, reply: Reply) -> None:
        start = self._message(reply) | {"content": [], "stop_reason": None}
        start["usage"] = {
            "input_tokens": reply.input_tokens,
            "output_tokens": 1,
            **self._cache_usage,
        }
        await send("message_start", {"type": "message_start", "message": start})
        await send("ping", {"type": "ping"})
        index = 0
        if reply.thinking is not None:
            thinking, signature = reply.thinking
            start_block = {"type": "thinking", "thinking": "", "signature": ""}
            await send("content_block_start", _block_start(index, start_block))
            for piece in re.findall(r"\s*\S+\s*", thinking) or [thinking]:
                delta = _block_delta(index, "thinking_delta", thinking=piece)
                await send("content_block_delta", delta)
            sig = _block_delta(index, "signature_delta", signature=signature)
            await send("content_block_delta", sig)
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        if reply.redacted_thinking is not None:
            block = {"type": "redacted_thinking", "data": reply.redacted_thinking}
            await send("content_block_start", _block_start(index, block))
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        if reply.text:
            await send("content_block_start", _block_start(index, {"type": "text", "text": ""}))
            for piece in reply.text_pieces():
                await send("content_block_delta", _block_delta(index, "text_delta", text=piece))
        if reply.stall_s:
            await asyncio.sleep(reply.stall_s)
        if reply.hold_open:
            # Pings until the client leaves; bounded so a broken test cannot hang.
            for _ in range(250):
                await asyncio.sleep(0.02)
                await send("ping", {"type": "ping"})
            return
        if reply.stream_error is not None:
            error_type, message = reply.stream_error
            await send(
                "error", {"type": "error", "error": {"type": error_type, "message": message}}
            )
            return
        if reply.cut_short:
            return
        if reply.text:
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        if reply.tool_use is not None:
            tool = reply.tool_use
            block = {"type": "tool_use", "id": tool.id, "name": tool.name, "input": {}}
            await send("content_block_start", _block_start(index, block))
            arguments = json.dumps(tool.input)
            # Cut the JSON mid-token, as Anthropic does.
            for cut in range(0, len(arguments), 7):
                piece = arguments[cut : cut + 7]
                delta = _block_delta(index, "input_json_delta", partial_json=piece)
                await send("content_block_delta", delta)
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(reply), "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        }
        await send("message_delta", message_delta)
        await send("message_stop", {"type": "message_stop"})


_Send = Callable[[str, dict[str, Any]], Awaitable[None]]


def _block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _block_delta(index: int, kind: str, **fields: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind, **fields}}


def anthropic_blocks(body: dict[str, Any]) -> tuple[list[Block], list[int]]:
    """An Anthropic Messages body as prompt-cache blocks (tools, system, each content
    block in order) and the indexes of the blocks that carry ``cache_control``."""
    from proxy.context.tokens import load_encoding

    encoding = load_encoding("o200k_base")
    blocks: list[Block] = []
    marks: list[int] = []

    def add(block: Any) -> None:
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        if block.get("cache_control"):
            marks.append(len(blocks))
        text = json.dumps(plain, sort_keys=True)
        digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
        blocks.append((digest, max(1, len(encoding.encode_ordinary(text)))))

    for tool in body.get("tools") or []:
        add(tool)
    system = body.get("system")
    if isinstance(system, str):
        add({"type": "text", "text": system})
    for block in system if isinstance(system, list) else []:
        add(block)
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content or []:
            add({**block, "role": message.get("role")})
    return blocks, marks


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def sse_events(chunks: list[bytes]) -> list[dict[str, Any]]:
    """The JSON payloads of OpenAI SSE chunks, asserting each is one whole ``data:`` event."""
    out = []
    for chunk in chunks:
        assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n"), chunk
        if chunk != b"data: [DONE]\n\n":
            out.append(json.loads(chunk[6:]))
    return out

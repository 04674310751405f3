"""A fake OpenAI-compatible upstream that records what it receives.

It answers chat completions in OpenAI's shapes (JSON and SSE), from a FIFO of
scripted replies or, when the script is empty, with an echo of the last user
message. Tests assert on ``received`` (what reached the upstream) and on what
the client got back.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.prefix_cache import Block, OpenAIPrefixCache

LIST_CONTENT_ERROR = orjson.dumps(
    {
        "error": {
            "message": "10 validation errors:\n  {'type': 'string_type', 'loc': ('body', "
            "'messages', 1, 'ChatCompletionRequestAssistantMessage', 'content'), "
            "'msg': 'Input should be a valid string'}",
            "type": "internal_server_error",
            "param": None,
            "code": None,
        }
    }
)


@dataclass
class Reply:
    status: int = 200
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    # A raw body to answer with instead (error bodies, odd payloads).
    body: bytes | None = None
    # Seconds to wait before answering / between stream chunks.
    delay: float = 0.0
    chunk_delay: float = 0.0
    # Stop a stream after this many chunks and drop the connection.
    break_after_chunks: int | None = None
    prompt_tokens: int | None = None
    # The answer's finish_reason ("length": cut off at max_tokens); None: stop / tool_calls.
    finish_reason: str | None = None


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    json: Any


@dataclass
class FakeUpstream:
    replies: list[Reply] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    stream_chunks: int = 0
    ids: Any = field(default_factory=lambda: itertools.count(1))
    # Raw response bytes sent to the last request, for byte-equality checks.
    last_response: bytes = b""
    # usage.prompt_tokens is round(factor * tiktoken's count of the request): 1.0 is
    # a model tiktoken counts exactly (so the proxy's token calibration stays at 1
    # in every test); 1.1 is one whose tokenizer tiktoken does not match.
    prompt_token_factor: float = 1.0
    # Summarizer calls (ctxproxy marks them with a header) are answered from this
    # FIFO (a failure status, a delay past the timeout, empty content...), and
    # when it is empty with a numbered summary that quotes nothing.
    summary_replies: list[Reply] = field(default_factory=list)
    summaries_made: int = 0
    # A simulated OpenAI prompt cache: usage then reports
    # prompt_tokens_details.cached_tokens (None: usage without details, as before).
    prefix_cache: OpenAIPrefixCache | None = None
    # llama-cpp-python's request model takes ``content`` only as a string (but a
    # user's): a list of parts fails its validation, answered as this 500.
    string_content_only: bool = False
    # The model a local server names in its answers whatever name it was sent
    # (llama-cpp-python: its model path); None answers with the name sent.
    served_model: str | None = None
    # What a local server says of its context window, asked at its root:
    # llama.cpp's GET /props n_ctx, vLLM's max_model_len in /v1/models, Ollama's
    # num_ctx from POST /api/show (None: that endpoint is a 404, as on other servers).
    n_ctx: int | None = None
    # llama-cpp-python's POST /extras/tokenize/count: its count of a text, the
    # tokenizer prompt_token_factor says (False: a 404, as on servers without it).
    tokenize: bool = False
    # Ollama streams each tool call whole, in one chunk, every one under index 0.
    tool_calls_at_index_zero: bool = False
    max_model_len: int | None = None
    num_ctx: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_get("/props", self.props)
        app.router.add_post("/api/show", self.show)
        app.router.add_post("/extras/tokenize/count", self.tokenize_count)
        return app

    async def tokenize_count(self, request: web.Request) -> web.Response:
        rec = await self._record(request)
        if not self.tokenize:
            raise web.HTTPNotFound()
        from proxy.context.tokens import counter_for

        text = str((rec.json or {}).get("input") or "")
        counter = counter_for("gpt-4o")
        local = counter.count_message({"content": text}) - counter.count_message({"content": ""})
        return web.json_response({"count": round(self.prompt_token_factor * local)})

    async def props(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.n_ctx is None:
            raise web.HTTPNotFound()
        body = {"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": 1}
        return web.json_response(body)

    async def show(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.num_ctx is None:
            raise web.HTTPNotFound()
        parameters = f'stop "<end_of_turn>"\nnum_ctx {self.num_ctx}\ntemperature 1'
        return web.json_response({"parameters": parameters, "model_info": {}})

    async def _record(self, request: web.Request) -> Received:
        raw = await request.read()
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        rec = Received(request.method, request.path, dict(request.headers), raw, data)
        self.received.append(rec)
        return rec

    async def models(self, request: web.Request) -> web.Response:
        await self._record(request)
        body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "fake"},
                    {"id": "gpt-4o-mini", "object": "model", "created": 1, "owned_by": "fake"},
                    *(
                        [
                            {
                                "id": self.served_model or "local",
                                "object": "model",
                                "max_model_len": self.max_model_len,
                            }
                        ]
                        if self.max_model_len is not None
                        else []
                    ),
                ],
            }
        )
        return web.Response(body=body, content_type="application/json")

    async def model(self, request: web.Request) -> web.Response:
        await self._record(request)
        name = request.match_info["model"]
        body = orjson.dumps({"id": name, "object": "model", "created": 1, "owned_by": "fake"})
        return web.Response(body=body, content_type="application/json")

    def _reply_for(self, data: Any) -> Reply:
        if self.replies:
            return self.replies.pop(0)
        last_user = next(
            (
                m.get("content")
                for m in reversed(data.get("messages") or [])
                if isinstance(m, dict) and m.get("role") == "user"
            ),
            "",
        )
        return Reply(content=f"echo: {last_user if isinstance(last_user, str) else 'parts'}")

    @property
    def chat_requests(self) -> list[Received]:
        """What reached the upstream for the clients: every request but summarizer calls."""
        return [r for r in self.received if not is_summarizer_call(r)]

    @property
    def summarizer_requests(self) -> list[Received]:
        return [r for r in self.received if is_summarizer_call(r)]

    def _summary_reply(self) -> Reply:
        self.summaries_made += 1
        if self.summary_replies:
            return self.summary_replies.pop(0)
        return Reply(content=f"## Goal and context\n- fake summary {self.summaries_made}")

    def _prompt_tokens(self, data: dict[str, Any]) -> int:
        from proxy.context.tokens import counter_for

        messages = [m for m in data.get("messages") or [] if isinstance(m, dict)]
        counter = counter_for(str(data.get("model") or "gpt-4o"))
        local = counter.count_messages(messages) + counter.count_request_fixed(data)
        return round(self.prompt_token_factor * local)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request)
        data = rec.json if isinstance(rec.json, dict) else {}
        if self.string_content_only and any(
            isinstance(m, dict) and isinstance(m.get("content"), list) and m.get("role") != "user"
            for m in data.get("messages") or []
        ):
            return web.Response(
                status=500, body=LIST_CONTENT_ERROR, content_type="application/json"
            )
        reply = self._summary_reply() if is_summarizer_call(rec) else self._reply_for(data)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.body is not None or reply.status != 200:
            body = reply.body or orjson.dumps(
                {
                    "error": {
                        "message": "scripted failure",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                }
            )
            self.last_response = body
            return web.Response(status=reply.status, body=body, content_type="application/json")
        cid = f"chatcmpl-{next(self.ids)}"
        model = self.served_model or data.get("model", "gpt-4o")
        prompt_tokens = reply.prompt_tokens or self._prompt_tokens(data)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 5,
            "total_tokens": prompt_tokens + 5,
        }
        if self.prefix_cache is not None:
            key = data.get("prompt_cache_key")
            result = self.prefix_cache.request(
                prompt_blocks(data), key if isinstance(key, str) else ""
            )
            usage["prompt_tokens_details"] = {"cached_tokens": result.cached_tokens}
        if data.get("stream"):
            return await self._stream(request, reply, cid, model, usage, data)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        body = orjson.dumps(
            {
                "id": cid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": reply.finish_reason
                        or ("tool_calls" if reply.tool_calls else "stop"),
                    }
                ],
                "usage": usage,
                "system_fingerprint": "fp_fake",
            }
        )
        self.last_response = body
        return web.Response(
            body=body, content_type="application/json", headers={"x-request-id": f"req_{cid}"}
        )

    async def _stream(
        self,
        request: web.Request,
        reply: Reply,
        cid: str,
        model: str,
        usage: dict[str, Any],
        data: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent: list[bytes] = []
        base = {"id": cid, "object": "chat.completion.chunk", "created": 1, "model": model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            event = {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            return b"data: " + orjson.dumps(event) + b"\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        text = reply.content or ""
        for i in range(0, len(text), 4):
            events.append(chunk({"content": text[i : i + 4]}))
        for n, call in enumerate(reply.tool_calls or []):
            args = call["function"]["arguments"]
            if self.tool_calls_at_index_zero:
                events.append(chunk({"tool_calls": [{"index": 0, **call}]}))
                continue
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": n,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for i in range(0, len(args), 5):
                events.append(
                    chunk(
                        {"tool_calls": [{"index": n, "function": {"arguments": args[i : i + 5]}}]}
                    )
                )
        events.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
        if (data.get("stream_options") or {}).get("include_usage"):
            events.append(
                b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            )
        events.append(b"data: [DONE]\n\n")
        for n, event in enumerate(events):
            if reply.break_after_chunks is not None and n >= reply.break_after_chunks:
                self.last_response = b"".join(sent)
                assert request.transport is not None
                request.transport.close()
                return resp
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            try:
                await resp.write(event)
            except (ConnectionResetError, RuntimeError):
                break
            sent.append(event)
            self.stream_chunks += 1
        self.last_response = b"".join(sent)
        await resp.write_eof()
        return resp


def prompt_blocks(data: dict[str, Any]) -> list[Block]:
    """A chat body as prompt-cache blocks: what precedes the messages, then each message."""
    from proxy.context.tokens import counter_for

    counter = counter_for(str(data.get("model") or "gpt-4o"))
    messages = [m for m in data.get("messages") or [] if isinstance(m, dict)]
    head = orjson.dumps([data.get("tools"), data.get("functions")], option=orjson.OPT_SORT_KEYS)
    blocks: list[Block] = [(_digest(head), counter.count_request_fixed(data))]
    for m in messages:
        blocks.append(
            (_digest(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)), counter.count_message(m))
        )
    return blocks


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def is_summarizer_call(rec: Received) -> bool:
    """A summary request from ctxproxy's summarizer (it sends this header on each)."""
    return any(k.lower() == "x-ctxproxy-summarizer" for k in rec.headers)

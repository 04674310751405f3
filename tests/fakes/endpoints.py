"""A fake OpenAI upstream for every endpoint but chat and Responses, recording what it gets.

Each answer has the shape the openai SDK parses (embeddings, completions and
their SSE stream, moderations, files and file content, audio speech and
transcriptions, images, batches, uploads and their parts), and its exact bytes
are kept in ``sent`` so tests can check the client got them unchanged.
``hold`` makes the SSE and binary answers wait after their first chunk until
it is set, so a test can show the proxy relays before the upstream finishes.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.upstream import Received

AUDIO = bytes(range(256)) * 64  # 16 KiB of "mp3", every byte value
FILE_CONTENT = b'{"custom_id": "r1"}\n' * 100


@dataclass
class FakeEndpoints:
    received: list[Received] = field(default_factory=list)
    # The body bytes of each answer, in order.
    sent: list[bytes] = field(default_factory=list)
    models: list[str] = field(default_factory=lambda: ["text-embedding-3-small"])
    # Answer /v1/models with this status instead (a failing upstream).
    models_status: int = 200
    hold: asyncio.Event | None = None
    ids: Any = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/v1/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            data = orjson.loads(raw) if raw and request.content_type == "application/json" else None
        except orjson.JSONDecodeError:
            data = None
        path = request.path
        self.received.append(
            Received(
                request.method,
                path + (f"?{request.query_string}" if request.query_string else ""),
                dict(request.headers),
                raw,
                data,
            )
        )
        n = next(self.ids)
        if path == "/v1/models":
            if self.models_status != 200:
                return self._json(
                    {"error": {"message": "down", "type": "server_error"}}, self.models_status
                )
            return self._json(
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "created": 1, "owned_by": "fake"}
                        for m in self.models
                    ],
                }
            )
        if path.startswith("/v1/models/"):
            name = path.removeprefix("/v1/models/")
            if name not in self.models:
                return self._json(
                    {
                        "error": {
                            "message": f"The model '{name}' does not exist",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": "model_not_found",
                        }
                    },
                    404,
                )
            return self._json({"id": name, "object": "model", "created": 1, "owned_by": "fake"})
        if path == "/v1/embeddings":
            inputs = data["input"] if isinstance(data["input"], list) else [data["input"]]
            return self._json(
                {
                    "object": "list",
                    "model": data["model"],
                    "data": [
                        {"object": "embedding", "index": i, "embedding": [0.25, -0.5, float(i)]}
                        for i in range(len(inputs))
                    ],
                    "usage": {"prompt_tokens": 3, "total_tokens": 3},
                }
            )
        if path == "/v1/completions":
            if data.get("stream"):
                return await self._sse(request, data, n)
            return self._json(
                {
                    "id": f"cmpl-{n}",
                    "object": "text_completion",
                    "created": 1,
                    "model": data["model"],
                    "choices": [
                        {
                            "index": 0,
                            "text": "echo: " + str(data["prompt"]),
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                }
            )
        if path == "/v1/moderations":
            return self._json(
                {
                    "id": f"modr-{n}",
                    "model": "omni-moderation-latest",
                    "results": [{"flagged": False, "categories": {}, "category_scores": {}}],
                }
            )
        if path == "/v1/files" and request.method == "POST":
            return self._json(
                {
                    "id": f"file-{n}",
                    "object": "file",
                    "bytes": len(raw),
                    "created_at": 1,
                    "filename": "batch.jsonl",
                    "purpose": "batch",
                    "status": "processed",
                }
            )
        if path.endswith("/content") and path.startswith("/v1/files/"):
            return await self._binary(request, FILE_CONTENT, "application/octet-stream")
        if path == "/v1/audio/speech":
            return await self._binary(request, AUDIO, "audio/mpeg")
        if path == "/v1/audio/transcriptions":
            return self._json({"text": f"heard {len(raw)} bytes"})
        if path == "/v1/images/generations":
            return self._json(
                {"created": 1, "data": [{"b64_json": "aGVsbG8=", "revised_prompt": data["prompt"]}]}
            )
        if path.startswith("/v1/batches"):
            status = "cancelling" if path.endswith("/cancel") else "validating"
            return self._json(
                {
                    "id": "batch_1",
                    "object": "batch",
                    "endpoint": "/v1/chat/completions",
                    "input_file_id": "file-1",
                    "completion_window": "24h",
                    "status": status,
                    "created_at": 1,
                }
            )
        if path == "/v1/uploads":
            return self._json(
                {
                    "id": "upload_1",
                    "object": "upload",
                    "bytes": data["bytes"],
                    "created_at": 1,
                    "filename": data["filename"],
                    "purpose": data["purpose"],
                    "status": "pending",
                    "expires_at": 2,
                }
            )
        if path.startswith("/v1/uploads/") and path.endswith("/parts"):
            return self._json(
                {
                    "id": f"part_{n}",
                    "object": "upload.part",
                    "created_at": 1,
                    "upload_id": "upload_1",
                }
            )
        if path.startswith("/v1/uploads/") and path.endswith("/complete"):
            return self._json(
                {
                    "id": "upload_1",
                    "object": "upload",
                    "bytes": 10,
                    "created_at": 1,
                    "filename": "f",
                    "purpose": "batch",
                    "status": "completed",
                    "expires_at": 2,
                    "file": {
                        "id": "file-9",
                        "object": "file",
                        "bytes": 10,
                        "created_at": 1,
                        "filename": "f",
                        "purpose": "batch",
                    },
                }
            )
        if path == "/v1/rate-limited":
            return self._json(
                {
                    "error": {
                        "message": "slow down",
                        "type": "rate_limit_error",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                },
                429,
                {"retry-after": "7", "x-ratelimit-remaining-requests": "0"},
            )
        return self._json(
            {
                "error": {
                    "message": f"unknown path {path}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
            404,
        )

    def _json(
        self, payload: Any, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response:
        body = orjson.dumps(payload)
        self.sent.append(body)
        return web.Response(
            body=body,
            status=status,
            content_type="application/json",
            headers={"x-request-id": f"req_{len(self.sent)}", **(headers or {})},
        )

    async def _sse(self, request: web.Request, data: dict[str, Any], n: int) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "x-request-id": f"req_sse_{n}"}
        )
        await response.prepare(request)
        sent = []
        for i, word in enumerate(["one", " two", " three"]):
            chunk = {
                "id": f"cmpl-{n}",
                "object": "text_completion",
                "created": 1,
                "model": data["model"],
                "choices": [{"index": 0, "text": word, "finish_reason": None, "logprobs": None}],
            }
            event = b"data: " + orjson.dumps(chunk) + b"\n\n"
            sent.append(event)
            await response.write(event)
            if i == 0 and self.hold is not None:
                await self.hold.wait()
        sent.append(b"data: [DONE]\n\n")
        await response.write(sent[-1])
        await response.write_eof()
        self.sent.append(b"".join(sent))
        return response

    async def _binary(self, request: web.Request, content: bytes, media: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": media})
        response.content_length = len(content)
        await response.prepare(request)
        half = len(content) // 2
        await response.write(content[:half])
        if self.hold is not None:
            await self.hold.wait()
        await response.write(content[half:])
        await response.write_eof()
        self.sent.append(content)
        return response

"""Every ``/v1/...`` endpoint the proxy has no pipeline for, relayed to its route's upstream.

Embeddings, completions, moderations, files, audio, images, batches, uploads,
and whatever OpenAI adds next: the route is the first whose ``match.path``
glob (and ``match.headers``) fits; a route with a ``match.model`` glob is
considered only for JSON bodies, whose ``model`` is then read. No policy
runs and nothing is stored: this is a reverse proxy hop, no more.

- Request bodies: JSON is read whole (within ``server.max_body_bytes``) and
  forwarded as its bytes, compressed ones with their Content-Encoding (decoded
  only to read a ``model`` to route by, or for litellm, which parses them);
  any other body (multipart uploads, audio, binary parts) is streamed
  upstream as it arrives, with its Content-Length, never buffered, so the
  body limit does not apply to it (the upstream's own limits do, e.g.
  OpenAI's 512 MB files).
- Answers: status, headers (Content-Length and Content-Encoding included:
  the bytes are the upstream's) and body relayed as they arrive, so SSE
  streams (``/v1/completions`` with ``stream: true``) and binary audio flow
  through chunk by chunk. An upstream failing midway leaves the response
  unfinished, so the client sees a truncated body rather than a complete one.
- A route to a ``litellm_model`` upstream: ``POST /v1/embeddings`` (JSON) is
  translated by litellm for that provider; any other path is refused (400
  ``unsupported_endpoint``), since litellm has no generic translation.
- Refused here, in OpenAI's error shape: no route for the path (404), an unreachable
  upstream (502, naming it) or one that does not answer in time (504).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Send

from proxy.config.model import RouteConfig
from proxy.errors import InvalidRequest, NotFound, ProxyError, UpstreamError
from proxy.http.body import content_encoding, error_response, forward_headers, read_body
from proxy.http.content_encoding import decode
from proxy.runtime import Runtime
from proxy.telemetry.logging import get_logger
from proxy.upstream.base import UpstreamRequest, UpstreamResponse

log = get_logger()

# What a litellm_model upstream can answer here (litellm translates the body).
TRANSLATED = frozenset({("POST", "/v1/embeddings")})


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class RelayStream(StreamingResponse):
    """A streamed answer that can be left unfinished: a truncated body must look truncated."""

    truncated = False

    async def stream_response(self, send: Send) -> None:
        chunks = self.body_iterator
        try:
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not self.truncated:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            # A client gone midway: close the upstream answer now, not when collected.
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()


class _ClientBody:
    """The client's body as it arrives, for aiohttp to stream upstream."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.size = 0
        self.disconnected = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                raise InvalidRequest("The client disconnected before sending the whole body.")
            if message["type"] != "http.request":
                continue
            chunk = message.get("body", b"")
            if chunk:
                self.size += len(chunk)
                yield chunk
            if not message.get("more_body", False):
                return


class Relay:
    """One relayed request: route, forward, relay back, one log line."""

    def __init__(self, rt: Runtime, request: Request) -> None:
        self.rt = rt
        self.request = request
        self.started = time.perf_counter()
        self.route: RouteConfig | None = None
        self.upstream_ms: float | None = None
        self.bytes_in = 0
        self._released = False
        self._out: RelayStream | None = None

    async def run(self) -> Response:
        try:
            return await self._run()
        except ProxyError as error:
            self._done(error.status, error=error)
            return error_response(error)

    async def _run(self) -> Response:
        rt, request = self.rt, self.request
        path = request.url.path
        headers = request.headers
        body: bytes | None = None
        streamed: _ClientBody | None = None
        model: str | None = None
        limit = rt.config.server.max_body_bytes
        coding = content_encoding(request.scope)
        if _has_body(headers):
            if is_json(headers.get("content-type", "")):
                # Relayed as it came, compressed or not; decoded only to read the model.
                body = await read_body(request, limit, decode=False)
                self.bytes_in = len(body)
                if rt.router.needs_model(path):
                    plain = body if coding is None else await _decoded(body, coding, limit)
                    model = _model_of(plain)
            else:
                streamed = _ClientBody(request.receive)
        self.route = route = self._match(path, model)
        config = rt.config.upstreams[route.upstream]
        if config.base_url is None and (
            (request.method, path) not in TRANSLATED or streamed is not None
        ):
            raise InvalidRequest(
                f"{request.method} {path} cannot go to upstream {route.upstream!r}: it is a "
                f"litellm_model upstream ({config.litellm_model}), and litellm translates "
                "/v1/chat/completions, /v1/responses and JSON /v1/embeddings only. Route this "
                "path to an OpenAI-compatible upstream (one with a base_url).",
                code="unsupported_endpoint",
            )
        encoded = True
        if config.base_url is None and body is not None and coding is not None:
            # litellm parses the body itself: it gets the decoded bytes.
            body, encoded = await _decoded(body, coding, limit), False
        sent = forward_headers(headers.items(), config, rt.config.session.header, encoded=encoded)
        length = headers.get("content-length")
        if streamed is not None and length is not None:
            sent["content-length"] = length  # streamed, but with its length: no chunked upload
        started = time.perf_counter()
        try:
            response = await rt.upstreams[route.upstream].send(
                UpstreamRequest(
                    method=request.method,
                    path=path.removeprefix("/v1"),
                    headers=sent,
                    body=body,
                    body_stream=streamed,
                    stream=True,
                    query=request.url.query,
                )
            )
        except ProxyError:
            if streamed is not None and streamed.disconnected:
                raise InvalidRequest(
                    "The client disconnected before sending the whole body."
                ) from None
            raise
        finally:
            if streamed is not None:
                self.bytes_in = streamed.size
        self.upstream_ms = (time.perf_counter() - started) * 1000
        return self._relay(response)

    def _match(self, path: str, model: str | None) -> RouteConfig:
        try:
            return self.rt.router.match(path, model, self.request.headers)
        except NotFound:
            raise NotFound(
                f"No route is configured for {self.request.method} {path}. Add one to the "
                'config, e.g. {match: {path: "/v1/*"}, upstream: NAME, policy: passthrough}, '
                "to relay every other endpoint to an upstream.",
                code="route_not_found",
            ) from None

    def _relay(self, response: UpstreamResponse) -> Response:
        entity = getattr(response, "entity_headers", [])
        out = RelayStream(self._chunks(response), status_code=response.status)
        out.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in [*response.headers, *entity]
        ]
        self._out = out
        return out

    async def _chunks(self, response: UpstreamResponse) -> AsyncIterator[bytes]:
        sent = 0
        error: ProxyError | None = None
        try:
            async for chunk in response.iter_chunks():
                sent += len(chunk)
                yield chunk
        except UpstreamError as exc:
            error = exc
            if self._out is not None:
                self._out.truncated = True
        finally:
            await response.close()
            self._done(
                response.status, bytes_out=sent, error=error, upstream_status=response.status
            )

    def _done(
        self,
        status: int,
        *,
        bytes_out: int | None = None,
        error: ProxyError | None = None,
        upstream_status: int | None = None,
    ) -> None:
        """Log and count the request once, and release the pinned runtime."""
        if self._released:
            return
        self._released = True
        self.rt.release()
        total_ms = (time.perf_counter() - self.started) * 1000
        route = self.route.name if self.route is not None else ""
        fields: dict[str, Any] = {
            "method": self.request.method,
            "path": self.request.url.path,
            "route": route or None,
            "upstream": self.route.upstream if self.route is not None else None,
            "status": status,
            "upstream_status": upstream_status,
            "bytes_in": self.bytes_in,
            "bytes_out": bytes_out,
            "passthrough": True,
            "incomplete": error is not None and upstream_status is not None,
            "error": error.message if error is not None else None,
            "upstream_ms": round(self.upstream_ms, 2) if self.upstream_ms is not None else None,
            "total_ms": round(total_ms, 2),
        }
        failed = status >= 500 or (error is not None and upstream_status is not None)
        (log.warning if failed else log.info)("request_completed", **fields)
        self.rt.metrics.observe_request(
            route=route,
            policy="",
            status=status,
            total_ms=total_ms,
            upstream_ms=self.upstream_ms,
            tokens_before=0,
            tokens_after=0,
        )


def _has_body(headers: Any) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "chunked" in headers.get("transfer-encoding", "").lower()


async def _decoded(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` decoded in a worker thread (as read_body does: up to the limit's worth)."""
    return await asyncio.to_thread(decode, body, coding, limit)


def _model_of(body: bytes) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # the upstream says what is wrong with it
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


async def relay(request: Request) -> Response:
    """Any method on ``/v1/{path}`` without a pipeline of its own."""
    rt: Runtime = request.app.state.runtime
    # Pinned until the last byte: a reload must not close the upstream mid-answer.
    return await Relay(rt.pin(), request).run()

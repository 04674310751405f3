"""HTTP plumbing shared by the endpoints: bounded body reads, JSON, headers, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.config.model import UpstreamConfig
from proxy.errors import Door, InvalidRequest, PayloadTooLarge, ProxyError, RequestTimeout
from proxy.http.content_encoding import codings
from proxy.http.content_encoding import decode as decoded
from proxy.http.shape import MAX_DEPTH, check_depth

# Client headers never forwarded: they describe this hop, or belong to us.
_NOT_FORWARDED = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "accept-encoding",
        "expect",
    }
)


# A decoded body's headers: its coding is undone (the length is never forwarded).
_NOT_FORWARDED_DECODED = _NOT_FORWARDED | {"content-encoding"}


async def read_body(
    request: Request, limit: int, idle_timeout_s: float = 30.0, *, decode: bool = True
) -> bytes:
    """The whole body, at most ``limit`` bytes, each chunk within ``idle_timeout_s``.

    ``decode``: a body sent with a Content-Encoding is returned decoded, its
    decoded size within ``limit`` too (proxy/http/content_encoding.py); False:
    the bytes as they came (pass-through endpoints relay them so).
    """
    raw = await _read_raw(request, limit, idle_timeout_s)
    if decode and raw:
        coding = content_encoding(request.scope)
        if coding is not None and codings(coding):
            # In a worker thread: up to the limit's worth of output (a bomb's 32 MiB takes
            # ~150 ms), which other requests must not wait for.
            return await asyncio.to_thread(decoded, raw, coding, limit)
    return raw


def content_encoding(scope: Mapping[str, Any]) -> str | None:
    """The request's Content-Encoding (repeated headers joined, as HTTP lists are); None:
    none. Read off the raw ASGI headers: no Headers object built for a rare header."""
    found = [v for k, v in scope["headers"] if k == b"content-encoding"]
    if not found:
        return None
    return b",".join(found).decode("latin-1")


async def _read_raw(request: Request, limit: int, idle_timeout_s: float) -> bytes:
    """The body's bytes as they came, at most ``limit``.

    Too large: the rest is read and dropped first (up to DRAIN_FACTOR times
    the limit, within the same idle deadline), then the 413 is raised. A
    client still writing its body would otherwise see the connection close
    before it reads the answer (nginx's lingering close does the same).
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if request.headers.get("expect", "").lower() != "100-continue":
            await _drain(request, limit * DRAIN_FACTOR, idle_timeout_s)
        raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit}.")
    # ASGI messages read directly: Request.stream()'s async generator costs more
    # than the usual one-message body it carries.
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        if _ready(receive):
            message = await receive()
        else:
            try:
                async with asyncio.timeout(idle_timeout_s):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    f"The request body did not arrive in time (no data for {idle_timeout_s:g} s)."
                ) from None
        if message["type"] == "http.disconnect":
            raise InvalidRequest("The client disconnected before sending the whole body.")
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            if message.get("more_body", False):
                await _drain(request, limit * DRAIN_FACTOR, idle_timeout_s)
            raise PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes.")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _ready(receive: Any) -> bool:
    """Whether ``receive`` answers at once, so no deadline needs arming (a timer per read
    was a twentieth of a request's CPU): uvicorn's does when its cycle's message event is
    set (the body, or its next part, has arrived). Any other server: False."""
    event = getattr(getattr(receive, "__self__", None), "message_event", None)
    return isinstance(event, asyncio.Event) and event.is_set()


# How much of an oversize body is read (and dropped) so its sender gets the 413.
DRAIN_FACTOR = 4


async def _drain(request: Request, budget: int, idle_timeout_s: float) -> None:
    """Read and drop the rest of the body, within ``budget`` bytes and the idle deadline."""
    receive = request.receive
    try:
        async with asyncio.timeout(idle_timeout_s) as deadline:
            while budget > 0:
                message = await receive()
                if message["type"] != "http.request":
                    return
                budget -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
                deadline.reschedule(asyncio.get_running_loop().time() + idle_timeout_s)
    except TimeoutError:
        return


def parse_object(raw: bytes, *, deferred: str | None = None) -> dict[str, Any]:
    """The body's JSON object, its depth checked (``deferred``: see ``check_depth``)."""
    if not raw:
        raise InvalidRequest("The request body is empty; a JSON object is required.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    if deferred is not None and isinstance(data.get(deferred), list):
        # The rest of the body is walked whole (cheap: the big list is not in it).
        check_depth(data, MAX_DEPTH + 1, deferred=deferred)
    else:
        check_depth(data, raw.count(b"[") + raw.count(b"{"))
    return data


def forward_headers(
    headers: Iterable[tuple[str, str]],
    upstream: UpstreamConfig,
    session_header: str,
    *,
    encoded: bool = False,
) -> dict[str, str]:
    """The client's headers as sent upstream. ``encoded``: the body goes as it came, so its
    Content-Encoding does too; otherwise the body is the decoded one (read_body) and none."""
    base = _NOT_FORWARDED if encoded else _NOT_FORWARDED_DECODED
    skip = base | {session_header.lower(), "x-context-mode"}
    out = {k: v for k, v in headers if k not in skip}
    if upstream.api_key is not None and upstream.anthropic:
        # Anthropic's API takes its key as x-api-key, in place of the client's.
        out.pop("authorization", None)
        out["x-api-key"] = upstream.api_key
    elif upstream.api_key is not None:
        out["authorization"] = f"Bearer {upstream.api_key}"
    out.update({k.lower(): v for k, v in upstream.headers.items()})
    return out


def error_response(
    error: ProxyError, headers: Mapping[str, str] | None = None, door: Door = "openai"
) -> Response:
    """``error`` answered in ``door``'s JSON shape (proxy/errors.py)."""
    return Response(
        error.door_bytes(door),
        status_code=error.status,
        media_type="application/json",
        headers={**(headers or {}), **error.headers},
    )


def relay_headers(
    upstream_headers: Iterable[tuple[str, str]], ours: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    """Raw ASGI headers: the upstream's (repeated ones kept), then ours."""
    if not isinstance(upstream_headers, (list, tuple)):
        upstream_headers = list(upstream_headers)
    try:
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in upstream_headers]
        raw.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in ours.items())
    except UnicodeEncodeError:
        # A value outside Latin-1 (an upstream's UTF-8 header, decoded): sent as UTF-8
        # bytes rather than failing an answer the upstream already gave.
        pairs = [*upstream_headers, *ours.items()]
        raw = [(k.lower().encode("utf-8"), v.encode("utf-8", "replace")) for k, v in pairs]
    return raw

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


async def read_body(request: Request, limit: int, idle_timeout_s: float = 30.0) -> bytes:
    """The whole body, at most ``limit`` bytes, each chunk within ``idle_timeout_s``.

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
    headers: Iterable[tuple[str, str]], upstream: UpstreamConfig, session_header: str
) -> dict[str, str]:
    skip = _NOT_FORWARDED | {session_header.lower(), "x-context-mode"}
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
        headers=dict(headers or {}),
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

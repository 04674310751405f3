"""HTTP plumbing shared by the endpoints: bounded body reads, JSON, headers, errors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.config.model import UpstreamConfig
from proxy.errors import InvalidRequest, PayloadTooLarge, ProxyError
from proxy.http.shape import check_depth

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


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is {declared} bytes; the limit is {limit}.")
    # ASGI messages read directly: Request.stream()'s async generator costs more
    # than the usual one-message body it carries.
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("The client disconnected before sending the whole body.")
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes.")
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidRequest("The request body is empty; a JSON object is required.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    check_depth(data, raw.count(b"[") + raw.count(b"{"))
    return data


def forward_headers(
    headers: Iterable[tuple[str, str]], upstream: UpstreamConfig, session_header: str
) -> dict[str, str]:
    skip = _NOT_FORWARDED | {session_header.lower(), "x-context-mode"}
    out = {k: v for k, v in headers if k not in skip}
    if upstream.api_key is not None:
        out["authorization"] = f"Bearer {upstream.api_key}"
    out.update({k.lower(): v for k, v in upstream.headers.items()})
    return out


def error_response(error: ProxyError, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        error.body_bytes(),
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

"""The admin API: list, show, delete and export sessions; calibration; one request row.

Enabled only when ``admin.api_key`` is configured; every ``/admin/...`` call
needs ``Authorization: Bearer <that key>`` and is answered 401 otherwise
(also when the admin API is disabled, so its existence is not a secret).

The views themselves (``session_list``, ``session_detail``,
``export_lines``) are in :mod:`proxy.admin_views`, shared with ``python -m
proxy sessions``; this module is their HTTP side.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.errors import InvalidRequest, NotFound, Unauthorized
from proxy.http.body import error_response
from proxy.ops.admin_views import (
    DEFAULT_PAGE,
    export_lines,
    ndjson,
    request_context,
    request_detail,
    session_detail,
    session_list,
)
from proxy.ops.cache_views import metrics_cache
from proxy.ops.viewer import ROUTES as VIEWER_ROUTES
from proxy.runtime import Runtime
from proxy.store.base import SessionRef

MAX_PAGE = 500

Handler = Callable[[Request, Runtime], Awaitable[Response]]


def _json(content: Any) -> Response:
    # Conversation text: never kept by a browser's or a proxy's cache.
    return Response(
        orjson.dumps(content), media_type="application/json", headers={"cache-control": "no-store"}
    )


def _authorize(request: Request, rt: Runtime) -> None:
    expected = rt.config.admin.api_key
    if expected is None:
        raise Unauthorized(
            "The admin API is disabled: set admin.api_key (an os.environ/NAME reference).",
            code="admin_disabled",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # Constant time: the comparison must not tell how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), expected.encode()
    ):
        raise Unauthorized("Invalid or missing admin API key.", code="invalid_api_key")


def _admin(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        rt: Runtime = request.app.state.runtime
        try:
            _authorize(request, rt)
        except Unauthorized as error:
            return error_response(error, {"www-authenticate": 'Bearer realm="ctxproxy-admin"'})
        return await handler(request, rt)

    return endpoint


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise InvalidRequest(
            f"'{name}' must be an integer from {low} to {high}; got {raw!r}.", param=name
        )
    return value


def _ref(request: Request) -> SessionRef:
    return SessionRef(request.path_params["tenant"], request.path_params["key"])


def _no_session(ref: SessionRef) -> NotFound:
    return NotFound(f"No session {ref.key!r} for tenant {ref.tenant!r}.", code="session_not_found")


async def _list(request: Request, rt: Runtime) -> Response:
    page = await session_list(
        rt.store,
        tenant=request.query_params.get("tenant") or None,
        limit=_int_param(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE),
        offset=_int_param(request, "offset", 0, 0, 2**62),
        session=request.query_params.get("session") or None,
    )
    return _json(page)


async def _session(request: Request, rt: Runtime) -> Response:
    ref = _ref(request)
    if request.method == "DELETE":
        if not await rt.store.delete_session(ref):
            raise _no_session(ref)
        return _json(
            {"object": "session.deleted", "tenant": ref.tenant, "key": ref.key, "deleted": True}
        )
    detail = await session_detail(rt.store, ref, rt.calibration)
    if detail is None:
        raise _no_session(ref)
    return _json(detail)


async def _export(request: Request, rt: Runtime) -> Response:
    ref = _ref(request)
    lines = await export_lines(rt.store, ref)
    if lines is None:
        raise _no_session(ref)
    return Response(ndjson(lines), media_type="application/x-ndjson")


async def _row(request: Request, rt: Runtime) -> dict[str, Any]:
    row = await rt.store.request(request.path_params["request_id"])
    if row is None:
        raise NotFound("No such request.", code="request_not_found")
    return row


async def _request(request: Request, rt: Runtime) -> Response:
    return _json(await request_detail(rt.store, await _row(request, rt)))


async def _context(request: Request, rt: Runtime) -> Response:
    return _json(await request_context(rt.store, await _row(request, rt)))


async def _calibration(request: Request, rt: Runtime) -> Response:
    return _json({"object": "list", "data": rt.calibration.snapshot()})


async def _cache(request: Request, rt: Runtime) -> Response:
    return _json(metrics_cache(rt.metrics))


async def _unknown(request: Request, rt: Runtime) -> Response:
    raise NotFound(f"Unknown admin path or method: {request.method} {request.url.path}")


ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

ROUTES = [
    Route("/admin/sessions", _admin(_list), methods=["GET"]),
    # Before the show route: its {key:path} would swallow "/export".
    Route("/admin/sessions/{tenant}/{key:path}/export", _admin(_export), methods=["GET"]),
    Route("/admin/sessions/{tenant}/{key:path}", _admin(_session), methods=["GET", "DELETE"]),
    Route("/admin/requests/{request_id}", _admin(_request), methods=["GET"]),
    Route("/admin/requests/{request_id}/context", _admin(_context), methods=["GET"]),
    Route("/admin/calibration", _admin(_calibration), methods=["GET"]),
    Route("/admin/cache", _admin(_cache), methods=["GET"]),
    # The viewer's static files (no key: the page asks for it and calls the API above).
    *VIEWER_ROUTES,
    # Anything else under /admin (wrong method included) still needs the key first.
    Route("/admin", _admin(_unknown), methods=ANY_METHOD),
    Route("/admin/{rest:path}", _admin(_unknown), methods=ANY_METHOD),
]

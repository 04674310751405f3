"""The admin API: list, show, delete and export sessions; calibration; one request row.

Enabled only when ``admin.api_key`` is configured; every ``/admin/...`` call
needs ``Authorization: Bearer <that key>`` and is answered 401 otherwise
(also when the admin API is disabled, so its existence is not a secret).

The views (``session_list``, ``session_detail``, ``export_lines``) take a
Store, not a request, so ``python -m proxy sessions`` shows exactly what the
API shows.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.calibration import Calibration
from proxy.errors import InvalidRequest, NotFound, Unauthorized
from proxy.http import error_response
from proxy.runtime import Runtime
from proxy.store.base import SessionInfo, SessionRef, Store, StoredItem

MAX_PAGE = 500
DEFAULT_PAGE = 50

Handler = Callable[[Request, Runtime], Awaitable[Response]]


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")


def _turns(history: list[StoredItem]) -> int:
    return sum(1 for item in history if item.role == "user")


def session_view(info: SessionInfo, history: list[StoredItem]) -> dict[str, Any]:
    return {
        "tenant": info.tenant,
        "key": info.key,
        "created_at": iso(info.created_at),
        "last_activity": iso(info.updated_at),
        # User messages on the current branch: what a person would call turns.
        "turns": _turns(history),
        "messages": len(history),
        # Every stored item, other branches (edits, forks) included.
        "items": info.item_count,
        "request_count": info.request_count,
        "stored_tokens": info.stored_tokens,
    }


async def session_list(
    store: Store, *, tenant: str | None = None, limit: int = DEFAULT_PAGE, offset: int = 0
) -> dict[str, Any]:
    """One page of sessions, most recent activity first."""
    infos = await store.list_sessions(tenant=tenant, limit=limit + 1, offset=offset)
    page = infos[:limit]
    data = []
    for info in page:
        # Turns are counted on the current branch: one chain read per listed session,
        # bounded by the page size (an admin call, not the request path).
        history = await store.history(SessionRef(info.tenant, info.key))
        data.append(session_view(info, history))
    return {
        "object": "list",
        "data": data,
        "limit": limit,
        "offset": offset,
        "has_more": len(infos) > limit,
    }


def request_view(row: dict[str, Any]) -> dict[str, Any]:
    """A stored request row, grouped the way an audit reads it."""
    detail: dict[str, Any] = row.get("detail") or {}
    return {
        "id": row["id"],
        "created_at": iso(row["created_at"]),
        "endpoint": row["endpoint"],
        "route": row["route"],
        "policy": row["policy"],
        "mode": row.get("mode"),
        "model": row["model"],
        "stream": row["stream"],
        "status": row["status"],
        "upstream_status": row["upstream_status"],
        "incomplete": row["incomplete"],
        "error": row["error"],
        "messages": {"before": row["messages_before"], "after": row["messages_after"]},
        "tokens": {
            "before": row["tokens_before"],
            "after": row["tokens_after"],
            "saved": row["tokens_before"] - row["tokens_after"],
            "budget": detail.get("budget"),
            "calibration": detail.get("calibration", 1.0),
        },
        "dropped": {
            "reason": row["reason"],
            "turns": row["turns_dropped"],
            "messages": row["messages_dropped"],
            "item_ids": row["dropped_item_ids"],
            "indexes": row["dropped_indexes"],
            "repaired": detail.get("repaired", []),
        },
        "clipped": detail.get("clipped", []),
        # Filled in once summarization lands (the decision's detail carries it).
        "summarized": detail.get("summary"),
        "fallback": detail.get("fallback"),
        "latency_ms": {"total": row["total_ms"], "upstream": row["upstream_ms"]},
        "usage": row["usage"],
        "items": {
            "first": row.get("first_item_id"),
            "last": row.get("last_item_id"),
            "reply": row.get("reply_item_id"),
        },
    }


def item_view(
    item: StoredItem, first_dropped_by: dict[int, str], dropped_last: set[int]
) -> dict[str, Any]:
    return {
        "id": item.id,
        "parent_id": item.parent_id,
        "role": item.role,
        "token_count": item.token_count,
        "status": item.status,
        "created_at": iso(item.created_at),
        "content_hash": item.content_hash,
        # "Why did the model forget X?": the first request that left X out, and
        # whether the newest request left it out too.
        "first_dropped_by": first_dropped_by.get(item.id),
        "dropped_in_last_request": item.id in dropped_last,
        "message": item.message,
    }


async def session_detail(
    store: Store, ref: SessionRef, calibration: Calibration | None = None
) -> dict[str, Any] | None:
    """Everything stored for a session; None when there is no such session."""
    info = await store.get_session(ref)
    if info is None:
        return None
    history = await store.history(ref)
    rows = await store.requests(ref)
    first_dropped_by: dict[int, str] = {}
    for row in rows:
        for item_id in row["dropped_item_ids"]:
            first_dropped_by.setdefault(item_id, row["id"])
    stored = [r for r in rows if r["last_item_id"] is not None]
    dropped_last = set(stored[-1]["dropped_item_ids"]) if stored else set()
    models = {r["model"] for r in rows if r["model"]}
    return {
        "object": "session",
        **session_view(info, history),
        "history": [item_view(i, first_dropped_by, dropped_last) for i in history],
        # Summaries are views over the stored chain; none are made yet.
        "summaries": [],
        "requests": [request_view(r) for r in rows],
        "calibration": []
        if calibration is None
        else [c for c in calibration.snapshot() if c["model"] in models],
    }


async def export_lines(store: Store, ref: SessionRef) -> list[dict[str, Any]] | None:
    """The session as JSON Lines records: the session, its items, summaries, requests."""
    info = await store.get_session(ref)
    if info is None:
        return None
    history = await store.history(ref)
    lines: list[dict[str, Any]] = [{"type": "session", **session_view(info, history)}]
    for item in history:
        lines.append(
            {
                "type": "item",
                "id": item.id,
                "parent_id": item.parent_id,
                "role": item.role,
                "token_count": item.token_count,
                "status": item.status,
                "created_at": item.created_at,
                "content_hash": item.content_hash,
                "message": item.message,
            }
        )
    # Summary records ("type": "summary") go here once summarization stores them.
    lines.extend({"type": "request", **row} for row in await store.requests(ref))
    return lines


def _json(content: Any) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")


def ndjson(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


# -- HTTP ---------------------------------------------------------------------


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


async def _request(request: Request, rt: Runtime) -> Response:
    row = await rt.store.request(request.path_params["request_id"])
    if row is None:
        raise NotFound("No such request.", code="request_not_found")
    return _json(request_view(row))


async def _calibration(request: Request, rt: Runtime) -> Response:
    return _json({"object": "list", "data": rt.calibration.snapshot()})


async def _unknown(request: Request, rt: Runtime) -> Response:
    raise NotFound(f"Unknown admin path or method: {request.method} {request.url.path}")


ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

ROUTES = [
    Route("/admin/sessions", _admin(_list), methods=["GET"]),
    # Before the show route: its {key:path} would swallow "/export".
    Route("/admin/sessions/{tenant}/{key:path}/export", _admin(_export), methods=["GET"]),
    Route("/admin/sessions/{tenant}/{key:path}", _admin(_session), methods=["GET", "DELETE"]),
    Route("/admin/requests/{request_id}", _admin(_request), methods=["GET"]),
    Route("/admin/calibration", _admin(_calibration), methods=["GET"]),
    # Anything else under /admin (wrong method included) still needs the key first.
    Route("/admin", _admin(_unknown), methods=ANY_METHOD),
    Route("/admin/{rest:path}", _admin(_unknown), methods=ANY_METHOD),
]

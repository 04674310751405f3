"""GET/DELETE /v1/responses/{id} and GET .../input_items: from the store, else the upstream.

A response the proxy stored is answered from the store, scoped by tenant like
sessions: another tenant's key gets a 404, never a pass-through (with a
configured upstream key the upstream would hand the response to anyone).
Any other id is passed through to the upstream of the first route for
``/v1/responses``; a bridged upstream stores nothing, so there it is a 404.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from policies.items import kind_of
from proxy.errors import InvalidRequest, NotFound
from proxy.http.body import forward_headers, relay_headers
from proxy.http.client_keys import request_tenant
from proxy.runtime import Runtime
from proxy.store.base import StoredItem, StoredResponse
from proxy.upstream.base import UpstreamRequest

MAX_LIMIT = 100
# Item kinds whose listed form carries a status (the API's *Resource schemas require one).
_WITH_STATUS = frozenset(
    {"message", "function_call", "function_call_output", "custom_tool_call_output"}
)

Handler = Callable[[Request, Runtime, str, StoredResponse | None], Coroutine[Any, Any, Response]]


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _endpoint(handler: Handler) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def endpoint(request: Request) -> Response:
        runtime: Runtime = request.app.state.runtime
        # Pinned: a reload must not close the upstream while a pass-through uses it.
        rt = runtime.pin()
        try:
            response_id = request.path_params["response_id"]
            tenant = request_tenant(
                request.scope, request.headers, rt.config.session.anonymous_tenant
            )
            stored = None if tenant is None else await rt.store.get_response(tenant, response_id)
            if stored is None and await rt.store.response_exists(response_id):
                raise _not_found(response_id)
            return await handler(request, rt, response_id, stored)
        finally:
            rt.release()

    return endpoint


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


async def _retrieve(
    request: Request, rt: Runtime, response_id: str, stored: StoredResponse | None
) -> Response:
    if stored is None:
        return await _pass_through(request, rt, response_id)
    return _json(stored.response)


async def _delete(
    request: Request, rt: Runtime, response_id: str, stored: StoredResponse | None
) -> Response:
    if stored is None:
        return await _pass_through(request, rt, response_id)
    # The id and what only it holds; what later responses chain through stays.
    await rt.store.delete_response(stored.tenant, response_id)
    return _json({"id": response_id, "object": "response", "deleted": True})


async def _input_items(
    request: Request, rt: Runtime, response_id: str, stored: StoredResponse | None
) -> Response:
    if stored is None:
        return await _pass_through(request, rt, response_id)
    limit, order, after = _page_params(request)
    items = [listed(i) for i in await rt.store.response_input_items(stored.tenant, response_id)]
    if order == "desc":
        items.reverse()
    if after is not None:
        position = next((n for n, i in enumerate(items) if i["id"] == after), None)
        if position is None:
            raise InvalidRequest(f"No input item with id '{after}'.", param="after")
        items = items[position + 1 :]
    page = items[:limit]
    return _json(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


def _page_params(request: Request) -> tuple[int, str, str | None]:
    query = request.query_params
    raw_limit = query.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be between 1 and {MAX_LIMIT}.", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be asc or desc.", param="order")
    return int(raw_limit), order, query.get("after")


def listed(stored: StoredItem) -> dict[str, Any]:
    """A stored item as the API lists it: with an id, a type, a status, content parts.

    Items the client sent without an id (input messages, usually) get one made
    from their stored row, so pagination has something to point at; nothing
    with such an id is ever sent upstream.
    """
    item = dict(stored.message)
    kind = kind_of(item)
    item["type"] = kind
    if not isinstance(item.get("id"), str):
        prefix = "msg" if kind == "message" else "item"
        item["id"] = f"{prefix}_ctxproxy_{stored.id}"
    if kind in _WITH_STATUS:
        item.setdefault("status", "incomplete" if stored.status == "incomplete" else "completed")
    if kind == "message" and isinstance(item.get("content"), str):
        text = item["content"]
        if item.get("role") == "assistant":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        else:
            part = {"type": "input_text", "text": text}
        item["content"] = [part]
    return item


async def _pass_through(request: Request, rt: Runtime, response_id: str) -> Response:
    route = rt.router.for_path("/v1/responses")
    if route is None:
        raise NotFound("No route is configured for /v1/responses.", code="route_not_found")
    config = rt.config.upstreams[route.upstream]
    if config.responses == "bridge" or config.base_url is None:
        raise _not_found(response_id)
    response = await rt.upstreams[route.upstream].send(
        UpstreamRequest(
            method=request.method,
            path=request.url.path.removeprefix("/v1"),
            headers=forward_headers(request.headers.items(), config, rt.config.session.header),
            query=request.url.query,
        )
    )
    content = await response.read()
    out = Response(content, status_code=response.status)
    out.raw_headers = relay_headers(response.headers, {"content-length": str(len(content))})
    return out


retrieve_response = _endpoint(_retrieve)
delete_response = _endpoint(_delete)
list_input_items = _endpoint(_input_items)

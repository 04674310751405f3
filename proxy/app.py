"""create_app(config) -> a Starlette app; the lifespan owns the store and the pools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.chat.pipeline import chat_completions
from proxy.config.model import Config
from proxy.context.calibration import Calibration
from proxy.context.model_info import context_window, offline_environment
from proxy.context.tokens import preload_encodings
from proxy.coordination.setup import build_coordinator
from proxy.errors import InvalidRequest, NotFound, ProxyError
from proxy.http.body import error_response, forward_headers, relay_headers
from proxy.http.guard import ErrorGuard
from proxy.ops.admin import ROUTES as ADMIN_ROUTES
from proxy.ops.expiry import Expiry
from proxy.ops.preview import context_preview
from proxy.ops.reload import Reloader
from proxy.responses.pipeline import create_response
from proxy.responses.stored import delete_response, list_input_items, retrieve_response
from proxy.runtime import Runtime, build_store_for, build_upstream
from proxy.store.backends import backend_name
from proxy.store.base import Store
from proxy.telemetry.logging import get_logger
from proxy.telemetry.metrics import metrics_endpoint
from proxy.upstream.base import Upstream, UpstreamRequest

log = get_logger()


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def models(request: Request) -> Response:
    """GET /v1/models[/{id}]: passed through to the upstream that serves that path."""
    runtime: Runtime = request.app.state.runtime
    # Pinned: a reload must not close the upstream while this call uses it.
    rt = runtime.pin()
    try:
        return await _models(request, rt)
    finally:
        rt.release()


async def _models(request: Request, rt: Runtime) -> Response:
    route = rt.router.for_path(request.url.path) or next(
        (r for r in rt.config.routes if rt.config.upstreams[r.upstream].base_url), None
    )
    if route is None:
        raise NotFound("No OpenAI-compatible upstream is configured to list models.")
    config = rt.config.upstreams[route.upstream]
    response = await rt.upstreams[route.upstream].send(
        UpstreamRequest(
            method="GET",
            path=request.url.path.removeprefix("/v1"),
            headers=forward_headers(request.headers.items(), config, rt.config.session.header),
            query=request.url.query,
        )
    )
    content = await response.read()
    out = Response(content, status_code=response.status)
    out.raw_headers = relay_headers(response.headers, {"content-length": str(len(content))})
    return out


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: ProxyError
    if exc.status_code == 404:
        error = NotFound(f"Unknown path: {request.url.path}")
    else:
        error = InvalidRequest(str(exc.detail), status=exc.status_code, code="http_error")
    return error_response(error, exc.headers)


def create_app(
    config: Config,
    *,
    store: Store | None = None,
    upstreams: dict[str, Upstream] | None = None,
) -> Starlette:
    offline_environment()
    if store is None:
        store = build_store_for(config)
    calibration = Calibration()
    runtime = Runtime(
        config=config,
        store=store,
        calibration=calibration,
        # A store that checks fencing tokens (PostgreSQL) learns each new one.
        coordinator=build_coordinator(
            config.coordination, calibration, fence=getattr(store, "advance_fence", None)
        ),
        upstreams=upstreams
        if upstreams is not None
        else {name: build_upstream(u) for name, u in config.upstreams.items()},
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        await runtime.store.open()
        await runtime.coordinator.open()
        # The bundled encodings take a second to load: in a thread now, not on a request.
        await asyncio.to_thread(preload_encodings)
        if runtime.rewriter.needs_model_info():
            # Import litellm's model map now, off the event loop, not on a request.
            await asyncio.to_thread(context_window, "gpt-4o")
        expiry = Expiry(runtime)
        expiry.start()
        reloader = Reloader(runtime, config.source)
        reloader.install()
        log.info(
            "proxy_started",
            routes=len(config.routes),
            config=config.source,
            store=backend_name(config.store.url),
            coordination=runtime.coordinator.name,
        )
        try:
            yield {}
        finally:
            reloader.uninstall()
            await expiry.stop()
            await runtime.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
            Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
            Route("/v1/context/preview", context_preview, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            *ADMIN_ROUTES,
        ],
        exception_handlers={
            ProxyError: _proxy_error,
            HTTPException: _http_error,
        },
        # Unexpected errors: answered inside Starlette's own last resort (which re-raises).
        middleware=[Middleware(ErrorGuard)],
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    return app

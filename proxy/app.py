"""create_app(config) -> a Starlette app; the lifespan owns the store and the pools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.chat.pipeline import chat_completions
from proxy.config.model import Config
from proxy.context.calibration import Calibration
from proxy.context.model_info import load_model_map, offline_environment
from proxy.context.tokens import preload_encodings
from proxy.coordination.setup import build_coordinator
from proxy.errors import InvalidRequest, NotFound, ProxyError, door_of
from proxy.heap import IdleTrim
from proxy.http.asgi import Endpoint
from proxy.http.body import error_response
from proxy.http.client_keys import ClientKeyGuard
from proxy.http.guard import ErrorGuard
from proxy.messages.compaction import messages_endpoint
from proxy.messages.count import count_tokens
from proxy.ops.admin import ROUTES as ADMIN_ROUTES
from proxy.ops.expiry import Expiry
from proxy.ops.health import Lifecycle, WarmUpGate, healthz, readyz
from proxy.ops.preview import context_preview
from proxy.ops.reload import Reloader
from proxy.passthrough.models import models
from proxy.passthrough.relay import relay
from proxy.responses.compact import compact_response
from proxy.responses.compaction import create_response
from proxy.responses.stored import delete_response, list_input_items, retrieve_response
from proxy.runtime import Runtime, build_store_for, build_upstream
from proxy.store.backends import backend_name
from proxy.store.base import Store
from proxy.telemetry.logging import get_logger
from proxy.telemetry.metrics import metrics_endpoint
from proxy.upstream.base import Upstream

if TYPE_CHECKING:
    from proxy.context.embedder import Embedder

log = get_logger()

RELAYED_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

# POST /v1/responses as a raw ASGI app too: sent with proxy.http.asgi.respond.
responses_endpoint = Endpoint(create_response)
compact_endpoint = Endpoint(compact_response)


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return error_response(exc, door=door_of(request.url.path))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: ProxyError
    if exc.status_code == 404:
        error = NotFound(f"Unknown path: {request.url.path}")
    else:
        error = InvalidRequest(str(exc.detail), status=exc.status_code, code="http_error")
    return error_response(error, exc.headers, door_of(request.url.path))


class ProxyApp(Starlette):
    """Starlette, with POSTs to the hot endpoints dispatched straight to them (issue 16).

    Such a POST goes through the app's own middleware (the error guard, the
    client keys, the warm-up gate) to the endpoint, a raw ASGI app that answers
    its errors itself; not through Starlette's error and exception middleware
    and its router (~5% of a request's CPU). The routes are unchanged: any
    other method, path or ``root_path`` goes the usual way.
    """

    def __init__(self, *, hot: Mapping[str, ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hot = dict(hot)
        self._hot_stacks: dict[str, ASGIApp] | None = None

    def _stacks(self) -> dict[str, ASGIApp]:
        stacks: dict[str, ASGIApp] = {}
        for path, endpoint in self._hot.items():
            app = endpoint
            for cls, args, kwargs in reversed(self.user_middleware):
                app = cls(app, *args, **kwargs)
            stacks[path] = app
        self._hot_stacks = stacks
        return stacks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            app = (self._hot_stacks or self._stacks()).get(scope["path"])
            if app is not None:
                scope["app"] = self
                await app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    config: Config,
    *,
    store: Store | None = None,
    upstreams: dict[str, Upstream] | None = None,
    embedder: Embedder | None = None,
) -> Starlette:
    offline_environment()
    if store is None:
        store = build_store_for(config)
    calibration = Calibration()
    runtime = Runtime(
        config=config,
        store=store,
        calibration=calibration,
        # A store that checks fencing tokens (PostgreSQL, Redis) learns each new one.
        coordinator=build_coordinator(
            config.coordination, calibration, fence=getattr(store, "advance_fence", None)
        ),
        upstreams=upstreams
        if upstreams is not None
        else {name: build_upstream(u) for name, u in config.upstreams.items()},
        embedder=embedder,
    )

    lifecycle = Lifecycle()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        await runtime.store.open()
        await runtime.coordinator.open()
        if runtime.rewriter.needs_model_info():
            # Read litellm's model map now (~30 ms, not litellm itself), off the event loop.
            await asyncio.to_thread(load_model_map)

        async def warm_up() -> None:
            # The bundled encodings take a second of CPU to load: in a thread, while
            # the socket binds, never on a request. /healthz answers meanwhile;
            # /readyz only once they are loaded.
            try:
                await asyncio.to_thread(preload_encodings)
            except Exception as exc:  # requests load them (and fail) on their own then
                log.error("warm_up_failed", error=repr(exc))
            finally:
                lifecycle.set_started()  # never leave a gated request waiting

        warming = asyncio.create_task(warm_up(), name="warm-up")
        # The embedding model (policies with embeddings: wordllama), on a worker thread.
        runtime.start_embeddings()
        expiry = Expiry(runtime)
        expiry.start()
        # The heap a burst of requests freed, handed back once the proxy is at rest.
        idle_trim = IdleTrim(
            lambda: sum(runtime.metrics.requests.values.values()),
            lambda: runtime.in_flight > 0 or runtime.background.pending > 0,
        )
        idle_trim.start()
        reloader = Reloader(runtime, config.source)
        reloader.install()
        # proxy_started (with the address) comes once the socket is bound: proxy.ops.server.
        log.debug(
            "app_started",
            routes=len(config.routes),
            config=config.source,
            store=backend_name(config.store.url),
            coordination=runtime.coordinator.name,
        )
        try:
            yield {}
        finally:
            await warming  # a thread cannot be cancelled: let it finish (a second at most)
            reloader.uninstall()
            await expiry.stop()
            await idle_trim.stop()
            await runtime.close()

    app = ProxyApp(
        hot={
            "/v1/chat/completions": chat_completions,
            "/v1/responses": responses_endpoint,
            "/v1/messages": messages_endpoint,
        },
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/messages", messages_endpoint, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/responses", responses_endpoint, methods=["POST"]),
            Route("/v1/responses/compact", compact_endpoint, methods=["POST"]),
            Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
            Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
            Route("/v1/context/preview", context_preview, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            *ADMIN_ROUTES,
            # Last: every other /v1/... endpoint (and method) is relayed unchanged.
            Route("/v1/{path:path}", relay, methods=RELAYED_METHODS),
        ],
        exception_handlers={
            ProxyError: _proxy_error,
            HTTPException: _http_error,
        },
        # Unexpected errors: answered inside Starlette's own last resort (which re-raises).
        middleware=[
            Middleware(ErrorGuard),
            Middleware(ClientKeyGuard, keys=config.server.client_keys),
            Middleware(WarmUpGate, lifecycle=lifecycle),
        ],
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.lifecycle = lifecycle
    return app

"""The outermost ASGI layer: an unexpected error becomes one 500 and the connection lives on.

Starlette's own last-resort handler answers and then re-raises, and uvicorn,
seeing an exception after the response started, closes the connection: the
client's next request on that keep-alive connection gets a reset. Here the
exception is caught, logged once with its traceback, answered in OpenAI's
shape when nothing was sent yet, and not re-raised. A response already under
way cannot be completed honestly (its client would take a cut body for a
whole one), so it is left unfinished and the server closes that connection.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import ProxyError, door_of
from proxy.telemetry.logging import get_logger

log = get_logger()


class ErrorGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the one boundary where any exception is caught
            log.error("unhandled_error", path=scope.get("path"), error=repr(exc), exc_info=exc)
            if started:
                return
            error = ProxyError("The proxy failed to handle this request.")
            body = error.door_bytes(door_of(str(scope.get("path", ""))))
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})

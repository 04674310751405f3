"""What the litellm upstreams share (chat: proxy/upstream/provider.py; Responses:
proxy/responses/bridge.py; Anthropic Messages: proxy/messages/bridge.py): the
upstream litellm is pointed at, a whole answer, a provider stream relayed as SSE
event by event, and a provider's failure as a status and a body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from proxy.errors import UpstreamError
from proxy.upstream.litellm_support import (
    Litellm,
    error_status,
    no_answer_error,
    provider_message,
    retry_after_of,
    unwrap,
)

SSE = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
JSON = [("content-type", "application/json")]


class JsonResponse:
    """A whole answer: the door's answer object or an error body."""

    def __init__(
        self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None
    ) -> None:
        self.status = status
        self.headers = list(headers if headers is not None else JSON)
        self._body = body

    async def read(self) -> bytes:
        return self._body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def close(self) -> None:
        return None


# An error body in the door's shape: (the provider's message, status, the error).
ErrorBody = Callable[[str, int, BaseException], bytes]


def litellm_target(
    litellm_model: str | None, api_base: str | None, base_url: str | None, client_model: str
) -> tuple[str, str | None]:
    """The litellm model name and API base: the configured litellm model, or an
    OpenAI-compatible server (litellm's OpenAI client at its URL)."""
    if litellm_model is not None:
        return litellm_model, api_base
    return f"openai/{client_model}", base_url


class LitellmStream:
    """A provider stream relayed as SSE: each event ``encode``-d as it arrives."""

    status = 200

    def __init__(
        self,
        lib: Litellm,
        stream: Any,
        first: Any,
        encode: Callable[[Any], bytes],
        *,
        end: bytes = b"",
        closed: Callable[[LitellmStream], None] | None = None,
    ) -> None:
        """``end``: what follows the last event (chat's ``[DONE]``); ``closed``: told once
        the provider's stream is closed (its owner stops tracking it)."""
        self.headers = list(SSE)
        self._lib = lib
        self._stream = stream
        self._first = first
        self._encode = encode
        self._end = end
        self._closed_hook = closed
        self._closed = False

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        if self._closed:
            return
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield self._encode(first)
            while True:
                try:
                    event = await anext(self._stream, None)
                except self._lib.errors as exc:
                    # Headers are sent already: the caller reports it in-stream.
                    unanswered = no_answer_error(self._lib, exc)
                    if unanswered is not None:
                        raise unanswered from exc
                    message = provider_message(unwrap(exc))
                    raise UpstreamError(f"The provider stream failed: {message}") from exc
                if event is None:
                    if self._end:
                        yield self._end
                    return
                yield self._encode(event)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._closed_hook is not None:
            self._closed_hook(self)
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


async def open_stream(
    lib: Litellm, stream: Any, encode: Callable[[Any], bytes], body: ErrorBody
) -> JsonResponse | LitellmStream:
    """The stream, once its first event came: an error the provider sends before any
    content still becomes a status and a body."""
    try:
        first = await anext(stream, None)
    except lib.errors as exc:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
        return failure_response(lib, exc, body)
    return LitellmStream(lib, stream, first, encode)


def failure_response(lib: Litellm, exc: BaseException, body: ErrorBody) -> JsonResponse:
    """Relay a provider's error status; raise when there was no answer at all."""
    unanswered = no_answer_error(lib, exc)
    if unanswered is not None:
        raise unanswered from exc
    exc = unwrap(exc)
    status = error_status(exc)
    headers = list(JSON)
    retry_after = retry_after_of(exc)
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    return JsonResponse(status, body(provider_message(exc), status, exc), headers)

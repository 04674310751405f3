"""An upstream that is not OpenAI-compatible, reached through litellm.

The route names a litellm model (``anthropic/claude-sonnet-4-5``,
``gemini/...``, ``bedrock/...``); litellm translates the OpenAI chat body to
the provider's shape and the answer (streamed or not) back to OpenAI's, so the
rest of the proxy sees the same status, headers and bytes an OpenAI-compatible
upstream would give.

litellm is heavy (seconds to import) and reaches for the network on import
unless told not to, so it is imported only when a ``LitellmUpstream`` is
built: routes to OpenAI-compatible upstreams never pay for it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import UpstreamError, UpstreamTimeout
from proxy.upstream.base import UpstreamRequest

# OpenAI chat-completion fields handed on to litellm. An allowlist, not "every
# field but model": litellm reads many kwargs as its own configuration
# (api_base, base_url, extra_headers, mock_response, fallbacks, aws_* ...), so
# passing the client's body through blindly would let a client redirect the
# request, with the configured key, wherever it likes. top_k and thinking are
# the provider extensions litellm maps itself.
# fmt: off
CHAT_FIELDS = frozenset({
    "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "modalities", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format",
    "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options",
    "temperature", "thinking", "tool_choice", "tools", "top_k", "top_logprobs", "top_p", "user",
    "verbosity", "web_search_options",
})
# fmt: on

# Keyword arguments this class sets itself; ``extra`` may not override them.
_CONTROL_KWARGS = frozenset(
    {"model", "messages", "stream", "api_base", "api_key", "timeout", "num_retries", "drop_params"}
)

_JSON = [("content-type", "application/json")]
_SSE = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
_DONE = b"data: [DONE]\n\n"

# OpenAI's error type and code for a relayed provider status.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def error_body(message: str, status: int, code: str | None = None) -> bytes:
    """An OpenAI-shaped error body for a relayed (or refused) request."""
    kind, default_code = _ERROR_KINDS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    error = {"message": message, "type": kind, "param": None, "code": code or default_code}
    return orjson.dumps({"error": error})


@dataclass(frozen=True)
class _Litellm:
    """The parts of litellm this module uses, bound once at first import."""

    acompletion: Any
    # Every litellm error this module catches.
    errors: tuple[type[BaseException], ...]
    # Anywhere in an error's cause chain, these mean no HTTP answer came (litellm
    # reports a refused connection as a 500 InternalServerError, for one).
    timed_out: tuple[type[BaseException], ...]
    unreachable: tuple[type[BaseException], ...]
    context_window: type[BaseException]
    content_policy: type[BaseException]


_loaded: _Litellm | None = None


def _load() -> _Litellm:
    global _loaded
    if _loaded is not None:
        return _loaded
    # Without this litellm downloads a model price map from the internet on import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import httpx
    import litellm
    from litellm import exceptions as ex

    litellm.suppress_debug_info = True
    # Older releases phone home unless told not to; current ones have no such flag.
    if hasattr(litellm, "telemetry"):
        litellm.telemetry = False
    # The proxy keeps its own records; litellm's per-chunk logging is pure cost.
    litellm.disable_streaming_logging = True
    # No success/failure callbacks: nothing about a request leaves the process
    # except the request itself.
    for name in ("callbacks", "input_callback", "success_callback", "failure_callback"):
        setattr(litellm, name, [])
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.WARNING)

    # fmt: off
    relayed = (  # errors that carry the provider's HTTP status
        ex.BadRequestError, ex.AuthenticationError, ex.PermissionDeniedError, ex.NotFoundError,
        ex.UnprocessableEntityError, ex.RateLimitError, ex.InternalServerError,
        ex.ServiceUnavailableError, ex.BadGatewayError, ex.APIResponseValidationError, ex.APIError,
    )
    # fmt: on
    _loaded = _Litellm(
        acompletion=litellm.acompletion,
        errors=(ex.Timeout, ex.APIConnectionError, *relayed),
        timed_out=(ex.Timeout, httpx.TimeoutException, TimeoutError),
        unreachable=(ex.APIConnectionError, httpx.TransportError, OSError),
        context_window=ex.ContextWindowExceededError,
        content_policy=ex.ContentPolicyViolationError,
    )
    return _loaded


class JsonResponse:
    """A whole answer: a chat.completion or an error body."""

    def __init__(
        self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None
    ) -> None:
        self.status = status
        self.headers = list(headers if headers is not None else _JSON)
        self._body = body

    async def read(self) -> bytes:
        return self._body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def close(self) -> None:
        return None


class StreamResponse:
    """A litellm stream re-encoded as OpenAI SSE, one event per chunk as it arrives."""

    status = 200

    def __init__(
        self, lib: _Litellm, stream: Any, first: Any, model: str, owner: LitellmUpstream
    ) -> None:
        self.headers = list(_SSE)
        self._lib = lib
        self._stream = stream
        self._first = first
        self._model = model
        self._owner = owner
        self._closed = False

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        if self._closed:
            return
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield self._event(first)
            while not self._closed:
                try:
                    chunk = await anext(self._stream, None)
                except self._lib.errors as exc:
                    # Headers are sent already, so even a provider status is
                    # raised: the caller reports it in-stream.
                    unanswered = _unanswered(self._lib, exc)
                    if unanswered is not None:
                        raise unanswered from exc
                    message = _provider_message(_unwrap(exc))
                    raise UpstreamError(f"The provider stream failed: {message}") from exc
                if chunk is None:
                    yield _DONE
                    return
                yield self._event(chunk)
        finally:
            # Whether finished, failed or abandoned by a departed client: stop the provider.
            await self.close()

    def _event(self, chunk: Any) -> bytes:
        # The client asked for its own model name; litellm reports the provider's.
        chunk.model = self._model
        data: str = chunk.model_dump_json()
        return b"data: " + data.encode() + b"\n\n"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._owner._streams.discard(self)
        await self._stream.aclose()


class LitellmUpstream:
    """``POST /chat/completions`` answered by any provider litellm knows."""

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None,
        api_key: str | None,
        timeout_s: float,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        clash = _CONTROL_KWARGS.intersection(extra or {})
        if clash:
            raise ValueError(f"extra may not set {', '.join(sorted(clash))}")
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.extra = dict(extra or {})
        # Imported here, once, so the first request does not pay for it.
        self._lib = _load()
        self._streams: set[StreamResponse] = set()

    async def send(self, request: UpstreamRequest) -> JsonResponse | StreamResponse:
        if request.method != "POST" or request.path.rstrip("/") != "/chat/completions":
            message = f"{request.method} {request.path} is not supported by a litellm upstream."
            return JsonResponse(404, error_body(message, 404, "not_found"))
        body = request.json if request.json is not None else _parse(request.body)
        if body is None or not isinstance(body.get("messages"), list):
            return JsonResponse(400, error_body("A chat body with messages is required.", 400))

        client_model = str(body.get("model") or self.model)
        kwargs = {k: v for k, v in body.items() if k in CHAT_FIELDS}
        kwargs.update(self.extra)
        api_key = self.api_key if self.api_key is not None else _bearer(request.headers)
        try:
            result = await self._lib.acompletion(
                **kwargs,
                model=self.model,
                api_base=self.api_base,
                api_key=api_key,
                timeout=self.timeout_s,
                num_retries=0,
                drop_params=True,
            )
        except self._lib.errors as exc:
            return self._failure(exc)
        if not kwargs.get("stream"):
            result.model = client_model
            return JsonResponse(200, result.model_dump_json().encode())
        return await self._open_stream(result, client_model)

    async def _open_stream(self, stream: Any, client_model: str) -> JsonResponse | StreamResponse:
        # Fetch the first chunk before answering: an error the provider sends
        # before any content must still become a status and a body.
        opened = False
        try:
            first = await anext(stream, None)
            response = StreamResponse(self._lib, stream, first, client_model, self)
            self._streams.add(response)
            opened = True
            return response
        except self._lib.errors as exc:
            return self._failure(exc)
        finally:
            if not opened:
                await stream.aclose()

    def _failure(self, exc: BaseException) -> JsonResponse:
        """Relay a provider's error status; raise when there was no answer at all."""
        lib = self._lib
        unanswered = _unanswered(lib, exc)
        if unanswered is not None:
            raise unanswered from exc
        exc = _unwrap(exc)
        status = _status(exc)
        code = None
        if isinstance(exc, lib.context_window):
            code = "context_length_exceeded"
        elif isinstance(exc, lib.content_policy):
            code = "content_policy_violation"
        headers = list(_JSON)
        retry_after = _retry_after(exc)
        if retry_after is not None:
            headers.append(("retry-after", retry_after))
        return JsonResponse(status, error_body(_provider_message(exc), status, code), headers)

    async def close(self) -> None:
        for stream in list(self._streams):
            await stream.close()


def _parse(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _bearer(headers: Mapping[str, str]) -> str | None:
    for name, value in headers.items():
        if name.lower() == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _unwrap(exc: BaseException) -> BaseException:
    # litellm's MidStreamFallbackError wraps what actually went wrong.
    for _ in range(8):
        inner = getattr(exc, "original_exception", None)
        if not isinstance(inner, BaseException) or inner is exc:
            break
        exc = inner
    return exc


def _in_chain(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, kinds):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def _unanswered(lib: _Litellm, exc: BaseException) -> UpstreamError | None:
    """The error to raise when the provider gave no HTTP answer at all, else None."""
    inner = _unwrap(exc)
    # Timeouts first: TimeoutError is an OSError too.
    if _in_chain(inner, lib.timed_out):
        return UpstreamTimeout(f"The provider did not answer in time: {inner}")
    if _in_chain(inner, lib.unreachable):
        return UpstreamError(f"Could not reach the provider: {inner}")
    return None


def _status(exc: BaseException) -> int:
    # litellm folds some provider statuses into 500 (Anthropic's 529
    # "overloaded") but keeps the original beside it.
    for name in ("provider_status_code", "status_code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 400 <= value <= 599:
            return value
    return 502


def _retry_after(exc: BaseException) -> str | None:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None or not hasattr(headers, "get"):
        return None
    value = headers.get("retry-after")
    return value if isinstance(value, str) else None


# litellm wraps the provider's words: "litellm.RateLimitError: AnthropicException -
# {provider JSON}" (the JSON sometimes as a bytes repr, b'...'), or
# "litellm.MidStreamFallbackError: litellm.InternalServerError: AnthropicError -
# Overloaded. Handle with `litellm.InternalServerError`."
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+: |\w+(?:Error|Exception) - )+")
_LITELLM_SUFFIX = re.compile(r"\.? Handle with `litellm\.\w+`\.$")


def _provider_message(exc: BaseException) -> str:
    """The provider's own error message when it can be found, else litellm's."""
    text = str(getattr(exc, "message", None) or exc)
    start = text.find("{")
    if start >= 0:
        try:
            data = orjson.loads(text[start:].rstrip("'\" "))
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            inner = data.get("error")
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                return str(inner["message"])
            if isinstance(data.get("message"), str):
                return str(data["message"])
    return _LITELLM_SUFFIX.sub("", _LITELLM_PREFIX.sub("", text)) or text

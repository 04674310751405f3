"""litellm, loaded lazily and quietly, and its exceptions mapped to what a client should see.

Shared by the chat upstream (proxy/upstream/provider.py) and the Responses
bridge (proxy/responses/bridge.py).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import UpstreamError, UpstreamTimeout


@dataclass(frozen=True)
class Litellm:
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
    # POST /v1/embeddings through the same provider (passed through by proxy/passthrough).
    aembedding: Any = None


_loaded: Litellm | None = None


def load_litellm() -> Litellm:
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
    _loaded = Litellm(
        acompletion=litellm.acompletion,
        errors=(ex.Timeout, ex.APIConnectionError, *relayed),
        timed_out=(ex.Timeout, httpx.TimeoutException, TimeoutError),
        unreachable=(ex.APIConnectionError, httpx.TransportError, OSError),
        context_window=ex.ContextWindowExceededError,
        content_policy=ex.ContentPolicyViolationError,
        aembedding=litellm.aembedding,
    )
    return _loaded


def own_body(parsed: dict[str, Any] | None, raw: bytes | None) -> dict[str, Any] | None:
    """The body litellm translates, as a copy of its own: litellm may change its input in
    place, and a caller's parsed body holds objects that later requests share (the
    message cache's messages, a session's cached chain, a kept body's fields)."""
    if parsed is None:
        return parse_object(raw)
    copy: dict[str, Any] = orjson.loads(orjson.dumps(parsed))
    return copy


def parse_object(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def bearer(headers: Mapping[str, str]) -> str | None:
    for name, value in headers.items():
        if name.lower() == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def unwrap(exc: BaseException) -> BaseException:
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


def no_answer_error(lib: Litellm, exc: BaseException) -> UpstreamError | None:
    """The error to raise when the provider gave no HTTP answer at all, else None."""
    inner = unwrap(exc)
    # Timeouts first: TimeoutError is an OSError too.
    if _in_chain(inner, lib.timed_out):
        return UpstreamTimeout(f"The provider did not answer in time: {inner}")
    if _in_chain(inner, lib.unreachable):
        return UpstreamError(f"Could not reach the provider: {inner}")
    return None


def error_status(exc: BaseException) -> int:
    # litellm folds some provider statuses into 500 (Anthropic's 529
    # "overloaded") but keeps the original beside it.
    for name in ("provider_status_code", "status_code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 400 <= value <= 599:
            return value
    return 502


def retry_after_of(exc: BaseException) -> str | None:
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


def provider_message(exc: BaseException) -> str:
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

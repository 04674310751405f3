"""One error hierarchy; every error a client sees has its door's JSON shape.

OpenAI's doors (chat completions, Responses and the rest of ``/v1``):
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``

Anthropic's (``/v1/messages``): ``{"type": "error", "error": {"type": ..., "message": ...}}``,
the type read off the status as Anthropic's API names them (:func:`anthropic_type`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import orjson


class ProxyError(Exception):
    """Base of every error the proxy answers with itself."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    # Response headers the error's status calls for (a 415's Accept-Encoding).
    headers: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def anthropic_body(self) -> dict[str, Any]:
        """The error in the Anthropic Messages API's shape."""
        return {
            "type": "error",
            "error": {"type": anthropic_type(self.status), "message": self.message},
        }

    def door_bytes(self, door: Door) -> bytes:
        """The body in ``door``'s shape."""
        return orjson.dumps(self.anthropic_body() if door == "anthropic" else self.body())


# Which dialect a front door answers errors in.
Door = Literal["openai", "anthropic"]

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def door_of(path: str) -> Door:
    """The door a request path belongs to: ``/v1/messages...`` is Anthropic's."""
    return "anthropic" if path == "/v1/messages" or path.startswith("/v1/messages/") else "openai"


def anthropic_type(status: int) -> str:
    """Anthropic's error type for ``status``: its own name, else by class (4xx / 5xx)."""
    known = _ANTHROPIC_TYPES.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


class InvalidRequest(ProxyError):
    """The client's request is malformed (400)."""

    status = 400
    type = "invalid_request_error"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class UnsupportedEncoding(InvalidRequest):
    """A request body's Content-Encoding the proxy cannot decode (415, naming those it can,
    as RFC 7694 has it)."""

    status = 415
    code = "unsupported_content_encoding"
    headers = MappingProxyType({"accept-encoding": "zstd, gzip, deflate, br"})


class CorruptEncoding(InvalidRequest):
    """A request body that is not what its Content-Encoding says (400)."""

    code = "invalid_content_encoding"


class RequestTimeout(InvalidRequest):
    """The client was too slow sending its request (408)."""

    status = 408
    code = "request_timeout"


class ContextLengthExceeded(InvalidRequest):
    """Even the newest turn and the system messages do not fit the budget."""

    code = "context_length_exceeded"


class NotFound(InvalidRequest):
    status = 404
    code = "not_found"


class Unauthorized(InvalidRequest):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class UpstreamError(ProxyError):
    """The upstream could not be reached or did not answer properly (502)."""

    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class ConfigError(Exception):
    """A configuration problem, named by its path: ``routes[0].policy: ...``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class ConfigErrors(ConfigError):
    """Every problem of one config file, reported at once (each names its path).

    With one problem its text is that problem's, so a single mistake reads as before.
    """

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.message)
        self.errors = errors
        if len(errors) > 1:
            lines = "\n".join(f"  {e}" for e in errors)
            self.args = (f"{len(errors)} problems:\n{lines}",)


# What of an upstream's error body the request row and the log line keep: its
# message, bounded (an error text may quote the request it failed on).
UPSTREAM_MESSAGE_CHARS = 300


def upstream_failure(status: int, body: bytes) -> UpstreamError | None:
    """The error an upstream's 5xx answer carries, for the row and the log line.

    The answer itself is relayed as it came; this only names the failure, so a
    row never says ``error: null`` for one. Below 500: None (the client's own
    request was refused, and the status says so).
    """
    if status < 500:
        return None
    message, code = _error_fields(body)
    text = f"The upstream answered {status}: {message or 'no error message'}"
    if len(text) > UPSTREAM_MESSAGE_CHARS:
        text = text[: UPSTREAM_MESSAGE_CHARS - 3] + "..."
    return UpstreamError(text, code=code or "upstream_error", status=status)


def _error_fields(body: bytes) -> tuple[str | None, str | None]:
    """An error body's message and code: OpenAI's shape, ``{"error": "..."}``, or
    ``{"detail": ...}`` (FastAPI's); else the body's first bytes as text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body[:UPSTREAM_MESSAGE_CHARS].decode("utf-8", "replace").strip()
        return text or None, None
    if not isinstance(data, dict):
        return None, None
    error = data.get("error", data.get("detail"))
    if isinstance(error, dict):
        message, code = error.get("message"), error.get("code") or error.get("type")
        return (
            message if isinstance(message, str) else None,
            code if isinstance(code, str) else None,
        )
    if isinstance(error, str):
        return error, None
    return None, None

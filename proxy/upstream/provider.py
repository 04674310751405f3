"""An upstream that is not OpenAI-compatible, reached through litellm.

The route names a litellm model (``anthropic/claude-sonnet-4-5``,
``gemini/...``, ``bedrock/...``); litellm translates the OpenAI chat body to
the provider's shape and the answer (streamed or not) back to OpenAI's, so the
rest of the proxy sees the same status, headers and bytes an OpenAI-compatible
upstream would give. ``POST /embeddings`` is translated too (litellm's
``aembedding``: Cohere, Bedrock, Vertex, Voyage... embeddings behind one
``base_url``); any other endpoint is refused, since litellm has no generic
translation for it.

litellm is heavy (seconds to import) and reaches for the network on import
unless told not to, so it is imported only when a ``LitellmUpstream`` is
built: routes to OpenAI-compatible upstreams never pay for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from proxy.upstream.base import UpstreamRequest
from proxy.upstream.litellm_stream import JSON, JsonResponse, LitellmStream
from proxy.upstream.litellm_support import (
    bearer,
    error_status,
    load_litellm,
    no_answer_error,
    own_body,
    provider_message,
    retry_after_of,
    unwrap,
)

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

# What an embeddings body may pass to litellm besides its input (an allowlist, as for chat).
EMBEDDING_FIELDS = frozenset({"input", "dimensions", "encoding_format", "user"})
# The paths a litellm upstream answers (below the upstream's /v1).
PATHS = frozenset({"/chat/completions", "/embeddings"})

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
        name: str | None = None,
    ) -> None:
        clash = _CONTROL_KWARGS.intersection(extra or {})
        if clash:
            raise ValueError(f"extra may not set {', '.join(sorted(clash))}")
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.extra = dict(extra or {})
        # Named in errors that reach logs and clients: which upstream, which host.
        where = urlsplit(api_base).netloc if api_base else model
        self.origin = f"Upstream {name!r} ({where})" if name else f"The provider ({where})"
        # Imported here, once, so the first request does not pay for it.
        self._lib = load_litellm()
        self._streams: set[LitellmStream] = set()

    async def send(self, request: UpstreamRequest) -> JsonResponse | LitellmStream:
        path = request.path.rstrip("/")
        if request.method != "POST" or path not in PATHS:
            message = f"{request.method} {request.path} is not supported by a litellm upstream."
            return JsonResponse(404, error_body(message, 404, "not_found"))
        body = own_body(request.json, request.body)
        if path == "/embeddings":
            return await self._embed(body, request)
        if body is None or not isinstance(body.get("messages"), list):
            return JsonResponse(400, error_body("A chat body with messages is required.", 400))

        client_model = str(body.get("model") or self.model)
        kwargs = {k: v for k, v in body.items() if k in CHAT_FIELDS}
        kwargs.update(self.extra)
        api_key = self.api_key if self.api_key is not None else bearer(request.headers)
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

    async def _embed(self, body: dict[str, Any] | None, request: UpstreamRequest) -> JsonResponse:
        if body is None or not isinstance(body.get("input"), str | list):
            return JsonResponse(400, error_body("An embeddings body with input is required.", 400))
        client_model = str(body.get("model") or self.model)
        kwargs = {k: v for k, v in body.items() if k in EMBEDDING_FIELDS}
        api_key = self.api_key if self.api_key is not None else bearer(request.headers)
        try:
            result = await self._lib.aembedding(
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
        result.model = client_model
        return JsonResponse(200, result.model_dump_json().encode())

    async def _open_stream(self, stream: Any, client_model: str) -> JsonResponse | LitellmStream:
        # Fetch the first chunk before answering: an error the provider sends
        # before any content must still become a status and a body.
        opened = False
        try:
            first = await anext(stream, None)

            def event(chunk: Any) -> bytes:
                # The client asked for its own model name; litellm reports the provider's.
                chunk.model = client_model
                data: str = chunk.model_dump_json()
                return b"data: " + data.encode() + b"\n\n"

            response = LitellmStream(
                self._lib, stream, first, event, end=_DONE, closed=self._streams.discard
            )
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
        unanswered = no_answer_error(lib, exc)
        if unanswered is not None:
            raise type(unanswered)(f"{self.origin}: {unanswered.message}") from exc
        exc = unwrap(exc)
        status = error_status(exc)
        code = None
        if isinstance(exc, lib.context_window):
            code = "context_length_exceeded"
        elif isinstance(exc, lib.content_policy):
            code = "content_policy_violation"
        headers = list(JSON)
        retry_after = retry_after_of(exc)
        if retry_after is not None:
            headers.append(("retry-after", retry_after))
        return JsonResponse(status, error_body(provider_message(exc), status, code), headers)

    async def close(self) -> None:
        for stream in list(self._streams):
            await stream.close()

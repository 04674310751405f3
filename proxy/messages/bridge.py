"""``/v1/messages`` for upstreams that do not speak Anthropic's API: translated by litellm.

An OpenAI-compatible server (vLLM, Ollama's ``/v1``, OpenAI) or any litellm
provider answers chat completions; litellm's Anthropic adapter
(``litellm.anthropic_messages``, the same translation litellm's own proxy
serves ``/v1/messages`` with) turns the request into a chat completion and
the answer, whole or streamed, back into a ``message`` and Anthropic's
events. It is used as it is: it translates tools, tool results, images,
system blocks, thinking settings and stop reasons, and streams the events in
Anthropic's order. Two things are put right here: litellm routes OpenAI
models through the Responses API unless told not to (an OpenAI-compatible
server usually has none), and it reports the provider's model name where the
client asked for its own.

The bridge is an ``Upstream`` for ``POST /messages`` only, so the pipeline
relays what it produces exactly as it relays an Anthropic upstream's bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from proxy.config.model import UpstreamConfig
from proxy.errors import anthropic_type
from proxy.upstream.base import UpstreamRequest
from proxy.upstream.litellm_stream import (
    JsonResponse,
    LitellmStream,
    failure_response,
    litellm_target,
    open_stream,
)
from proxy.upstream.litellm_support import bearer, load_litellm, parse_object

# Messages fields handed to litellm: an allowlist (litellm reads other kwargs as its
# own configuration: api_base, extra_headers, mock_response ...).
# fmt: off
MESSAGES_FIELDS = frozenset({
    "messages", "system", "max_tokens", "metadata", "stop_sequences", "stream",
    "temperature", "thinking", "tool_choice", "tools", "top_k", "top_p",
})
# fmt: on

# A key for servers that want none (vLLM, Ollama): litellm's OpenAI client insists on one.
_NO_KEY = "no-key"


def load() -> None:
    """Import litellm and set it up (seconds, once per process): call off the event loop."""
    load_litellm()
    import litellm
    import litellm.messages  # anthropic_messages' module: the heavy part

    # OpenAI-compatible servers serve chat completions; litellm would otherwise send
    # openai/... models to /responses, which vLLM, Ollama and llama.cpp lack.
    litellm.use_chat_completions_url_for_anthropic_messages = True


def error_body(message: str, status: int, exc: BaseException | None = None) -> bytes:
    """An error in Anthropic's shape (its type read off the status)."""
    error = {"type": anthropic_type(status), "message": message}
    return orjson.dumps({"type": "error", "error": error})


def _bytes(chunk: object) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, str):
        return chunk.encode()
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


_START = b"event: message_start\n"


def _with_model(chunk: bytes, model: str) -> bytes:
    """``message_start`` naming the client's model (litellm names the provider's)."""
    if not chunk.startswith(_START):
        return chunk
    head, sep, data = chunk[len(_START) :].partition(b"data: ")
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return chunk
    message = event.get("message") if isinstance(event, dict) else None
    if not isinstance(message, dict):
        return chunk
    event["message"] = {**message, "model": model}
    return _START + head + sep + orjson.dumps(event) + b"\n\n"


class MessagesBridge:
    """``POST /messages`` answered by a chat-completions upstream, through litellm."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._lib = load_litellm()
        from litellm.messages import anthropic_messages

        # Typed loosely: its return type depends on ``stream``.
        self._create: Callable[..., Awaitable[Any]] = anthropic_messages

    async def send(self, request: UpstreamRequest) -> JsonResponse | LitellmStream:
        if request.method != "POST" or request.path.rstrip("/") != "/messages":
            message = f"{request.method} {request.path} is not served by a messages bridge."
            return JsonResponse(404, error_body(message, 404))
        body = request.json if request.json is not None else parse_object(request.body)
        if body is None:
            return JsonResponse(400, error_body("A JSON request body is required.", 400))
        client_model = str(body.get("model") or "")
        config = self.config
        model, api_base = litellm_target(
            config.litellm_model, config.api_base, config.base_url, client_model
        )
        kwargs = {k: v for k, v in body.items() if k in MESSAGES_FIELDS}
        api_key = (
            self.config.api_key
            or bearer(request.headers)
            or request.headers.get("x-api-key")
            or _NO_KEY
        )
        try:
            result = await self._create(
                **kwargs,
                model=model,
                api_base=api_base,
                api_key=api_key,
                extra_headers=dict(self.config.headers) or None,
                timeout=self.config.timeout_s,
                num_retries=0,
                drop_params=True,
            )
        except self._lib.errors as exc:
            return self._failure(exc)
        except (TypeError, ValueError) as exc:
            # litellm's own checks of the request ("messages is required ..."): the
            # client's to fix, said in Anthropic's words.
            return JsonResponse(400, error_body(f"The request cannot be translated: {exc}", 400))
        if not kwargs.get("stream"):
            data = result if isinstance(result, dict) else orjson.loads(orjson.dumps(result))
            return JsonResponse(200, orjson.dumps({**data, "model": client_model}))
        return await open_stream(
            self._lib, result, lambda chunk: _with_model(_bytes(chunk), client_model), error_body
        )

    def _failure(self, exc: BaseException) -> JsonResponse:
        return failure_response(self._lib, exc, error_body)

    async def close(self) -> None:
        return None

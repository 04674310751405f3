"""``responses: bridge``: the Responses API for upstreams that serve only chat completions.

vLLM, Ollama and llama.cpp servers (and every litellm provider) answer chat
completions; litellm translates a Responses request to chat completions and
the answer, streamed or not, back to a Responses object and its typed events.
The bridge is an ``Upstream`` for ``POST /responses`` only, so the pipeline
relays what it produces exactly as it relays a native upstream's bytes.

The proxy never sends it a ``previous_response_id`` it could serve (it
rebuilds stored chains itself), and nobody behind a bridge holds one either:
such a request is answered as OpenAI answers an unknown id (400,
``previous_response_not_found``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from proxy.config.model import UpstreamConfig
from proxy.upstream.base import UpstreamRequest
from proxy.upstream.litellm_stream import (
    JsonResponse,
    LitellmStream,
    failure_response,
    litellm_target,
    open_stream,
)
from proxy.upstream.litellm_support import bearer, load_litellm, parse_object
from proxy.upstream.provider import error_body

# Responses fields handed on to litellm: an allowlist, for the reason
# proxy.upstream.provider.CHAT_FIELDS gives (litellm reads other kwargs as its
# own configuration: api_base, extra_headers, mock_response ...).
# fmt: off
RESPONSES_FIELDS = frozenset({
    "input", "instructions", "tools", "tool_choice", "temperature", "top_p",
    "max_output_tokens", "parallel_tool_calls", "text", "reasoning", "metadata", "store",
    "stream", "user", "truncation", "include", "service_tier", "top_logprobs",
    "safety_identifier", "prompt_cache_key", "max_tool_calls",
})
# fmt: on

# A key for servers that want none (vLLM, Ollama): litellm's OpenAI client insists on one.
_NO_KEY = "no-key"


def load() -> None:
    """Import litellm and set it up (seconds, once per process): call off the event loop."""
    load_litellm()
    import litellm.responses.main  # noqa: F401  (aresponses' module: the heavy part)


def _with_model(event: dict[str, Any], model: str) -> dict[str, Any]:
    # The client asked for its own model name; litellm reports the provider's.
    response = event.get("response")
    if isinstance(response, dict) and "model" in response:
        return {**event, "response": {**response, "model": model}}
    return event


class ResponsesBridge:
    """``POST /responses`` answered by a chat-completions upstream, through litellm."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._lib = load_litellm()
        import litellm

        # Typed loosely: its return type depends on ``stream``.
        self._aresponses: Callable[..., Awaitable[Any]] = litellm.aresponses

    async def send(self, request: UpstreamRequest) -> JsonResponse | LitellmStream:
        if request.method != "POST" or request.path.rstrip("/") != "/responses":
            message = f"{request.method} {request.path} is not served by a responses bridge."
            return JsonResponse(404, error_body(message, 404, "not_found"))
        body = request.json if request.json is not None else parse_object(request.body)
        if body is None:
            return JsonResponse(400, error_body("A JSON request body is required.", 400))
        previous = body.get("previous_response_id")
        if previous:
            message = f"Previous response with id '{previous}' not found."
            return JsonResponse(400, error_body(message, 400, "previous_response_not_found"))
        client_model = str(body.get("model") or "")
        config = self.config
        model, api_base = litellm_target(
            config.litellm_model, config.api_base, config.base_url, client_model
        )
        kwargs = {k: v for k, v in body.items() if k in RESPONSES_FIELDS}
        kwargs["input"] = text_content(kwargs.get("input", []))
        api_key = self.config.api_key or bearer(request.headers) or _NO_KEY
        try:
            result = await self._aresponses(
                **kwargs,
                model=model,
                api_base=api_base,
                api_key=api_key,
                extra_headers=dict(self.config.headers) or None,
                timeout=self.config.timeout_s,
                num_retries=0,
                drop_params=True,
                use_chat_completions_api=True,
            )
        except self._lib.errors as exc:
            return self._failure(exc)
        if not kwargs.get("stream"):
            data = conform_response(orjson.loads(result.model_dump_json()))
            return JsonResponse(200, orjson.dumps({**data, "model": client_model}))
        conform = EventConformer()

        def encode(event: Any) -> bytes:
            data = conform(_with_model(orjson.loads(event.model_dump_json()), client_model))
            kind = str(data.get("type") or "message")
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

        return await open_stream(self._lib, result, encode, self._error_body)

    def _failure(self, exc: BaseException) -> JsonResponse:
        return failure_response(self._lib, exc, self._error_body)

    def _error_body(self, message: str, status: int, exc: BaseException) -> bytes:
        code = "context_length_exceeded" if isinstance(exc, self._lib.context_window) else None
        return error_body(message, status, code)

    async def close(self) -> None:
        return None


# -- what a chat-only server can read ------------------------------------------------
# litellm turns a message item's content parts into chat content parts; llama-cpp-python's
# chat formats (and other servers' templates) take ``content`` only as a string, and
# answer a list with a 500. Parts that are text and nothing else (no image, no
# cache mark) say the same as their texts joined, which every server reads.

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# Keys a text part may carry that a joined string loses nothing by dropping.
_TEXT_KEYS = frozenset({"type", "text", "annotations", "logprobs"})


def text_content(items: Any) -> Any:
    """``input`` with each message item whose parts are all plain text given one string."""
    if not isinstance(items, list):
        return items
    return [_joined(item) if isinstance(item, dict) else item for item in items]


def _joined(item: dict[str, Any]) -> dict[str, Any]:
    parts = item.get("content")
    if item.get("type", "message") != "message" or not isinstance(parts, list) or not parts:
        return item
    texts = []
    for part in parts:
        if (
            not isinstance(part, dict)
            or part.get("type") not in _TEXT_PARTS
            or not isinstance(part.get("text"), str)
            or not _TEXT_KEYS.issuperset(part)
        ):
            return item
        texts.append(part["text"])
    # Joined as vLLM and llama.cpp join text parts themselves: one line apart.
    return {**item, "content": "\n".join(texts)}


# -- litellm's objects in the shapes OpenAI's spec gives them --------------------------
# litellm fills optional fields with null where the API omits them (``user``,
# ``text``, ``usage`` while streaming, ``namespace`` on calls) and leaves out
# some required ones (``logprobs`` on text, ``name`` on arguments.done); SDKs
# and validators built from the spec reject those, so they are put right here.

# Response fields the spec does not allow to be null: dropped when they are.
_NOT_NULL = frozenset({"user", "text", "usage", "prompt", "prompt_cache_options", "service_tier"})
_DEFAULTS: dict[str, Any] = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def conform_response(response: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in response.items() if not (v is None and k in _NOT_NULL)}
    for key, default in _DEFAULTS.items():
        if out.get(key) is None:
            out[key] = default
    if isinstance(out.get("output"), list):
        out["output"] = [conform_item(i) if isinstance(i, dict) else i for i in out["output"]]
    usage = out.get("usage")
    if isinstance(usage, dict):
        usage = {k: v for k, v in usage.items() if v is not None}
        usage.setdefault("input_tokens_details", {"cached_tokens": 0, "cache_write_tokens": 0})
        usage.setdefault("output_tokens_details", {"reasoning_tokens": 0})
        out["usage"] = usage
    return out


def conform_item(item: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in item.items() if v is not None or k == "phase"}
    if isinstance(out.get("content"), list):
        out["content"] = [conform_part(p) if isinstance(p, dict) else p for p in out["content"]]
    return out


def conform_part(part: dict[str, Any]) -> dict[str, Any]:
    if part.get("type") != "output_text":
        return part
    out = {k: v for k, v in part.items() if v is not None}
    out.setdefault("annotations", [])
    out.setdefault("logprobs", [])
    return out


class EventConformer:
    """``conform_response`` for a stream's events (it remembers each call's name)."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        out = dict(event)
        if isinstance(out.get("response"), dict):
            out["response"] = conform_response(out["response"])
        item = out.get("item")
        if isinstance(item, dict):
            out["item"] = conform_item(item)
            if isinstance(item.get("id"), str) and isinstance(item.get("name"), str):
                self._names[item["id"]] = item["name"]
        if isinstance(out.get("part"), dict):
            out["part"] = conform_part(out["part"])
        kind = out.get("type")
        if kind in ("response.output_text.delta", "response.output_text.done"):
            if out.get("logprobs") is None:
                out["logprobs"] = []
        elif kind == "response.function_call_arguments.done" and out.get("name") is None:
            out["name"] = self._names.get(str(out.get("item_id")), "")
        return out

"""POST /v1/messages: the Anthropic Messages API through the one chat pipeline.

parse -> the chat view (proxy/messages/view.py) -> route, session, policy,
summary, recall (``ChatExchange.plan``, unchanged) -> the policy's messages
written back as content blocks -> upstream -> relay (+ assemble) -> store.

- An upstream with ``api: anthropic`` gets the request as it came (its very
  bytes when the policy changed nothing), but for the messages the policy
  rewrote and the proxy's one cache breakpoint (proxy/messages/cache_marks.py);
  its answer, streamed or not, reaches the client byte for byte.
- Any other upstream gets it through litellm's Anthropic adapter
  (proxy/messages/bridge.py): translated to a chat completion, and the answer
  translated back into a ``message`` or Anthropic's events.

The request row, log line, metrics, headers and the stored session are the
chat pipeline's; what is stored is the chat view, each message keeping the
blocks it was read from (thinking and its signature included), so a session
is replayed exactly and read by summaries, recall and the viewer like any other.
Errors have Anthropic's shape (proxy/errors.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from policies.tool_clearing import cleared
from policies.types import Decision
from proxy.chat.cache_step import CacheHints
from proxy.chat.pipeline import ChatExchange
from proxy.chat.stream import ReplyAssembler
from proxy.config.model import UpstreamConfig
from proxy.context.tokens import counter_for
from proxy.errors import Door, ProxyError, UpstreamError, upstream_failure
from proxy.http.body import forward_headers, parse_object, read_body
from proxy.messages.cache_marks import with_breakpoint
from proxy.messages.context_edits import NO_EDITS, clear_thinking, context_edits
from proxy.messages.stream import MessageAssembler
from proxy.messages.view import (
    anthropic_request,
    chat_usage,
    chat_view,
    check_max_tokens,
    check_request,
    reply_view,
)
from proxy.runtime import Runtime
from proxy.upstream.base import Upstream, UpstreamRequest


class MessagesExchange(ChatExchange):
    endpoint = "/v1/messages"
    door: Door = "anthropic"
    wire_messages = False

    def __init__(self, rt: Runtime, request: Request) -> None:
        super().__init__(rt, request)
        # How many chat messages the request itself reads as (the rest: stored history).
        self.view_len = 0
        self.edits = NO_EDITS

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        body = parse_object(self.raw)
        check_max_tokens(body)
        await self.plan(body)
        return await self._send(body)

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        """The chat pipeline's plan over the request's chat view."""
        check_request(body)
        self.edits = context_edits(body)
        chat = {k: v for k, v in body.items() if k not in ("messages", "system")}
        chat["messages"] = chat_view(body)
        self.view_len = len(chat["messages"])
        return await super().plan(chat, lock=lock)

    def _carries_out_edits(self) -> bool:
        """Whether the proxy carries out the context edits (an Anthropic upstream does)."""
        assert self.route is not None
        return not self.rt.config.upstreams[self.route.upstream].anthropic

    def _door_decision(self, decision: Decision) -> Decision:
        edit = self.edits.tool_uses
        if edit is None or not self._carries_out_edits():
            return decision
        return cleared(decision, edit, counter_for(self.model or "").count_message)

    async def _send(self, body: dict[str, Any]) -> Response:
        rt = self.rt
        assert self.route is not None and self.decision is not None  # plan() ran
        config = rt.config.upstreams[self.route.upstream]
        forwarded = self._forward(body, config)
        upstream: Upstream
        if config.anthropic:
            upstream = rt.upstreams[self.route.upstream]
        else:
            from proxy.messages import bridge

            # litellm takes seconds to import: never on the event loop.
            await asyncio.to_thread(bridge.load)
            upstream = bridge.MessagesBridge(config)
        sent = time.perf_counter()
        response = await upstream.send(
            UpstreamRequest(
                method="POST",
                path="/messages",
                headers=forward_headers(self.header_items, config, rt.config.session.header),
                body=forwarded,
                json=None if config.anthropic else orjson.loads(forwarded),
                stream=self.stream,
                # Claude Code asks for /v1/messages?beta=true: an Anthropic upstream gets it.
                query=self.request.url.query if config.anthropic else "",
            )
        )
        self.upstream_ms = (time.perf_counter() - sent) * 1000
        return await self._relay(response)

    def _forward(self, body: dict[str, Any], config: UpstreamConfig) -> bytes:
        """The body to send: the client's bytes when nothing changed, else rewritten."""
        hinted = config.anthropic and config.cache.breakpoints == "auto"
        return self.forwarded(body, breakpoint=hinted)

    def forwarded(self, body: dict[str, Any], *, breakpoint: bool) -> bytes:
        """The body as the policy leaves it (``breakpoint``: with the proxy's cache breakpoint
        where there is room); the client's own bytes when that changes nothing."""
        d = self.decision
        assert d is not None  # plan() ran
        unchanged = not d.changed and len(d.messages) == len(self.conversation) == self.view_len
        if unchanged:
            system, messages = body.get("system"), body["messages"]
        else:
            system, messages = anthropic_request(d.messages, body.get("system"))
        keep = self.edits.thinking_turns
        if keep is not None and self._carries_out_edits():
            thinned = clear_thinking(messages, keep)
            unchanged = unchanged and thinned == messages
            messages = thinned
        placed = None
        if breakpoint:
            messages, placed = with_breakpoint(body, messages)
        if placed is not None:
            self.cache = CacheHints(breakpoints=(placed,))
        if unchanged and placed is None:
            return self.raw  # the client's bytes are sacred
        out = {k: v for k, v in body.items() if k not in ("system", "messages")}
        if system:
            out["system"] = system
        out["messages"] = messages
        return orjson.dumps(out)

    # -- the answer, in Anthropic's dialect -------------------------------------

    def _assembler(self) -> ReplyAssembler:
        return MessageAssembler()

    def _stream_error(self, error: ProxyError) -> bytes:
        return b"event: error\ndata: " + error.door_bytes("anthropic") + b"\n\n"

    def _whole_reply(
        self, status: int, content: bytes
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, UpstreamError | None]:
        if status != 200:
            # Relayed as it came; a 5xx's error is named in the row and the log line.
            return None, None, upstream_failure(status, content)
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            self.answered_as = data["model"]  # calibration is kept per model that answered
        reply = reply_view(data) if isinstance(data, dict) else None
        usage = chat_usage(data.get("usage")) if isinstance(data, dict) else None
        if reply is None:
            invalid = UpstreamError(
                "The upstream's 200 answer is not a message.", code="upstream_invalid_response"
            )
            return None, usage, invalid
        return reply, usage, None

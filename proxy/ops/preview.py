"""POST /v1/context/preview: what a request would forward, without forwarding it.

The body is a chat completions body (``messages``), a Responses body
(``input``), or an Anthropic Messages body (sent with ``anthropic-version``).
The preview runs the very code the real request runs up to the
upstream call (the exchange's ``plan``: routing, session, a ``history:
server`` route's stored history or a ``previous_response_id`` chain, the
policy's decision; for Responses also the stateless replay of the items), so
what it shows is what the upstream would receive, by construction. Nothing
is sent upstream, nothing is stored, and no session lock is taken (stored
history is only read).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from policies.types import Decision
from proxy.chat.pipeline import ChatExchange
from proxy.context.tokens import counter_for
from proxy.http.body import parse_object, read_body
from proxy.messages.compaction import CompactingMessages
from proxy.messages.pipeline import MessagesExchange
from proxy.responses.compaction import CompactingExchange
from proxy.responses.pipeline import ResponsesExchange
from proxy.runtime import Runtime
from proxy.telemetry.cache_usage import estimate_cached


def decision_view(d: Decision, messages_before: int) -> dict[str, Any]:
    """A decision as JSON: what was kept, dropped, clipped, and why."""
    return {
        "changed": d.changed,
        "messages_before": messages_before,
        "messages_after": len(d.messages),
        "tokens_before": d.tokens_before,
        "tokens_after": d.tokens_after,
        "tokens_saved": d.tokens_before - d.tokens_after,
        "budget": d.budget,
        "reason": d.reason,
        "turns_dropped": d.turns_dropped,
        "kept": list(d.kept),
        "dropped": list(d.dropped),
        "repaired": list(d.repaired),
        "clipped": [
            {"index": c.index, "tokens_before": c.tokens_before, "tokens_after": c.tokens_after}
            for c in d.clipped
        ],
        # Tool results forwarded as a placeholder (mask_tool_outputs); stored in full.
        "masked": [
            {"index": m.index, "tokens_before": m.tokens_before, "tokens_after": m.tokens_after}
            for m in d.masked
        ],
        # Upstream tokens per local token applied to the budget (1.0: none).
        "calibration": d.extra.get("calibration", 1.0),
        "extra": {k: v for k, v in d.extra.items() if k != "calibration"},
    }


def cache_estimate(
    exchange: ChatExchange, decision: Decision, body: dict[str, Any]
) -> dict[str, Any]:
    """What the upstream's prompt cache could serve: the leading messages the session's
    previous request forwarded too, in tokens (tools and other fixed parts included,
    as they precede the messages), and what an OpenAI-style cache (1,024-token
    minimum, 128-token steps) would report for them. An estimate: the upstream's own
    figure is on the request row."""
    stable = exchange.stable_prefix
    out: dict[str, Any] = {"stable_prefix": stable}
    if stable is not None and not isinstance(exchange, ResponsesExchange):
        counter = counter_for(exchange.model or "")
        tokens = counter.count_messages(decision.messages[:stable])
        if stable:
            tokens += counter.count_request_fixed(body)
        out["stable_prefix_tokens"] = tokens
        out["estimated_cached_tokens"] = estimate_cached(tokens)
    return out


def _exchange(rt: Runtime, request: Request, body: dict[str, Any]) -> ChatExchange:
    """The pipeline the body is for: Responses (``input``), Anthropic Messages (a request
    with ``anthropic-version``) or chat (``messages``, the default)."""
    if "anthropic-version" in request.headers:
        return CompactingMessages(rt, request)
    if "messages" not in body and ("input" in body or "previous_response_id" in body):
        # Compaction items expanded as for the request itself (nothing is compacted here).
        exchange = CompactingExchange(rt, request)
        exchange.body = body
        return exchange
    return ChatExchange(rt, request)


async def context_preview(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    rt = runtime.pin()
    try:
        raw = await read_body(
            request, rt.config.server.max_body_bytes, rt.config.server.body_timeout_s
        )
        body = parse_object(raw, deferred="messages")
        exchange = _exchange(rt, request, body)
        exchange.raw = raw
        decision = await exchange.plan(body, lock=False)
        assert exchange.route is not None  # plan() routed or raised
        route = exchange.route
        forwarded: dict[str, Any]
        if isinstance(exchange, ResponsesExchange):
            # The items as the upstream gets them: replayed, ids resolved.
            _, sent = exchange._forward(body)
            history = exchange.chain_len
            forwarded = {"input": sent.get("input")}
        elif isinstance(exchange, MessagesExchange):
            # The system and content blocks as the upstream gets them.
            sent = orjson.loads(exchange.forwarded(body, breakpoint=False))
            history = len(exchange.conversation) - exchange.view_len
            forwarded = {"system": sent.get("system"), "messages": sent["messages"]}
        else:
            history = len(exchange.conversation) - len(body["messages"])
            forwarded = {"messages": decision.messages}
        content = {
            "object": "context.preview",
            "endpoint": exchange.endpoint,
            "model": exchange.model,
            "route": route.name,
            "upstream": route.upstream,
            # The policy applied: a context mode (the X-Context-Mode header or a
            # route rule) may have replaced the route's, as on the real request.
            "policy": exchange.policy or route.policy,
            "mode": exchange.mode,
            # Summarize policies: ``needed`` when the real request would make one.
            "summary": None
            if exchange.summary is None
            else {"status": exchange.summary.status, "fallback": exchange.summary.fallback},
            # Policies with recall: what the real request would bring back (the
            # block is in ``messages`` too).
            "recall": None if exchange.recall is None else exchange.recall.detail(),
            "history": route.history,
            "session": None
            if exchange.ref is None
            else {"tenant": exchange.ref.tenant, "key": exchange.ref.key},
            # Stored messages (a `history: server` route's, or a previous
            # response's chain) put before the client's.
            "stored_messages_prepended": history,
            **forwarded,
            "decision": decision_view(decision, len(exchange.conversation)),
            "cache": cache_estimate(exchange, decision, body),
        }
        # The same X-Context-* headers the real request would carry (no request id:
        # no request row is written for a preview).
        headers = exchange._headers()
        headers.pop("x-ctxproxy-request-id", None)
        return JSONResponse(content, headers=headers)
    finally:
        rt.release()

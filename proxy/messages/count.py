"""POST /v1/messages/count_tokens: the tokens of what ``/v1/messages`` would forward.

The body runs the door's plan (routed as ``/v1/messages``: the same route,
session, policy and stored history; read-only, like the preview: no lock,
nothing stored, nothing recorded), so the count is of the request the
upstream would get after the policy, the same request whose
``usage.input_tokens`` the client then sees. Claude Code decides when to
compact from both; a count of what the client sent would make it compact
long before the proxy's trimming needs it to.

- An Anthropic upstream counts it itself: the rewritten body goes to its
  ``/v1/messages/count_tokens`` (the client's bytes when the policy changed
  nothing) and its answer is relayed as it came.
- Any other: counted here with the upstream model's tokenizer (as the chat
  door counts) and scaled by the model's calibration factor, learnt from the
  usage its upstream reported, so the count tracks the provider's.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.context.tokens import counter_for
from proxy.errors import ProxyError
from proxy.http.body import error_response, forward_headers, parse_object, read_body, relay_headers
from proxy.messages.compaction import CompactingMessages
from proxy.runtime import Runtime
from proxy.upstream.base import UpstreamRequest


async def count_tokens(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    rt = runtime.pin()
    exchange = CompactingMessages(rt, request)
    try:
        exchange.raw = await read_body(
            request, rt.config.server.max_body_bytes, rt.config.server.body_timeout_s
        )
        body = parse_object(exchange.raw)
        decision = await exchange.plan(body, lock=False)
        assert exchange.route is not None and exchange.model is not None  # plan() ran
        headers = exchange._headers()
        headers.pop("x-ctxproxy-request-id", None)  # no request row for a count
        config = rt.config.upstreams[exchange.route.upstream]
        if config.anthropic:
            upstream = rt.upstreams[exchange.route.upstream]
            response = await upstream.send(
                UpstreamRequest(
                    method="POST",
                    path="/messages/count_tokens",
                    headers=forward_headers(
                        exchange.header_items, config, rt.config.session.header
                    ),
                    body=exchange.forwarded(body, breakpoint=False),
                    query=request.url.query,
                )
            )
            try:
                content = await response.read()
            finally:
                await response.close()
            out = Response(content, status_code=response.status)
            out.raw_headers = relay_headers(response.headers, headers)
            out.raw_headers.append((b"content-length", str(len(content)).encode()))
            return out
        counter = counter_for(exchange.model)
        local = counter.count_messages(decision.messages) + counter.count_request_fixed(body)
        tokens = math.ceil(local * rt.calibration.factor(exchange.model))
        answer: dict[str, Any] = {"input_tokens": tokens}
        return Response(orjson.dumps(answer), media_type="application/json", headers=headers)
    except ProxyError as error:
        return error_response(error, exchange._headers(), "anthropic")
    finally:
        rt.release()

"""POST /v1/responses/compact: a conversation compacted, as OpenAI's endpoint answers it.

The body is a Responses request's (``model``, ``input`` and/or
``previous_response_id``, ``instructions``, ``tools``, ...); the answer is
``{"object": "response.compaction", "output": [...], "usage": ...}`` whose
output is the conversation's user messages, in order, followed by exactly one
compaction item. It is served by the route of ``/v1/responses`` for the
model, as that route's ``compaction`` says: the proxy summarizes as for a
``compaction_trigger`` (proxy/responses/compaction.py), ``upstream`` relays
the request to the upstream's own ``/responses/compact``, ``off`` is a 400
``compaction_not_supported``. Nothing is streamed; the request row says what
was done (``detail.compaction``); the summary is stored in the session.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from policies.compaction import retained
from proxy.http.body import forward_headers, parse_object, read_body
from proxy.responses.compaction import CompactingExchange
from proxy.responses.compaction_wire import Asked, usage
from proxy.responses.items import ItemCounter
from proxy.runtime import Runtime
from proxy.upstream.base import UpstreamRequest


def output_item(message: Mapping[str, Any]) -> dict[str, Any]:
    """A retained message as an output item: with an id and a status, as OpenAI returns it."""
    return {"id": f"msg_{os.urandom(16).hex()}", "status": "completed", **message}


class CompactExchange(CompactingExchange):
    endpoint = "/v1/responses/compact"

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        self.body = {**parse_object(self.raw), "stream": False}
        self.asked = Asked(trigger=True)
        self.compacting = True
        await self.plan(self.body)
        if self.compaction_mode == "upstream":
            return await self._relay_compact()
        n = self.chain_len
        self.compaction = await self._compact(self.conversation[n:], n)
        counter = ItemCounter(self.model or "")
        pairs = zip(self.conversation, self.item_hashes, strict=True)
        answer = {
            "id": f"resp_{os.urandom(16).hex()}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*map(output_item, retained(self.conversation)), self.compaction.item],
            "usage": usage(
                sum(counter.count(i, h) for i, h in pairs),
                counter.count({"role": "assistant", "content": self.compaction.payload.summary}),
            ),
        }
        # Recorded (the request row; not a response to continue) before the answer goes.
        await self._commit(answer)
        out = Response(orjson.dumps(answer), media_type="application/json")
        out.headers.update(self._headers())
        return out

    async def _relay_compact(self) -> Response:
        """``compaction: upstream``: the upstream's own endpoint, the bytes as they came."""
        rt = self.rt
        assert self.route is not None
        config = rt.config.upstreams[self.route.upstream]
        sent = time.perf_counter()
        response = await rt.upstreams[self.route.upstream].send(
            UpstreamRequest(
                method="POST",
                path="/responses/compact",
                headers=forward_headers(
                    self.request.headers.items(), config, rt.config.session.header
                ),
                body=self.raw,
                stream=False,
            )
        )
        self.upstream_ms = (time.perf_counter() - sent) * 1000
        return await self._relay(response)

    def _detail(self) -> dict[str, Any]:
        detail = super()._detail()
        detail.setdefault("compaction", {})["asked"] = "compact"
        return detail


async def compact_response(request: Request) -> Response:
    rt: Runtime = request.app.state.runtime
    # Pinned: a config reload mid-request must not change this request's route or policy.
    return await CompactExchange(rt.pin(), request).run()

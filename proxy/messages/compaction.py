"""POST /v1/messages with Anthropic's compaction, answered by the proxy for any model.

The Messages pipeline (proxy/messages/pipeline.py) with compaction on top, as
the route's ``compaction`` says (proxy/messages/compaction_wire.py):

- every request: the newest compaction block in the messages is read as
  Anthropic reads it (what came before it dropped) into a user message with
  its summary; the proxy's own block always (no upstream reads it), a foreign
  one where the proxy answers compaction. The turns the proxy's block folded
  away come back from the store in front of the conversation, never
  forwarded but there for recall, as on the Responses door;
- ``compaction: {"type": "summarize"}``: the conversation is summarized
  (proxy/context/compaction.py: the session's incremental summary, the summary
  service, the offline fallback) and the answer is one ``compaction`` block,
  ``stop_reason: "compaction"``, whole or streamed; no upstream is called;
- a ``compact_20260112`` edit: past its trigger (input tokens), everything
  before the newest user turn is compacted first, the upstream gets the
  system, the summary and that turn, and the answer carries the block before
  the upstream's content (``pause_after_compaction``: the block alone);
- ``off``: either ask is a 400; ``upstream``: relayed as they came.

What happened is in the request row (``detail.compaction``), the
``X-Context-Compaction`` header and the log line.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from policies.recall import reserve
from policies.types import Decision, SummaryState
from proxy.chat.pipeline import ExchangeEndpoint
from proxy.context.compaction import Compaction, CompactionInput, compact, folded_turns
from proxy.context.summaries import build_summarizer
from proxy.context.tokens import counter_for
from proxy.http.body import parse_object, read_body
from proxy.http.sessions import content_hash
from proxy.messages.compaction_wire import (
    BlockFirst,
    ExpandedBlocks,
    Mode,
    compaction_block,
    compaction_mode,
    expand_blocks,
    message_events,
    message_object,
    not_supported,
    summarize_asked,
    summary_text,
)
from proxy.messages.context_edits import COMPACT
from proxy.messages.pipeline import MessagesExchange
from proxy.messages.view import chat_view, check_max_tokens, check_request
from proxy.runtime import Runtime
from proxy.store.base import RequestRecord
from proxy.upstream.base import UpstreamResponse


def _without_asks(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the compaction asks the proxy answers (an upstream gets neither)."""
    out = {k: v for k, v in body.items() if k != "compaction"}
    management = body.get("context_management")
    if isinstance(management, dict) and isinstance(management.get("edits"), list):
        edits = [
            e for e in management["edits"] if not (isinstance(e, dict) and e.get("type") == COMPACT)
        ]
        if edits:
            out["context_management"] = {**management, "edits": edits}
        else:
            out.pop("context_management")
    return out


def _newest_user(messages: list[dict[str, Any]]) -> int:
    """Where the newest user turn starts (tool results are ``tool`` messages: a call and
    its result stay on one side of it)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return 0


class CompactingMessages(MessagesExchange):
    """One ``/v1/messages`` request, compaction included (see the module docstring)."""

    def __init__(self, rt: Runtime, request: Request) -> None:
        super().__init__(rt, request)
        self.summarize = False
        self.compaction_mode: Mode | None = None
        self.expanded = ExpandedBlocks([])
        self.compaction: Compaction | None = None
        # Positions of the conversation never forwarded: folded turns, a compacted head.
        self.hidden: set[int] = set()
        self.restored = 0
        self.measured: int | None = None
        self.previewing = False
        # Where the expanded block's summary is in the conversation.
        self.summary_at: int | None = None
        # The body as asked, and as forwarded (expanded, the proxy's asks taken out).
        self._asked_body: dict[str, Any] = {}
        self._forwarded_body: dict[str, Any] = {}

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        body = parse_object(self.raw)
        check_max_tokens(body)
        await self.plan(body)
        if self.summarize and self.compaction_mode == "proxy":
            return await self._answer_summarize(body)
        if (
            self.compaction is not None
            and self.edits.compact is not None
            and self.edits.compact.pause
        ):
            return await self._answer_summarize(body)
        return await self._send(self._forwarded_body)

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        self.previewing = not lock
        check_request(body)
        self.summarize = summarize_asked(body)
        self._asked_body = body
        self._forwarded_body = body
        return await super().plan(body, lock=lock)

    async def _door_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Mode, expansion, the folded turns back, and a threshold compaction (see above)."""
        assert self.route is not None
        body = self._asked_body
        upstream = self.rt.config.upstreams[self.route.upstream]
        self.compaction_mode = compaction_mode(self.route, upstream)
        threshold = self.edits.compact
        if self.compaction_mode == "off" and (self.summarize or threshold is not None):
            raise not_supported("compaction" if self.summarize else "context_management")
        proxied = self.compaction_mode == "proxy"
        self.expanded = expand_blocks(body["messages"], keep_foreign=not proxied)
        forwarded = body
        if self.expanded.changed:
            forwarded = {**body, "messages": self.expanded.messages}
        if proxied and (self.summarize or threshold is not None):
            forwarded = _without_asks(forwarded)
        if forwarded is not body:
            self._forwarded_body = forwarded
            # What is forwarded is no longer the client's bytes.
            self.raw = orjson.dumps(forwarded)
            messages = chat_view(forwarded)
            self.view_len = len(messages)
        folded: list[dict[str, Any]] = []
        payload = self.expanded.payload
        if payload is not None and self.ref is not None:
            folded = await folded_turns(self.rt.store, self.ref, payload)
        self.restored = len(folded)
        self.hidden = set(range(len(folded)))
        if payload is not None:
            # The block's summary: the view's first message after the system.
            first = next((i for i, m in enumerate(messages) if m.get("role") != "system"), 0)
            self.summary_at = len(folded) + first
        conversation = [*folded, *messages]
        if proxied and threshold is not None and not self.summarize and not self.previewing:
            conversation = await self._past_threshold(folded, messages, threshold.trigger)
        return conversation

    def _previous(self) -> SummaryState | None:
        """The expanded block's summary as a plan's state: it covers the conversation up to
        itself (the turns it folded, restored in front, and the system)."""
        payload = self.expanded.payload
        if payload is None or self.summary_at is None:
            return None
        return payload.state(self.summary_at + 1)

    async def _past_threshold(
        self, folded: list[dict[str, Any]], messages: list[dict[str, Any]], trigger: int
    ) -> list[dict[str, Any]]:
        counter = counter_for(self.model or "")
        self.measured = sum(counter.count_message(m, content_hash(m)) for m in messages)
        start = _newest_user(messages)
        head = [m for m in messages[:start] if m.get("role") != "system"]
        if self.measured <= trigger or not head:
            return [*folded, *messages]
        self.compaction = await self._compact([*folded, *messages[:start]], self._previous())
        summary = {"role": "user", "content": summary_text(self.compaction.payload)}
        n = len(folded)
        self.hidden |= {n + i for i in range(start) if messages[i].get("role") != "system"}
        return [*folded, *messages[:start], summary, *messages[start:]]

    async def _compact(
        self, items: list[dict[str, Any]], previous: SummaryState | None
    ) -> Compaction:
        rt, route = self.rt, self.route
        assert route is not None and self.model is not None
        counter = counter_for(self.model)
        spec, model = route.compaction_summarizer, self.model

        def summarizer() -> Any:
            return build_summarizer(
                spec,
                model=model,
                upstream=route.upstream,
                upstream_configs=rt.config.upstreams,
                upstreams=rt.upstreams,
                client_headers=self.headers,
                count=counter.count_message,
            )

        return await compact(
            rt.summaries,
            CompactionInput(
                ref=self.ref,
                items=items,
                hashes=[content_hash(m) for m in items],
                count=counter.count_message,
                view=lambda m: m,
                summarizer_spec=spec,
                summarizer=summarizer,
                route=route.name,
                previous=previous
                if previous is not None and previous.covers <= len(items)
                else None,
            ),
        )

    def forwarded(self, body: dict[str, Any], *, breakpoint: bool) -> bytes:
        # The body as expanded (count_tokens and the preview pass the one they read).
        chosen = self._forwarded_body if body is self._asked_body else body
        return super().forwarded(chosen, breakpoint=breakpoint)

    def _door_decision(self, decision: Decision) -> Decision:
        """What a compaction stands for taken out of what is forwarded, as dropped by it."""
        decision = super()._door_decision(decision)
        hidden = self.hidden
        if not hidden:
            return decision
        if len(decision.kept) == len(decision.messages):
            pairs = zip(decision.kept, decision.messages, strict=True)
            messages = [m for i, m in pairs if i not in hidden]
        else:  # a policy that adds messages of its own: the hidden ones by identity
            ids = {id(self.conversation[i]) for i in hidden if i < len(self.conversation)}
            messages = [m for m in decision.messages if id(m) not in ids]
        out = [i for i in decision.kept if i in hidden]
        counter = counter_for(self.model or "")
        tokens = sum(counter.count_message(self.conversation[i]) for i in out)
        after = max(0, decision.tokens_after - tokens)
        extra = {**decision.extra, "compaction_folded": len(out)}
        spec = getattr(self.rt.config.policies.get(self.policy or ""), "recall", None)
        limit = decision.budget
        if spec is not None and limit is not None and "recall_budget" not in extra:
            room = min(reserve(spec, limit), limit - after)
            if room > 0:
                extra["recall_budget"] = room
        return decision.but(
            messages=messages,
            kept=tuple(i for i in decision.kept if i not in hidden),
            dropped=tuple(sorted({*decision.dropped, *out})),
            tokens_after=after,
            extra=extra,
        )

    async def _answer_summarize(self, body: dict[str, Any]) -> Response:
        """One compaction block, ``stop_reason: "compaction"``: whole or streamed; stored."""
        if self.compaction is None:
            # The whole conversation, system included: what it covers is the stored chain's
            # prefix, so the next request finds the turns it folded (and recall reaches them).
            self.compaction = await self._compact(list(self.conversation), self._previous())
        counter = counter_for(self.model or "")
        block = compaction_block(self.compaction.payload)
        usage = {
            "input_tokens": self.decision.tokens_after if self.decision is not None else 0,
            "output_tokens": counter.count_message(
                {"role": "assistant", "content": self.compaction.payload.summary}
            ),
        }
        message = message_object(str(body.get("model")), [block], usage)
        content = orjson.dumps(message)
        # Stored before the client gets a byte: it may send the block back at once.
        await self._committed(self._finish_whole(200, content))
        headers = self._headers()
        if not self.stream:
            out = Response(content, media_type="application/json")
            out.headers.update(headers)
            return out
        events = message_events(message)

        async def stream() -> Any:
            for event in events:
                yield event

        answer = StreamingResponse(stream(), media_type="text/event-stream")
        answer.headers.update(headers)
        return answer

    async def _relay(self, response: UpstreamResponse) -> Response:
        if self.compaction is not None and response.status == 200:
            response = BlockFirst(response, compaction_block(self.compaction.payload))
        return await super()._relay(response)

    def _headers(self) -> dict[str, str]:
        h = super()._headers()
        if self.compaction is not None:
            h["x-context-compaction"] = self.compaction.status
            if self.compaction.fallback is not None:
                h["x-context-compaction-fallback"] = self.compaction.fallback
        elif self.expanded.expanded:
            h["x-context-compaction"] = "expanded"
        return h

    def _record(self, *args: Any, **kwargs: Any) -> RequestRecord:
        record = super()._record(*args, **kwargs)
        shown: dict[str, Any] = {}
        if self.summarize or self.edits.compact is not None:
            shown["asked"] = "summarize" if self.summarize else "threshold"
            shown["mode"] = self.compaction_mode
        if self.edits.compact is not None and not self.summarize:
            shown["threshold"] = self.edits.compact.trigger
            if self.measured is not None:
                shown["input_tokens"] = self.measured
        if self.compaction is not None:
            shown.update(self.compaction.detail())
            shown.pop("item_id", None)
        shown.update(self.expanded.detail())
        if self.restored:
            shown["restored"] = self.restored
        if shown:
            record.detail["compaction"] = shown
        return record


messages_endpoint = ExchangeEndpoint(CompactingMessages)

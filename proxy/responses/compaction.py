"""POST /v1/responses with compaction: answered by the proxy for any upstream.

The Responses pipeline (:mod:`proxy.responses.pipeline`) with compaction on
top, as the route's ``compaction`` says (proxy/responses/compaction_wire.py):

- every request: the proxy's own compaction items in the input are expanded
  into the summary they carry, foreign ones taken out where the proxy answers
  compaction (proxy/context/compaction_item.py), so no upstream gets an item
  it cannot read;
- a ``compaction_trigger`` as the last input item: the conversation before it
  is summarized (proxy/context/compaction.py) and the answer is exactly one
  ``compaction`` output item, as a Response object or a stream; no upstream
  is called; the exchange is stored as any other (the input, and the item as
  its output), so the stored history keeps every turn the item folds away
  and recall still reaches them;
- ``context_management`` with a ``compact_threshold``: past it (tokens of the
  input), everything before the newest turn is compacted first; the upstream
  gets the system and developer messages, the summary and the newest turn,
  and the answer carries the compaction item before the upstream's output;
- ``off``: any of these is a 400 ``compaction_not_supported``; ``upstream``:
  relayed as they came (the proxy's own items still expanded).

What happened is in the request row (``detail.compaction``), the
``X-Context-Compaction`` header and the log line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from policies.compaction import newest_turn, pinned
from policies.items import kind_of
from policies.recall import reserve
from policies.types import Decision, SummaryState
from proxy.context.compaction import Compaction, CompactionInput, compact, folded_turns
from proxy.context.compaction_item import TRIGGER, Expanded, covered_at, decode, expand, is_own
from proxy.context.model_info import context_window
from proxy.context.summaries import build_summarizer
from proxy.http.body import parse_object, read_body
from proxy.responses.compaction_wire import (
    DEFAULT_SHARE,
    Asked,
    CompactionFirst,
    Mode,
    asked,
    compaction_mode,
    not_supported,
    response_object,
    stream_events,
    usage,
    with_item_first,
)
from proxy.responses.items import ItemCounter, chat_view, input_items, item_hash
from proxy.responses.pipeline import ResponsesExchange
from proxy.responses.stream import LineRewrite
from proxy.runtime import Runtime
from proxy.store.base import StoredItem


class _Chained:
    """Two stream rewrites, one after the other."""

    def __init__(self, first: LineRewrite, then: LineRewrite) -> None:
        self.first, self.then = first, then

    def feed(self, chunk: bytes) -> bytes:
        return self.then.feed(self.first.feed(chunk))

    def flush(self) -> bytes:
        return self.then.feed(self.first.flush()) + self.then.flush()


class CompactingExchange(ResponsesExchange):
    """One ``/v1/responses`` request, compaction included (see the module docstring)."""

    def __init__(self, rt: Runtime, request: Request) -> None:
        super().__init__(rt, request)
        self.asked = Asked()
        self.compaction_mode: Mode | None = None
        self.expanded: Expanded | None = None
        self.compaction: Compaction | None = None
        # The compact_threshold in force, and the input tokens measured against it.
        self.threshold: int | None = None
        self.measured: int | None = None
        # The stored items the input's newest compaction item stands for (see _input).
        self.folded: list[dict[str, Any]] = []
        self.previewing = False
        # A previous response's chain: positions never forwarded, and its newest summary.
        self.chain_hidden: set[int] = set()
        self.chain_previous: SummaryState | None = None

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        # A preview (lock=False) expands items but compacts nothing: no summary is made.
        self.previewing = not lock
        return await super().plan(body, lock=lock)

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        self.body = parse_object(self.raw)
        self.asked = asked(self.body)
        # The trigger's conversation is summarized, not decided on by the policy.
        self.compacting = self.asked.trigger
        await self.plan(self.body)
        if self.asked.trigger and self.compaction_mode == "proxy":
            return await self._answer_trigger()
        return await self._send(self.body)

    async def _previous_chain(self, value: object) -> list[StoredItem]:
        """A stored chain with the proxy's compaction items in it (the output of a compaction
        continued by ``previous_response_id``) as they are forwarded: each expanded in place,
        the stored items it covers hidden (still there for recall), foreign ones hidden where
        the proxy answers compaction. The store's items are not changed."""
        chain = await super()._previous_chain(value)
        assert self.route is not None  # routed first
        mode = compaction_mode(self.route, self.rt.config.upstreams[self.route.upstream])
        kinds = [kind_of(stored.message) for stored in chain]
        if "compaction" not in kinds:
            return chain
        out = list(chain)
        for i, stored in enumerate(chain):
            if kinds[i] != "compaction":
                continue
            if not is_own(stored.message):
                if mode == "proxy":
                    self.chain_hidden.add(i)
                continue
            payload = decode(str(stored.message["encrypted_content"]), "previous_response_id")
            out[i] = dataclasses.replace(stored, message=payload.message())
            at = covered_at([s.content_hash for s in chain[:i]], payload)
            if at is not None:
                self.chain_hidden |= {j for j in range(at) if not pinned([chain[j].message])}
            self.chain_previous = payload.state(i + 1)
        return out

    async def _input(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.route is not None  # routed first
        upstream = self.rt.config.upstreams[self.route.upstream]
        self.compaction_mode = compaction_mode(self.route, upstream)
        if self.asked.any and self.compaction_mode == "off":
            raise not_supported("input" if self.asked.trigger else "context_management")
        items = input_items(body)
        proxied = self.compaction_mode == "proxy"
        if proxied and self.asked.trigger and items and items[-1].get("type") == TRIGGER:
            items = items[:-1]
        if proxied and self.asked.managed:
            self.unforwarded = self.unforwarded | {"context_management"}
            self.rewritten = True
        self.expanded = expand(items, item_hash, keep_foreign=not proxied)
        self.rewritten = self.rewritten or self.expanded.changed
        items = self.expanded.items
        if proxied and self.asked.managed and not self.asked.trigger:
            threshold = self.asked.threshold
            if threshold is None:
                window = context_window(self.model or "")
                threshold = int(DEFAULT_SHARE * window) if window else None
            self.threshold = threshold
            if threshold is not None and not self.previewing:
                items = await self._past_threshold(body, items, threshold)
        if self.expanded.payloads and self.ref is not None and self.compaction is None:
            # The turns the newest item folded away, back from the store: never
            # forwarded (see _decided), but there for recall to reach.
            self.folded = await folded_turns(self.rt.store, self.ref, self.expanded.payloads[-1])
            items = [*self.folded, *items]
        return items

    async def _past_threshold(
        self, body: dict[str, Any], items: list[dict[str, Any]], threshold: int
    ) -> list[dict[str, Any]]:
        """Past ``threshold``: everything before the newest turn compacted first."""
        counter = ItemCounter(self.model or "")
        chain = sum(counter.count(s.message, s.content_hash) for s in self.chain)
        fresh = sum(counter.count(i, item_hash(i)) for i in items)
        self.measured = counter.fixed(body) + chain + fresh
        start = newest_turn(items)
        if self.measured <= threshold or (start == 0 and not self.chain):
            return items
        head, tail = items[:start], items[start:]
        self.compaction = await self._compact(head, len(self.chain))
        return [*map(dict, pinned(head)), self.compaction.payload.message(), *tail]

    async def _compact(self, items: list[dict[str, Any]], offset: int) -> Compaction:
        """The compaction of ``items`` (the conversation after the first ``offset`` ones)."""
        rt, route = self.rt, self.route
        assert route is not None and self.model is not None
        counter = ItemCounter(self.model)
        previous = self.expanded.previous if self.expanded is not None else None
        shift = offset + len(self.folded)
        if previous is not None and shift:
            previous = dataclasses.replace(previous, covers=previous.covers + shift)
        previous = previous or self.chain_previous
        spec = route.compaction_summarizer
        model = self.model

        def summarizer() -> Any:
            return build_summarizer(
                spec,
                model=model,
                upstream=route.upstream,
                upstream_configs=rt.config.upstreams,
                upstreams=rt.upstreams,
                client_headers=self.headers,
                count=lambda m: counter.count(m),
            )

        conversation: list[dict[str, Any]] = [*(dict(s.message) for s in self.chain), *items]
        return await compact(
            rt.summaries,
            CompactionInput(
                ref=self.ref,
                items=conversation,
                hashes=list(map(item_hash, conversation)),
                count=lambda m: counter.count(m),
                view=chat_view,
                summarizer_spec=spec,
                summarizer=summarizer,
                route=route.name,
                previous=previous
                if previous is not None and previous.covers <= len(conversation)
                else None,
            ),
        )

    async def _answer_trigger(self) -> Response:
        """Exactly one compaction item, as a Response object or a stream; stored as an exchange."""
        n = self.chain_len
        self.compaction = await self._compact(self.conversation[n:], n)
        counter = ItemCounter(self.model or "")
        used = usage(
            sum(
                counter.count(i, h)
                for i, h in zip(self.conversation, self.item_hashes, strict=True)
            ),
            counter.count({"role": "assistant", "content": self.compaction.payload.summary}),
        )
        answer = response_object(self.body, [self.compaction.item], used, self.previous_id)
        # Stored before the client gets a byte: it may continue the answer at once.
        await self._commit(answer)
        headers = self._headers()
        if not self.stream:
            out = Response(orjson.dumps(answer), media_type="application/json")
            out.headers.update(headers)
            return out
        events = stream_events(answer)

        async def body() -> Any:
            for event in events:
                yield event

        stream = StreamingResponse(body(), media_type="text/event-stream")
        stream.headers.update(headers)
        return stream

    def _decided(self, decision: Decision) -> Decision:
        """What a compaction stands for taken out of what is forwarded, as dropped by it."""
        hidden = self._hidden()
        if not hidden:
            return decision
        counter = ItemCounter(self.model or "")
        if len(decision.kept) == len(decision.messages):
            pairs = list(zip(decision.kept, decision.messages, strict=True))
            messages = [m for i, m in pairs if i not in hidden]
        else:  # a policy that adds messages of its own: the hidden ones by identity
            ids = {id(self.conversation[i]) for i in hidden}
            messages = [m for m in decision.messages if id(m) not in ids]
        out = [i for i in decision.kept if i in hidden]
        tokens = sum(counter.count(self.conversation[i], self.item_hashes[i]) for i in out)
        after = max(0, decision.tokens_after - tokens)
        extra = {**decision.extra, "compaction_folded": len(out)}
        spec = getattr(self.rt.config.policies.get(self.policy_name), "recall", None)
        limit = decision.budget
        if spec is not None and limit is not None and "recall_budget" not in extra:
            # It fit the budget whole, folded turns included: recall gets what is left of
            # it, at most its reserve, as when a policy drops turns itself.
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

    def _hidden(self) -> set[int]:
        """Positions never forwarded: the turns an item folded away (read back for recall),
        and a chain a threshold compaction summarized (but its system and developer messages)."""
        n = self.chain_len
        hidden = set(range(n, n + len(self.folded))) | self.chain_hidden
        if self.compaction is not None and not self.asked.trigger:
            hidden |= {i for i in range(n) if not pinned([self.conversation[i]])}
        return hidden

    @property
    def policy_name(self) -> str:
        return self.route.policy if self.route is not None else ""

    def _answered(self, content: bytes) -> bytes:
        content = super()._answered(content)
        if self.compaction is not None:
            return with_item_first(content, self.compaction.item)
        return content

    def _answering(self) -> LineRewrite | None:
        rewrite = super()._answering()
        if self.compaction is None:
            return rewrite
        first = CompactionFirst(self.compaction.item)
        return first if rewrite is None else _Chained(rewrite, first)

    def _headers(self) -> dict[str, str]:
        h = super()._headers()
        if self.compaction is not None:
            h["x-context-compaction"] = self.compaction.status
            if self.compaction.fallback is not None:
                h["x-context-compaction-fallback"] = self.compaction.fallback
        elif self.expanded is not None and self.expanded.expanded:
            h["x-context-compaction"] = "expanded"
        return h

    def _detail(self) -> dict[str, Any]:
        detail = super()._detail()
        shown: dict[str, Any] = {}
        if self.asked.any:
            shown["asked"] = "trigger" if self.asked.trigger else "threshold"
            shown["mode"] = self.compaction_mode
        if self.asked.managed:
            shown["threshold"] = self.threshold
            if self.measured is not None:
                shown["input_tokens"] = self.measured
        if self.compaction is not None:
            shown.update(self.compaction.detail())
        if self.expanded is not None:
            shown.update(self.expanded.detail())
        if self.folded:
            shown["restored"] = len(self.folded)
        if self.compaction is not None and self.chain and not self.asked.trigger:
            shown["chain_folded"] = len(self._hidden())
        if shown:
            detail["compaction"] = shown
        return detail


async def create_response(request: Request) -> Response:
    rt: Runtime = request.app.state.runtime
    # Pinned: a config reload mid-request must not change this request's route or policy.
    return await CompactingExchange(rt.pin(), request).run()

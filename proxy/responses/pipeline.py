"""POST /v1/responses: the Responses API through the proxy, chains served from our own store.

parse -> route -> previous chain -> session -> policy -> recall -> stateless
replay -> upstream -> relay (+ assemble) -> store. Recall works as for chat
(proxy/chat/recall_step.py: same headers, row, log line and metrics) over
the policy's item units: a call comes back with its output, reasoning with
its item, quoted in one user message right before the newest user message.
The chat pipeline's steps, over items instead of messages (``ChatExchange``
supplies the headers, the request row, the log line and the error handling).

``previous_response_id`` naming a response the proxy stored: the chain is
rebuilt from the store (earlier inputs and outputs, in order; not the
earlier ``instructions``, as in OpenAI's semantics), the route's policy runs
over it, and the upstream gets it as explicit ``input`` without
``previous_response_id``, so its own stored state is never relied on. An id
the proxy never saw is forwarded untouched (the upstream may hold it), its
answer relayed and recorded, but not stored as a chain: the proxy does not
have the context it continues. Another tenant's id is answered as unknown.

Sessions: the header (or its fallbacks) names one; a chained request without
one inherits its previous response's. A response with neither is filed under
a session of its own, ``resp:<id>``, which its followers inherit, so
``previous_response_id`` works for clients that never send a session header;
unless the client asked ``store: false``, in which case nothing but the
request row is kept (with a session header the session is kept regardless,
as for chat completions).

The chain is written before the client gets the end of the answer (the last
event of a stream), so a follow-up sent the moment it arrives finds it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from policies.items import ItemShape
from policies.types import Decision, NoneSpec
from proxy.chat.cache_step import cache_hints, measure_stable_prefix
from proxy.chat.pipeline import ChatExchange
from proxy.chat.recall_step import spec_recall
from proxy.context.rewriter import needs_window
from proxy.context.tokens import LONG_TEXT, counter_for
from proxy.errors import InvalidRequest, ProxyError, UpstreamError, upstream_failure
from proxy.http.body import error_response, forward_headers, parse_object, read_body, relay_headers
from proxy.http.session_lookup import find_session
from proxy.http.sessions import session_ref
from proxy.http.shape import check_responses
from proxy.responses.chain import previous_chain
from proxy.responses.items import (
    ItemCounter,
    chat_view,
    decide,
    input_items,
    item_hash,
    item_role,
)
from proxy.responses.previous_id import PutBackStream, put_back
from proxy.responses.replay import Replay, ids_of, replay
from proxy.responses.stream import LineRewrite, ResponseAssembler, response_from_body
from proxy.runtime import Runtime
from proxy.store.base import (
    ExchangeResult,
    MessageIn,
    RequestRecord,
    ResponseIn,
    SessionRef,
    Storable,
    StoredItem,
    StoredResponse,
)
from proxy.telemetry.logging import get_logger
from proxy.upstream.base import Upstream, UpstreamRequest, UpstreamResponse
from proxy.upstream.cache_hints import splice_field

log = get_logger()

# Responses worth chaining on; failed, cancelled and background (queued) ones are not.
STORED_STATUSES = frozenset({"completed", "incomplete"})


def previous_not_found(response_id: str) -> InvalidRequest:
    """OpenAI's answer to an unknown ``previous_response_id`` (a 400, not a 404)."""
    return InvalidRequest(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


class ResponsesExchange(ChatExchange):
    endpoint = "/v1/responses"
    # The path a route is matched on (another endpoint may be served by this one's route).
    route_path = "/v1/responses"

    def __init__(self, rt: Runtime, request: Request) -> None:
        super().__init__(rt, request)
        self.body: dict[str, Any] = {}
        self.previous_id: str | None = None
        self.previous: StoredResponse | None = None
        # How many leading items of the conversation came from the store.
        self.chain_len = 0
        self.chain: list[StoredItem] = []
        self.item_hashes: list[str] = []
        self.replay: Replay | None = None
        self.response_id: str | None = None
        # The input was rewritten before the policy (compaction items expanded).
        self.rewritten = False
        # A compaction is answered here: no policy or recall over its conversation.
        self.compacting = False
        # Body fields never forwarded (the chain goes as explicit input).
        self.unforwarded = frozenset({"previous_response_id"})

    @property
    def previous_unknown(self) -> bool:
        return self.previous_id is not None and self.previous is None

    # -- the pipeline ---------------------------------------------------------

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        self.body = parse_object(self.raw)
        await self.plan(self.body)
        return await self._send(self.body)

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        """Route, previous chain, session and the policy's decision (read-only)."""
        rt = self.rt
        check_responses(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string.", param="model")
        self.model = model
        self.stream = body.get("stream") is True
        self.route = rt.router.match(self.route_path, model, self.request.headers)
        found = find_session(rt.config.session, self.request.headers, body)
        self.key, self.session_source = found.key, found.source
        chain = await self._previous_chain(body.get("previous_response_id"))
        self.ref = session_ref(self.tenant, self.key) if self.may_store else None
        self.chain = chain
        items = await self._input(body)
        self.chain_len = len(chain)
        self.conversation = [stored.message for stored in chain] + items
        self.item_hashes = [stored.content_hash for stored in chain] + list(map(item_hash, items))
        if len(self.raw) >= LONG_TEXT:
            # Long texts are counted in a worker thread first: no stall for the others.
            await counter_for(model).precount(map(chat_view, self.conversation))
        # An unknown previous response: the upstream holds the context, the
        # input alone is not it, so there is nothing here to trim.
        unknown = self.previous_unknown or self.compacting
        spec = NoneSpec() if unknown else rt.config.policies[self.route.policy]
        upstream = self.route.upstream
        if needs_window(spec):
            await rt.windows.learn(upstream, model)  # once per model: a local server's n_ctx

        def calibration(name: str) -> float:
            return rt.calibration.factor(name, upstream)

        def window(name: str) -> int | None:
            return rt.windows.window(name, upstream)

        started = time.perf_counter()
        self.decision = decide(
            spec, self.conversation, self.item_hashes, body, model, calibration, window
        )
        self.decision = self._decided(self.decision)
        self.policy_s = time.perf_counter() - started
        self.stable_prefix = measure_stable_prefix(
            rt.prefixes, self.ref, self.decision, self.conversation, self.item_hashes, remember=lock
        )
        recall = spec_recall(spec)
        if recall is not None:
            # As for chat, after the prefix was measured: the block follows it.
            counter = ItemCounter(model)
            hashes = self.item_hashes
            self.decision, self.recall = await rt.recall.apply(
                policy=self.route.policy,
                spec=recall,
                budget=int(self.decision.extra.get("recall_budget", 0)),
                ref=self.ref,
                conversation=self.conversation,
                hashes=hashes,
                decision=self.decision,
                count=counter.count,
                sizes=[counter.count(m, h) for m, h in zip(self.conversation, hashes, strict=True)],
                shape=ItemShape(self.conversation),
            )
        return self.decision

    async def _input(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The request's input items, as the policy takes them (route and session known)."""
        return input_items(body)

    def _decided(self, decision: Decision) -> Decision:
        """The policy's decision as forwarded (before recall)."""
        return decision

    async def _previous_chain(self, value: object) -> list[StoredItem]:
        if value is None:
            return []
        if not isinstance(value, str) or not value:
            raise InvalidRequest(
                "'previous_response_id' must be a string.", param="previous_response_id"
            )
        self.previous_id = value
        store = self.rt.store
        self.previous = await store.get_response(self.tenant, value) if self.may_store else None
        if self.previous is None:
            if await store.response_exists(value):
                # Another tenant's: exactly as unknown to this key as a made-up id.
                raise previous_not_found(value)
            return []
        if self.key is None:
            self.key = self.previous.session_key
            self.session_source = "previous_response_id"
        return await previous_chain(store, self.previous)

    async def _send(self, body: dict[str, Any]) -> Response:
        rt = self.rt
        assert self.route is not None and self.decision is not None  # plan() ran
        config = rt.config.upstreams[self.route.upstream]
        forwarded, _ = self._forward(body)
        upstream: Upstream
        if config.responses == "bridge":
            from proxy.responses import bridge

            # litellm takes seconds to import: never on the event loop.
            await asyncio.to_thread(bridge.load)
            upstream = bridge.ResponsesBridge(config)
        else:
            upstream = rt.upstreams[self.route.upstream]
        sent = time.perf_counter()
        response = await upstream.send(
            UpstreamRequest(
                method="POST",
                path="/responses",
                headers=forward_headers(
                    self.request.headers.items(), config, rt.config.session.header
                ),
                body=forwarded,
                # The bridge's own parse: litellm may change what it is given, and
                # replayed items are the store's cached ones.
                json=orjson.loads(forwarded) if config.responses == "bridge" else None,
                stream=self.stream,
            )
        )
        self.upstream_ms = (time.perf_counter() - sent) * 1000
        return await self._relay(response)

    def _forward(self, body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The body to send, and its parsed form."""
        d = self.decision
        assert d is not None
        replayed = [i < self.chain_len for i in d.kept]
        block = self.recall.recalled.position if self.recall is not None else None
        if block is not None:
            replayed.insert(block, False)  # the recall block: the proxy's, sent as made
        known = ids_of(self.conversation[: self.chain_len]) if self.previous else {}
        self.replay = replay(d.messages, replayed, known)
        assert self.route is not None
        config = self.rt.config.upstreams[self.route.upstream]
        # A chain the upstream holds (an id the proxy never saw) is forwarded untouched.
        hinted = config.base_url is not None and not self.previous_unknown
        self.cache = cache_hints(config, self.ref, body, []) if hinted else None
        key = self.cache.prompt_cache_key if self.cache is not None else None
        unchanged = not d.changed and not self.replay.changed and not self.rewritten
        if self.previous is None and unchanged:
            # The client's bytes are sacred: nothing to rewrite, forward them as they
            # came (with the session's prompt_cache_key, the one documented addition).
            if key is None:
                return self.raw, body
            return splice_field(self.raw, "prompt_cache_key", key), {
                **body,
                "prompt_cache_key": key,
            }
        out = {k: v for k, v in body.items() if k not in self.unforwarded}
        out["input"] = self.replay.items
        if key is not None:
            out["prompt_cache_key"] = key
        return orjson.dumps(out), out

    async def _relay_whole(self, response: UpstreamResponse) -> Response:
        try:
            content = await response.read()
        except ProxyError as error:
            self._finish_failed(error.status, error, upstream_status=response.status)
            return error_response(error, self._headers())
        if response.status == 200:
            content = self._answered(content)
        answer = response_from_body(content) if response.status == 200 else None
        if answer is not None:
            self._adopt(answer)  # its session, for the headers
        # The headers first: nothing is recorded for an answer that could not be sent.
        out = Response(content, status_code=response.status)
        out.raw_headers = relay_headers(response.headers, self._headers())
        out.raw_headers.append((b"content-length", str(len(content)).encode()))
        if answer is not None:
            await self._commit(answer)
        else:
            invalid = upstream_failure(response.status, content)
            if response.status == 200:
                invalid = UpstreamError(
                    "The upstream's 200 answer is not a response object.",
                    code="upstream_invalid_response",
                )
            self._finish(response.status, None, upstream_status=response.status, error=invalid)
        return out

    def _relay_stream(self, response: UpstreamResponse) -> Response:
        assembler = ResponseAssembler()
        put_back = self._answering()

        async def relay() -> AsyncIterator[bytes]:
            error: ProxyError | None = None
            done = False
            self.rt.metrics.active_streams.inc()
            try:
                async for received in response.iter_chunks():
                    chunk = received if put_back is None else put_back.feed(received)
                    if put_back is not None and not chunk:
                        continue  # a line still arriving
                    assembler.feed(chunk)
                    if assembler.final is not None and not done:
                        done = True
                        # Stored before the client sees the end: it may chain on it at once.
                        await self._commit(assembler.final, release=False)
                    yield chunk
                rest = put_back.flush() if put_back is not None else b""
                if rest:  # a last line without its newline
                    assembler.feed(rest)
                    if assembler.final is not None and not done:
                        done = True
                        await self._commit(assembler.final, release=False)
                    yield rest
                if not done:
                    # Ended without response.completed: the client is told, not left to
                    # take what came as the whole answer (it is kept, marked incomplete).
                    error = UpstreamError(
                        "The upstream's stream ended without its terminal event"
                        " (response.completed): the answer may be cut short.",
                        code="upstream_stream_incomplete",
                    )
                    yield self._unfinished(error, assembler.failed_event(error.body()))
            except UpstreamError as exc:
                # Headers are gone already: tell the client in-stream, as OpenAI does.
                error = exc
                yield self._unfinished(exc, assembler.error_event(exc.body()))
            finally:
                self.rt.metrics.active_streams.dec()
                if not done:
                    # Cut short: what finished is kept, marked incomplete.
                    partial = assembler.partial()
                    if partial is not None:
                        self._spawn(self._commit(partial, incomplete=True, error=error))
                    else:
                        self._finish(200, None, upstream_status=200, incomplete=True, error=error)
                self.rt.release()  # the upstream is no longer needed
                self._spawn(response.close())

        out = StreamingResponse(relay(), status_code=200)
        out.raw_headers = relay_headers(response.headers, self._headers())
        return out

    def _answered(self, content: bytes) -> bytes:
        """The upstream's answer as the client gets it."""
        if self.previous is not None:
            return put_back(content, self.previous.id)  # sent as input: say it continued
        return content

    def _answering(self) -> LineRewrite | None:
        """What rewrites the upstream's stream for the client, line by line (None: nothing)."""
        # A chain sent as input: its events say which response it continued.
        return PutBackStream(self.previous.id) if self.previous is not None else None

    def _unfinished(self, error: ProxyError, event: bytes) -> bytes:
        """The in-stream event telling the client its stream did not end whole, counted."""
        route = self.route.name if self.route is not None else "none"
        self.rt.metrics.unfinished_streams.inc((route, error.code or error.type))
        return event

    # -- the record -------------------------------------------------------------

    def _adopt(self, answer: dict[str, Any]) -> bool:
        """Whether the answer's chain is stored; a session-less one is filed under
        ``resp:<id>`` (set before the headers are built, so X-Session-Id says so)."""
        response_id = answer.get("id")
        self.response_id = response_id if isinstance(response_id, str) else None
        storable = (
            self.response_id is not None
            and answer.get("status") in STORED_STATUSES
            and not self.previous_unknown
            and self.may_store
            and (self.key is not None or self.body.get("store") is not False)
        )
        if storable and self.key is None:
            self.key = f"resp:{self.response_id}"
            self.session_source = "response"
        return storable

    async def _commit(
        self,
        answer: dict[str, Any],
        *,
        incomplete: bool = False,
        error: ProxyError | None = None,
        release: bool = True,
    ) -> None:
        """Record an answer; store its chain when it is one to continue.

        ``release``: the upstream is done with (a stream releases at its end).
        """
        storable = self._adopt(answer)
        status = answer.get("status")
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        # An answer the proxy made itself (a compaction) had no upstream.
        upstream_status = 200 if self.upstream_ms is not None else None
        incomplete = incomplete or status == "incomplete"
        record = self._close(200, upstream_status, usage, incomplete, error, release)
        if isinstance(status, str):
            record.detail["response_status"] = status
        if not storable or self.response_id is None or self.key is None:
            self._spawn(self._write_row(record))
            return
        ref = SessionRef(self.tenant, self.key)
        counter = ItemCounter(self.model or "")
        outputs = [o for o in answer.get("output") or () if isinstance(o, dict)]
        await counter.counter.precount(map(chat_view, outputs))
        # The replayed chain as the items it is (stored already: nothing to count or
        # hash again), then the request's own input.
        n = self.chain_len
        conversation: list[Storable] = [*self.chain]
        conversation += (
            MessageIn(item, h, item_role(item), counter.count(item, h))
            for item, h in zip(self.conversation[n:], self.item_hashes[n:], strict=True)
        )
        state = "incomplete" if record.incomplete else "complete"
        output = []
        for item in answer.get("output") or ():
            if isinstance(item, dict):
                h = item_hash(item)
                output.append(MessageIn(item, h, item_role(item), counter.count(item, h), state))
        stored = ResponseIn(
            id=self.response_id,
            response=answer,
            status=str(status),
            model=self.model,
            previous_response_id=self.previous_id if self.previous else None,
        )
        started = time.perf_counter()
        try:
            result = await self.rt.store.record_response(ref, conversation, output, stored, record)
        except Exception as exc:
            # The boundary where a failed write is contained: the client still
            # gets the upstream's answer; only the chain is lost (and logged).
            log.error(
                "response_store_failed", request_id=self.id, response=stored.id, error=repr(exc)
            )
            return
        self.rt.metrics.store_seconds.observe(("write",), time.perf_counter() - started)
        self._embed_items(ref, conversation, output, result)

    def _embed_items(
        self,
        ref: SessionRef,
        conversation: list[Storable],
        output: list[MessageIn],
        result: ExchangeResult,
    ) -> None:
        """Stored: its new input and output items go to the embedder (background, batched)."""
        embeddings = self.rt.recall.embeddings
        if embeddings is None or self.recall is None or not self.recall.embed:
            return
        if len(result.output_ids) != len(output):
            return  # a store that did not say which ids the output got: lexical only
        # The output follows the input in the chain: one run of items, new ones last.
        embeddings.stored(
            ref,
            [*conversation, *output],
            None,
            ExchangeResult(
                result.session_id,
                [*result.item_ids, *result.output_ids],
                None,
                result.new_messages + len(output),
            ),
        )

    def _finish(
        self,
        status: int,
        reply: dict[str, Any] | None,
        *,
        usage: dict[str, Any] | None = None,
        upstream_status: int | None = None,
        incomplete: bool = False,
        error: ProxyError | None = None,
        failed: bool = False,
        upstream: UpstreamResponse | None = None,
    ) -> None:
        """An answer not stored as a chain (failures included): the request row only."""
        record = self._close(status, upstream_status, usage, incomplete, error)
        self._spawn(self._write_row(record, upstream))

    def _close(
        self,
        status: int,
        upstream_status: int | None,
        usage: dict[str, Any] | None,
        incomplete: bool,
        error: ProxyError | None,
        release: bool = True,
    ) -> RequestRecord:
        """The request row, logged and counted; the pinned runtime released."""
        total_ms = (time.perf_counter() - self.started) * 1000
        record = self._record(status, upstream_status, usage, incomplete, error, total_ms)
        record.detail.update(self._detail())
        self._log(record)
        self._observe(record)
        if release:
            self.rt.release()
        return record

    def _detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {}
        if self.response_id is not None:
            detail["response_id"] = self.response_id
        if self.previous_id is not None:
            detail["previous_response_id"] = self.previous_id
            detail["previous_response"] = "unknown" if self.previous_unknown else "stored"
        if self.replay is not None and self.replay.changed:
            detail["replay"] = {
                "reasoning_dropped": self.replay.reasoning_dropped,
                "ids_stripped": self.replay.ids_stripped,
                "references_resolved": self.replay.references_resolved,
            }
        return detail

    async def _write_row(
        self, record: RequestRecord, upstream: UpstreamResponse | None = None
    ) -> None:
        if upstream is not None:
            await upstream.close()
        if self.route is None or self.key is None or not self.may_store:
            return  # as for chat: unrouted and session-less requests are proxied, not stored
        await self.rt.store.record_exchange(SessionRef(self.tenant, self.key), [], None, record)

    def _spawn(self, coro: Any) -> None:
        self.rt.background.spawn(coro, name=f"store-{self.id}")


async def create_response(request: Request) -> Response:
    rt: Runtime = request.app.state.runtime
    # Pinned: a config reload mid-request must not change this request's route or policy.
    return await ResponsesExchange(rt.pin(), request).run()

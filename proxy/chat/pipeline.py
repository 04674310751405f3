"""POST /v1/chat/completions: the pipeline from the client's bytes to the stored exchange.

parse -> route -> session -> policy -> upstream -> relay (+ assemble) -> store.
The store write happens after the answer is relayed, in a task of its own, so
neither the client's latency nor a client disconnect affects what is recorded.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from policies.types import Decision, SummarizeSpec
from proxy.chat.cache_step import CacheHints, cache_hints, measure_stable_prefix
from proxy.chat.policy_step import choose_mode, mode_rule, summarize
from proxy.chat.recall_step import recall_headers, recall_log_fields, recall_step, spec_recall
from proxy.chat.stream import ChatReplyAssembler, reply_from_completion
from proxy.config.model import RouteConfig
from proxy.context.recall import RecallOutcome
from proxy.context.summaries import SummaryContext, SummaryOutcome
from proxy.context.tokens import LONG_TEXT, counter_for
from proxy.errors import InvalidRequest, ProxyError, UpstreamError
from proxy.http.asgi import respond
from proxy.http.body import error_response, forward_headers, parse_object, read_body, relay_headers
from proxy.http.client_keys import request_tenant
from proxy.http.sessions import (
    ANONYMOUS_TENANT,
    content_hash,
    header_value,
    session_key,
    session_ref,
)
from proxy.http.shape import (
    check_chat,
    check_chat_envelope,
    check_chat_history,
    check_chat_message,
    valid_reply,
)
from proxy.runtime import Runtime
from proxy.store.base import ExchangeResult, MessageIn, RequestRecord, SessionRef, StoredItem
from proxy.telemetry.cache_usage import cache_usage
from proxy.telemetry.logging import get_logger, log_line
from proxy.upstream.base import UpstreamRequest, UpstreamResponse
from proxy.upstream.cache_hints import splice_field

log = get_logger()

# Request ids: a random per-process prefix and a counter; unique without a
# syscall per request (uuid4 reads the OS's random source every time).
_ID_PREFIX = os.urandom(6).hex()
_ID_COUNTER = itertools.count(1)


def validate_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The body's shape (proxy/http/shape.py); its messages."""
    return check_chat(body)


class ChatExchange:
    """One request's journey; its fields are what the log line and the request row say."""

    endpoint = "/v1/chat/completions"

    def __init__(self, rt: Runtime, request: Request) -> None:
        self.rt = rt
        self.request = request
        self.id = f"{_ID_PREFIX}{next(_ID_COUNTER):010x}"
        self.started = time.perf_counter()
        # Decoded once: Starlette's Headers decodes and scans the raw list on every get.
        self.header_items = request.headers.items()
        # Lower-case names; the first of repeated headers wins, as with Headers.get.
        self.headers: dict[str, str] = dict(reversed(self.header_items))
        tenant = request_tenant(request.scope, self.headers, rt.config.session.anonymous_tenant)
        # No key and no anonymous tenant: proxied, nothing of it stored.
        self.may_store = tenant is not None
        self.tenant = tenant if tenant is not None else ANONYMOUS_TENANT
        self.route: RouteConfig | None = None
        self.ref: SessionRef | None = None
        self.key: str | None = None
        self.model: str | None = None
        self.stream = False
        self.conversation: list[dict[str, Any]] = []
        self.decision: Decision | None = None
        self.locked = False
        # The session lock's fencing token (shared stores check it; proxy/coordination/).
        self.fence: int | None = None
        self.upstream_ms: float | None = None
        self.policy_s: float | None = None
        self.raw = b""
        self.hashes: list[str] | None = None
        # The conversation as the store takes it (sessions only): hashes and token counts.
        self.stored: list[MessageIn] | None = None
        # The policy applied (a context mode may replace the route's), the mode,
        # and what became of the summary (summarize policies only).
        self.policy: str | None = None
        self.mode: str | None = None
        self.mode_rule: str | None = None
        self.summary: SummaryOutcome | None = None
        self.summary_ctx: SummaryContext | None = None
        # What recall did (policies with a ``recall:`` block only).
        self.recall: RecallOutcome | None = None
        # Leading forwarded messages the session's previous request forwarded too.
        self.stable_prefix: int | None = None
        # The prompt-cache hints sent upstream (prompt_cache_key, breakpoints).
        self.cache: CacheHints | None = None
        # What is left to do once the answer is sent (see ``sent``).
        self.after: Callable[[], object] | None = None

    # -- the pipeline ---------------------------------------------------------

    async def run(self) -> Response:
        try:
            return await self._run()
        except ProxyError as error:
            self._finish_failed(error.status, error)
            return error_response(error, self._headers())
        except BaseException:
            # Unexpected: the app's last-resort handler answers; never leave a session locked.
            self._unlock()
            self.rt.release()
            raise

    def sent(self) -> None:
        """The answer was sent (or its sending ended): record the exchange, if that waited."""
        after, self.after = self.after, None
        if after is not None:
            after()

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        body = parse_object(self.raw, deferred="messages")
        await self.plan(body)
        return await self._send(body)

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        """Everything before the upstream: route, session, stored history, the decision.

        The preview endpoint runs exactly this, with ``lock=False`` (read-only).
        """
        rt = self.rt
        messages = check_chat_envelope(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string.", param="model")
        self.model = model
        self.stream = body.get("stream") is True
        self.route = rt.router.match(self.endpoint, model, self.headers)
        self.key = session_key(rt.config.session, self.headers, body)
        self.ref = session_ref(self.tenant, self.key) if self.may_store else None
        server_history = self.route.history == "server" and self.ref is not None
        # What the session's message cache knows of a client-held history: a
        # message it holds is the JSON of one checked, hashed and counted before.
        lookup = (
            rt.messages.lookup(self.ref, messages)
            if self.ref is not None and not server_history
            else None
        )
        found = lookup.found if lookup is not None else None
        for i, message in enumerate(messages):
            if found is None or found[i] is None:
                check_chat_message(message, i)

        self.conversation = messages
        left_out: list[int] = []
        stored: list[StoredItem] = []
        if server_history and self.ref is not None:
            if lock:
                # Serialise the session: the next request must see this one's reply.
                self.fence = await rt.locks.acquire(self.ref)
                self.locked = True
            started = time.perf_counter()
            # Shared: the cached chain's own objects, only read here.
            stored = await rt.store.history(self.ref, shared=True)
            rt.metrics.store_seconds.observe(("history",), time.perf_counter() - started)
            left_out = check_chat_history(stored, self.ref.key)
            self.conversation = [item.message for item in stored] + messages

        counter = counter_for(model)
        if len(self.raw) >= LONG_TEXT or self.conversation is not messages:
            # Long texts are counted in a worker thread first: no stall for the others.
            # Messages the cache holds are counted already.
            todo = (
                self.conversation
                if found is None
                else [m for m, known in zip(messages, found, strict=True) if known is None]
            )
            if stored:
                todo = messages
            await counter.precount(todo)
        counts: list[int] | None = None
        if self.ref is not None:
            # Each message's identity in the store (and the token cache's key) and
            # its token count; what the session sent before is not done again.
            self.stored = rt.messages.messages(
                self.ref, self.conversation, counter, items=stored, lookup=lookup
            )
            self.hashes = [m.content_hash for m in self.stored]
            counts = [m.token_count or 0 for m in self.stored]
            if left_out:
                # Stored whole (self.stored), forwarded without the replies that were not one.
                skip = set(left_out)
                keep = [i for i in range(len(self.conversation)) if i not in skip]
                self.conversation = [self.conversation[i] for i in keep]
                self.hashes = [self.hashes[i] for i in keep]
                counts = [counts[i] for i in keep]
        else:
            # Nothing to store: only the counts (each message hashed for the count cache).
            counts = counter.count_all(self.conversation)
        choice = choose_mode(self.route, self.conversation, self.headers)
        self.policy, self.mode = choice.policy, choice.mode
        self.mode_rule = mode_rule(self.route, choice)
        spec = rt.rewriter.spec(self.policy)
        started = time.perf_counter()
        if isinstance(spec, SummarizeSpec):
            self.decision, self.summary, self.summary_ctx = await summarize(
                rt,
                spec,
                route=self.route,
                ref=self.ref,
                conversation=self.conversation,
                hashes=self.hashes,
                body=body,
                model=model,
                headers=self.headers,
                dry_run=not lock,
                counts=counts,
            )
        else:
            self.decision = rt.rewriter.decide(
                self.policy, self.conversation, body, model, self.hashes, counts=counts
            )
        waited = (self.summary.wait_ms or 0.0) / 1000 if self.summary else 0.0
        self.policy_s = time.perf_counter() - started - waited
        # Measured on the policy's list: a recall block goes after the stable prefix.
        self.stable_prefix = measure_stable_prefix(
            rt.prefixes, self.ref, self.decision, self.conversation, self.hashes, remember=lock
        )
        if spec_recall(spec) is not None:
            self.decision, self.recall = await recall_step(
                rt,
                self.policy,
                spec,
                self.ref,
                self.conversation,
                self.hashes,
                self.decision,
                model,
                sizes=counts,
            )
        return self.decision

    async def _send(self, body: dict[str, Any]) -> Response:
        rt = self.rt
        assert self.route is not None and self.decision is not None  # plan() ran
        upstream_config = rt.config.upstreams[self.route.upstream]
        self.cache = cache_hints(upstream_config, self.ref, body, self.decision.messages)
        forwarded = self._forward_body(body)
        upstream = rt.upstreams[self.route.upstream]
        sent = time.perf_counter()
        response = await upstream.send(
            UpstreamRequest(
                method="POST",
                path="/chat/completions",
                headers=forward_headers(
                    self.header_items, upstream_config, rt.config.session.header
                ),
                body=forwarded,
                json=None
                if upstream_config.base_url
                else {**body, "messages": self.cache.messages or self.decision.messages},
                stream=self.stream,
            )
        )
        self.upstream_ms = (time.perf_counter() - sent) * 1000
        return await self._relay(response)

    async def _relay(self, response: UpstreamResponse) -> Response:
        """Relay the answer: event by event when it streams, else whole (both APIs)."""
        is_sse = any(
            k.lower() == "content-type" and v.startswith("text/event-stream")
            for k, v in response.headers
        )
        if self.stream and response.status == 200 and is_sse:
            return self._relay_stream(response)
        return await self._relay_whole(response)

    def _forward_body(self, body: dict[str, Any]) -> bytes:
        assert self.decision is not None
        key = self.cache.prompt_cache_key if self.cache is not None else None
        if not self.decision.changed and self.conversation is body["messages"]:
            # The client's bytes are sacred: nothing changed, so forward them as they
            # came (with the session's prompt_cache_key, the one documented addition).
            return self.raw if key is None else splice_field(self.raw, "prompt_cache_key", key)
        out = {**body, "messages": self.decision.messages}
        if key is not None:
            out["prompt_cache_key"] = key
        return orjson.dumps(out)

    async def _relay_whole(self, response: UpstreamResponse) -> Response:
        try:
            content = await response.read()
        except ProxyError as error:
            self._finish_failed(error.status, error, upstream_status=response.status)
            return error_response(error, self._headers())
        reply: dict[str, Any] | None = None
        usage: dict[str, Any] | None = None
        invalid: UpstreamError | None = None
        if response.status == 200:
            reply, usage = reply_from_completion(content)
            if reply is None or not valid_reply(reply):
                # Relayed as it came, but not an answer: the user message is not
                # stored as if it had been answered; the row says why.
                reply = None
                invalid = UpstreamError(
                    "The upstream's 200 answer is not a chat completion.",
                    code="upstream_invalid_response",
                )
            elif "role" not in reply:
                reply["role"] = "assistant"
        if reply is not None and len(content) >= LONG_TEXT:
            await counter_for(self.model or "").precount([reply])
        # The headers first: nothing is recorded for an answer that could not be sent.
        out = Response(content, status_code=response.status)
        out.raw_headers = relay_headers(response.headers, self._headers())
        out.raw_headers.append((b"content-length", str(len(content)).encode()))
        finish = functools.partial(
            self._finish,
            response.status,
            reply,
            usage=usage,
            upstream_status=response.status,
            error=invalid,
            failed=invalid is not None,
        )
        if self._durable():
            # The next request replays this one: committed before the client has it.
            await self._committed(finish())
        else:
            # The row, the log line and the metrics once the answer is on its way: not
            # between the upstream's last byte and the client's (see ``sent``).
            self.after = finish
        return out

    def _relay_stream(self, response: UpstreamResponse) -> Response:
        assembler = ChatReplyAssembler()

        durable = self._durable()

        async def relay() -> AsyncIterator[bytes]:
            error: ProxyError | None = None
            finished = counted = False
            self.rt.metrics.active_streams.inc()
            try:
                async for chunk in response.iter_chunks():
                    assembler.feed(chunk)
                    if assembler.whole and not counted:
                        counted = True
                        if assembler.size >= LONG_TEXT:
                            await counter_for(self.model or "").precount([assembler.message()])
                        if durable:
                            # The chunk holding [DONE] waits for the commit: a reply
                            # the client saw complete is a reply stored.
                            finished = True
                            await self._committed(self._finish_stream(assembler, None, None))
                    yield chunk
            except UpstreamError as exc:
                # Headers are gone already: tell the client in-stream, as OpenAI does.
                error = exc
                yield b"data: " + exc.body_bytes() + b"\n\n"
            finally:
                self.rt.metrics.active_streams.dec()
                if finished:
                    self.rt.background.spawn(response.close(), name=f"close-{self.id}")
                else:
                    self._finish_stream(assembler, error, response)

        out = StreamingResponse(relay(), status_code=200)
        out.raw_headers = relay_headers(response.headers, self._headers())
        return out

    def _finish_stream(
        self,
        assembler: ChatReplyAssembler,
        error: ProxyError | None,
        upstream: UpstreamResponse | None,
    ) -> asyncio.Future[Any] | None:
        """Record a relayed stream: whole, cut short (stored, marked), or malformed (not)."""
        malformed = assembler.malformed > 0 and error is None
        if malformed:
            error = UpstreamError(
                f"The upstream's stream had {assembler.malformed} malformed event(s).",
                code="upstream_malformed_stream",
            )
        return self._finish(
            200,
            assembler.message() if assembler.chunks else None,
            usage=assembler.usage,
            upstream_status=200,
            incomplete=not assembler.whole,
            error=error,
            failed=malformed,
            upstream=upstream,
        )

    def _durable(self) -> bool:
        """Whether the exchange is committed before the last byte reaches the client.

        ``history: server``: the next request replays the stored reply, so a
        reply the client saw must survive a crash. Client-held history keeps
        the write off the response path (the client holds the reply).
        """
        return self.ref is not None and self.route is not None and self.route.history == "server"

    async def _committed(self, future: asyncio.Future[Any] | None) -> None:
        if future is None:
            return
        try:
            await asyncio.shield(future)
        except Exception as exc:
            # The answer still reaches the client; the failed write is logged.
            log.error("exchange_store_failed", request_id=self.id, error=repr(exc))

    # -- the record -------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        h = {"x-ctxproxy-request-id": self.id}
        if not self.may_store:
            h["x-context-store"] = "off-no-api-key"
        elif self.tenant == self.rt.config.session.anonymous_tenant:
            h["x-context-store"] = "anonymous-tenant"
        if self.key is not None:
            h["x-session-id"] = header_value(self.key)
        if self.route is not None:
            h["x-context-policy"] = self.policy or self.route.policy
        if self.mode is not None:
            h["x-context-mode"] = self.mode
        if self.mode_rule is not None:
            h["x-context-mode-rule"] = self.mode_rule
        if self.summary is not None:
            h["x-context-summary"] = self.summary.status
            if self.summary.fallback is not None:
                h["x-context-fallback"] = self.summary.fallback
        d = self.decision
        if d is not None:
            h["x-context-tokens-before"] = str(d.tokens_before)
            h["x-context-tokens-after"] = str(d.tokens_after)
            h["x-context-messages-dropped"] = str(len(d.dropped))
            h["x-context-turns-dropped"] = str(d.turns_dropped)
            if d.clipped:
                h["x-context-tool-outputs-clipped"] = str(len(d.clipped))
            if d.masked:
                h["x-context-tool-outputs-masked"] = str(len(d.masked))
            if d.reason:
                h["x-context-trim-reason"] = d.reason
        if self.recall is not None:
            h.update(recall_headers(self.recall))
        if self.stable_prefix is not None:
            h["x-context-stable-prefix"] = str(self.stable_prefix)
        return h

    def _finish_failed(
        self, status: int, error: ProxyError, upstream_status: int | None = None
    ) -> None:
        self._finish(status, None, upstream_status=upstream_status, error=error, failed=True)

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
    ) -> asyncio.Future[Any] | None:
        """Log, count and queue the write; the write's future when the store queued it."""
        total_ms = (time.perf_counter() - self.started) * 1000
        record = self._record(status, upstream_status, usage, incomplete, error, total_ms)
        self._log(record)
        self._observe(record)
        self.rt.release()
        if self.route is None or self.ref is None:
            # Unrouted requests belong nowhere; session-less ones are proxied, not stored.
            self._unlock()
            if upstream is not None:
                self.rt.background.spawn(upstream.close(), name=f"close-{self.id}")
            return None
        ok = not failed and upstream_status == 200
        conversation = self._stored_conversation() if ok else []
        reply_in: MessageIn | None = None
        if ok and reply is not None:
            key = content_hash(reply)
            reply_in = MessageIn(
                message=reply,
                content_hash=key,
                role="assistant",
                token_count=counter_for(self.model or "").count_message(reply, key),
                status="incomplete" if incomplete else "complete",
            )
        if reply_in is not None and not incomplete and self.summary_ctx is not None:
            # After the answer: the summary the next request will need, made now.
            self.rt.summaries.prefetch_after(
                self.summary_ctx, reply_in.message, reply_in.content_hash
            )
        if upstream is None:
            # The store queues the write now (SqliteStore: no task or coroutine
            # per request, only the write's future).
            future: asyncio.Future[ExchangeResult | None]
            if self._durable():
                # The client waits for this commit: a store may write it at once
                # (SQLite: no group-commit linger).
                future = asyncio.ensure_future(
                    self.rt.store.record_exchange(self.ref, conversation, reply_in, record)
                )
            else:
                future = self.rt.store.record_exchange_soon(
                    self.ref, conversation, reply_in, record
                )
            future.add_done_callback(functools.partial(self._written, time.perf_counter()))
            if self.recall is not None and self.recall.embed:
                future.add_done_callback(
                    functools.partial(self._embed, self.ref, conversation, reply_in)
                )
            self.rt.background.track(future, name=f"store-{self.id}")
            return future
        self.rt.background.spawn(
            self._write(self.ref, conversation, reply_in, record, upstream),
            name=f"store-{self.id}",
        )
        return None

    async def _write(
        self,
        ref: SessionRef | None,
        conversation: Sequence[MessageIn],
        reply: MessageIn | None,
        record: RequestRecord,
        upstream: UpstreamResponse | None,
    ) -> None:
        try:
            if upstream is not None:
                await upstream.close()
            started = time.perf_counter()
            result = await self.rt.store.record_exchange(ref, conversation, reply, record)
            self.rt.metrics.store_seconds.observe(("write",), time.perf_counter() - started)
            if ref is not None and self.recall is not None and self.recall.embed:
                embeddings = self.rt.recall.embeddings
                if embeddings is not None:
                    embeddings.stored(ref, conversation, reply, result)
        finally:
            self._unlock()

    def _embed(
        self,
        ref: SessionRef,
        conversation: Sequence[MessageIn],
        reply: MessageIn | None,
        future: asyncio.Future[Any],
    ) -> None:
        """Stored: its messages go to the embedder (in the background, batched)."""
        embeddings = self.rt.recall.embeddings
        if embeddings is not None and not future.cancelled() and future.exception() is None:
            embeddings.stored(ref, conversation, reply, future.result())

    def _written(self, started: float, future: asyncio.Future[Any]) -> None:
        """``_write``'s ending, for a write the store queued itself."""
        if not future.cancelled() and future.exception() is None:
            self.rt.metrics.store_seconds.observe(("write",), time.perf_counter() - started)
        self._unlock()

    def _unlock(self) -> None:
        if self.locked and self.ref is not None:
            self.locked = False
            self.rt.locks.release(self.ref)

    def _stored_conversation(self) -> list[MessageIn]:
        return self.stored if self.ref is not None and self.stored is not None else []

    def _record(
        self,
        status: int,
        upstream_status: int | None,
        usage: dict[str, Any] | None,
        incomplete: bool,
        error: ProxyError | None,
        total_ms: float,
    ) -> RequestRecord:
        d = self.decision
        record = RequestRecord(
            id=self.id,
            tenant=self.tenant,
            route=self.route.name if self.route else "",
            policy=self.policy or (self.route.policy if self.route else ""),
            mode=self.mode,
            model=self.model,
            stream=self.stream,
            status=status,
            upstream_status=upstream_status,
            session_key=self.key,
            endpoint=self.endpoint,
            messages_before=len(self.conversation),
            error=f"{error.code or error.type}: {error.message}" if error else None,
            incomplete=incomplete,
            upstream_ms=self.upstream_ms,
            total_ms=total_ms,
            usage=usage,
            created_at=time.time(),
            stable_prefix=self.stable_prefix,
        )
        cached = cache_usage(usage)
        record.upstream_prompt_tokens = cached.prompt_tokens
        record.cached_tokens = cached.cached_tokens
        record.cache_write_tokens = cached.cache_write_tokens
        if d is not None:
            record.messages_after = len(d.messages)
            record.tokens_before = d.tokens_before
            record.tokens_after = d.tokens_after
            record.turns_dropped = d.turns_dropped
            record.messages_dropped = len(d.dropped)
            record.dropped_indexes = list(d.dropped)
            record.reason = d.reason
            record.detail = {
                "budget": d.budget,
                "repaired": list(d.repaired),
                "clipped": [
                    {
                        "index": c.index,
                        "tokens_before": c.tokens_before,
                        "tokens_after": c.tokens_after,
                    }
                    for c in d.clipped
                ],
                **d.extra,
            }
            if d.masked:
                # Positions in the conversation as received, as for ``clipped``.
                record.detail["masked"] = [
                    {
                        "index": m.index,
                        "tokens_before": m.tokens_before,
                        "tokens_after": m.tokens_after,
                    }
                    for m in d.masked
                ]
        if self.summary is not None:
            record.detail.update(self.summary.detail(record.detail.get("summary")))
        if self.recall is not None:
            record.detail["recall"] = self.recall.detail()
        if self.cache is not None and self.cache.sent:
            record.detail["cache_hints"] = self.cache.detail()
        if self.fence is not None:
            record.detail["fence"] = self.fence
        return record

    def _observe(self, r: RequestRecord) -> None:
        """Metrics and token calibration: a few dict updates, no I/O."""
        metrics = self.rt.metrics
        fallback = r.detail.get("fallback")
        metrics.observe_request(
            route=r.route,
            policy=r.policy,
            status=r.status,
            total_ms=r.total_ms,
            upstream_ms=r.upstream_ms,
            tokens_before=r.tokens_before,
            tokens_after=r.tokens_after,
            fallback=fallback if isinstance(fallback, str) else None,
        )
        if self.policy_s is not None:
            metrics.policy_seconds.observe((r.policy,), self.policy_s)
        metrics.observe_cache(
            route=r.route,
            policy=r.policy,
            prompt_tokens=r.upstream_prompt_tokens,
            cached_tokens=r.cached_tokens,
            cache_write_tokens=r.cache_write_tokens,
        )
        if r.upstream_status == 200 and r.usage is not None:
            # What was forwarded (messages plus tools and priming) vs what was billed.
            self.rt.calibration.observe_usage(r.model, r.tokens_after, r.usage)

    def _log(self, r: RequestRecord) -> None:
        # A 5xx is the proxy's or the upstream's failure: warning, so alerts can key on level.
        log_line(
            "warning" if r.status >= 500 else "info",
            "request_completed",
            {
                "request_id": r.id,
                "session": r.session_key,
                "tenant": r.tenant,
                "route": r.route,
                "policy": r.policy,
                "mode": r.mode,
                "model": r.model,
                "stream": r.stream,
                "status": r.status,
                "upstream_status": r.upstream_status,
                "messages_before": r.messages_before,
                "messages_after": r.messages_after,
                "tokens_before": r.tokens_before,
                "tokens_after": r.tokens_after,
                "turns_dropped": r.turns_dropped,
                "messages_dropped": r.messages_dropped,
                "reason": r.reason,
                "summary_used": self.summary.status if self.summary else None,
                "fallback": r.detail.get("fallback"),
                **(recall_log_fields(self.recall) if self.recall is not None else {}),
                "incomplete": r.incomplete,
                "stable_prefix": r.stable_prefix,
                "upstream_prompt_tokens": r.upstream_prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "cache_write_tokens": r.cache_write_tokens,
                "error": r.error,
                "upstream_ms": round(r.upstream_ms, 2) if r.upstream_ms is not None else None,
                "total_ms": round(r.total_ms or 0.0, 2),
            },
        )


class ChatCompletions:
    """The endpoint, a raw ASGI app (Starlette mounts it as a route): the answer is sent
    without Starlette's Response machinery (proxy/http/asgi.py), then recorded."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt: Runtime = scope["app"].state.runtime
        # Pinned: a config reload mid-request must not change this request's route or policy.
        exchange = ChatExchange(rt.pin(), Request(scope, receive, send))
        response = await exchange.run()
        try:
            await respond(response, receive, send)
        finally:
            exchange.sent()


chat_completions = ChatCompletions()

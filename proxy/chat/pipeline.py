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
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from policies.types import Decision, SummarizeSpec
from proxy.chat.policy_step import choose_mode, summarize
from proxy.chat.recall_step import recall_headers, recall_log_fields, recall_step, spec_recall
from proxy.chat.stream import ChatReplyAssembler, reply_from_completion
from proxy.config.model import RouteConfig
from proxy.context.recall import RecallOutcome
from proxy.context.summaries import SummaryContext, SummaryOutcome
from proxy.context.tokens import counter_for
from proxy.errors import InvalidRequest, ProxyError, UpstreamError
from proxy.http.body import error_response, forward_headers, parse_object, read_body, relay_headers
from proxy.http.sessions import bearer_token, content_hash, session_key, session_ref, tenant_of
from proxy.runtime import Runtime
from proxy.store.base import MessageIn, RequestRecord, SessionRef
from proxy.telemetry.logging import get_logger
from proxy.upstream.base import UpstreamRequest, UpstreamResponse

log = get_logger()

# Request ids: a random per-process prefix and a counter; unique without a
# syscall per request (uuid4 reads the OS's random source every time).
_ID_PREFIX = os.urandom(6).hex()
_ID_COUNTER = itertools.count(1)

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def validate_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest(
            "'messages' is required.", param="messages", code="missing_required_parameter"
        )
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be an array.", param="messages", code="invalid_type")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"messages[{i}] must be an object.", param=f"messages[{i}]", code="invalid_type"
            )
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}; got {role!r}.",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
    return messages


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
        self.tenant = tenant_of(bearer_token(self.headers))
        self.route: RouteConfig | None = None
        self.ref: SessionRef | None = None
        self.key: str | None = None
        self.model: str | None = None
        self.stream = False
        self.conversation: list[dict[str, Any]] = []
        self.decision: Decision | None = None
        self.locked = False
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
        self.summary: SummaryOutcome | None = None
        self.summary_ctx: SummaryContext | None = None
        # What recall did (policies with a ``recall:`` block only).
        self.recall: RecallOutcome | None = None

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

    async def _run(self) -> Response:
        self.raw = await read_body(self.request, self.rt.config.server.max_body_bytes)
        body = parse_object(self.raw)
        await self.plan(body)
        return await self._send(body)

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        """Everything before the upstream: route, session, stored history, the decision.

        The preview endpoint runs exactly this, with ``lock=False`` (read-only).
        """
        rt = self.rt
        messages = validate_messages(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string.", param="model")
        self.model = model
        self.stream = body.get("stream") is True
        self.route = rt.router.match(self.endpoint, model, self.headers)
        self.key = session_key(rt.config.session, self.headers, body)
        self.ref = session_ref(self.tenant, self.key)

        self.conversation = messages
        if self.route.history == "server" and self.ref is not None:
            if lock:
                # Serialise the session: the next request must see this one's reply.
                await rt.locks.acquire(self.ref)
                self.locked = True
            started = time.perf_counter()
            stored = await rt.store.history(self.ref)
            rt.metrics.store_seconds.observe(("history",), time.perf_counter() - started)
            self.conversation = [item.message for item in stored] + messages

        counts: list[int] | None = None
        if self.ref is not None:
            # Each message's identity in the store (and the token cache's key) and
            # its token count; what the session sent before is not done again.
            self.stored = rt.messages.messages(self.ref, self.conversation, counter_for(model))
            self.hashes = [m.content_hash for m in self.stored]
            counts = [m.token_count or 0 for m in self.stored]
        choice = choose_mode(self.route, self.conversation, self.headers)
        self.policy, self.mode = choice.policy, choice.mode
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
            )
        else:
            self.decision = rt.rewriter.decide(
                self.policy, self.conversation, body, model, self.hashes, counts=counts
            )
        waited = (self.summary.wait_ms or 0.0) / 1000 if self.summary else 0.0
        self.policy_s = time.perf_counter() - started - waited
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
            )
        return self.decision

    async def _send(self, body: dict[str, Any]) -> Response:
        rt = self.rt
        assert self.route is not None and self.decision is not None  # plan() ran
        forwarded = self._forward_body(body)
        upstream_config = rt.config.upstreams[self.route.upstream]
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
                else {**body, "messages": self.decision.messages},
                stream=self.stream,
            )
        )
        self.upstream_ms = (time.perf_counter() - sent) * 1000
        is_sse = any(
            k.lower() == "content-type" and v.startswith("text/event-stream")
            for k, v in response.headers
        )
        if self.stream and response.status == 200 and is_sse:
            return self._relay_stream(response)
        return await self._relay_whole(response)

    def _forward_body(self, body: dict[str, Any]) -> bytes:
        assert self.decision is not None
        if not self.decision.changed and self.conversation is body["messages"]:
            # The client's bytes are sacred: nothing changed, so forward them as they came.
            return self.raw
        return orjson.dumps({**body, "messages": self.decision.messages})

    async def _relay_whole(self, response: UpstreamResponse) -> Response:
        try:
            content = await response.read()
        except ProxyError as error:
            self._finish_failed(error.status, error, upstream_status=response.status)
            return error_response(error, self._headers())
        reply: dict[str, Any] | None = None
        usage: dict[str, Any] | None = None
        if response.status == 200:
            reply, usage = reply_from_completion(content)
        self._finish(response.status, reply, usage=usage, upstream_status=response.status)
        out = Response(content, status_code=response.status)
        out.raw_headers = relay_headers(response.headers, self._headers())
        out.raw_headers.append((b"content-length", str(len(content)).encode()))
        return out

    def _relay_stream(self, response: UpstreamResponse) -> Response:
        assembler = ChatReplyAssembler()

        async def relay() -> AsyncIterator[bytes]:
            error: ProxyError | None = None
            self.rt.metrics.active_streams.inc()
            try:
                async for chunk in response.iter_chunks():
                    assembler.feed(chunk)
                    yield chunk
            except UpstreamError as exc:
                # Headers are gone already: tell the client in-stream, as OpenAI does.
                error = exc
                yield b"data: " + exc.body_bytes() + b"\n\n"
            finally:
                self.rt.metrics.active_streams.dec()
                self._finish(
                    200,
                    assembler.message() if assembler.chunks else None,
                    usage=assembler.usage,
                    upstream_status=200,
                    incomplete=not assembler.done,
                    error=error,
                    upstream=response,
                )

        out = StreamingResponse(relay(), status_code=200)
        out.raw_headers = relay_headers(response.headers, self._headers())
        return out

    # -- the record -------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        h = {"x-ctxproxy-request-id": self.id}
        if self.key is not None:
            h["x-session-id"] = self.key
        if self.route is not None:
            h["x-context-policy"] = self.policy or self.route.policy
        if self.mode is not None:
            h["x-context-mode"] = self.mode
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
            if d.reason:
                h["x-context-trim-reason"] = d.reason
        if self.recall is not None:
            h.update(recall_headers(self.recall))
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
    ) -> None:
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
            return
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
            future = self.rt.store.record_exchange_soon(self.ref, conversation, reply_in, record)
            future.add_done_callback(functools.partial(self._written, time.perf_counter()))
            self.rt.background.track(future, name=f"store-{self.id}")
            return
        self.rt.background.spawn(
            self._write(self.ref, conversation, reply_in, record, upstream),
            name=f"store-{self.id}",
        )

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
            await self.rt.store.record_exchange(ref, conversation, reply, record)
            self.rt.metrics.store_seconds.observe(("write",), time.perf_counter() - started)
        finally:
            self._unlock()

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
        )
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
        if self.summary is not None:
            record.detail.update(self.summary.detail(record.detail.get("summary")))
        if self.recall is not None:
            record.detail["recall"] = self.recall.detail()
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
        if r.upstream_status == 200 and r.usage is not None:
            # What was forwarded (messages plus tools and priming) vs what was billed.
            self.rt.calibration.observe_usage(r.model, r.tokens_after, r.usage)

    def _log(self, r: RequestRecord) -> None:
        log.info(
            "request_completed",
            request_id=r.id,
            session=r.session_key,
            tenant=r.tenant,
            route=r.route,
            policy=r.policy,
            mode=r.mode,
            model=r.model,
            stream=r.stream,
            status=r.status,
            upstream_status=r.upstream_status,
            messages_before=r.messages_before,
            messages_after=r.messages_after,
            tokens_before=r.tokens_before,
            tokens_after=r.tokens_after,
            turns_dropped=r.turns_dropped,
            messages_dropped=r.messages_dropped,
            reason=r.reason,
            summary_used=self.summary.status if self.summary else None,
            fallback=r.detail.get("fallback"),
            **(recall_log_fields(self.recall) if self.recall is not None else {}),
            incomplete=r.incomplete,
            error=r.error,
            upstream_ms=round(r.upstream_ms, 2) if r.upstream_ms is not None else None,
            total_ms=round(r.total_ms or 0.0, 2),
        )


async def chat_completions(request: Request) -> Response:
    rt: Runtime = request.app.state.runtime
    # Pinned: a config reload mid-request must not change this request's route or policy.
    return await ChatExchange(rt.pin(), request).run()

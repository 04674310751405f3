"""How a chat exchange ends: logged, counted, and its conversation and reply stored.

The store write happens after the answer is relayed (client-held history), or
before its last byte (``history: server``: see ``ExchangeState._durable``),
so neither the client's latency nor a client disconnect affects what is recorded.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from typing import Any

from proxy.chat.record import ExchangeRecord
from proxy.config.model import UpstreamConfig
from proxy.context.tokens import counter_for
from proxy.errors import ProxyError
from proxy.http.sessions import content_hash
from proxy.store.base import ExchangeResult, MessageIn, RequestRecord, SessionRef, Storable
from proxy.telemetry.logging import get_logger
from proxy.upstream.base import UpstreamResponse

log = get_logger()


class ExchangeFinish(ExchangeRecord):
    """The exchange's ending: its record queued for the store, the session unlocked."""

    async def _committed(self, future: asyncio.Future[Any] | None) -> None:
        if future is None:
            return
        try:
            await asyncio.shield(future)
        except Exception as exc:
            # The answer still reaches the client; the failed write is logged.
            log.error("exchange_store_failed", request_id=self.id, error=repr(exc))

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
        if self.stream and usage is None and reply is not None and record.status == 200:
            self._count_answer(reply, record.tokens_after)
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
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        record: RequestRecord,
        upstream: UpstreamResponse | None,
    ) -> None:
        try:
            if upstream is not None:
                await upstream.close()
            started = time.perf_counter()
            if self._durable():
                result = await self.rt.store.record_exchange(ref, conversation, reply, record)
            else:
                # A stream's ending, written after its answer as a whole answer's is:
                # it may share a commit (record_exchange has none linger, for a
                # client who waits; none does here).
                result = await self.rt.store.record_exchange_soon(ref, conversation, reply, record)
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
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        future: asyncio.Future[Any],
    ) -> None:
        """Stored: its messages go to the embedder (in the background, batched)."""
        embeddings = self.rt.recall.embeddings
        if embeddings is not None and not future.cancelled() and future.exception() is None:
            embeddings.stored(ref, conversation, reply, future.result())

    def _count_answer(self, reply: dict[str, Any], forwarded: int | None) -> None:
        """A stream without usage: its answer counted by the server, for calibration."""
        text = reply.get("content")
        if not isinstance(text, str) or self.route is None or not forwarded:
            return
        config = self.rt.config.upstreams[self.route.upstream]
        if config.base_url is None or not self.rt.server_tokens.may_count(config.name):
            return
        self.rt.background.spawn(
            self._calibrate(config, self.model or "", text, self.answered_as),
            name=f"count-{self.id}",
        )

    async def _calibrate(
        self, config: UpstreamConfig, model: str, text: str, answered_as: str | None
    ) -> None:
        said = await self.rt.server_tokens.count(config, model, text)
        if said is None:
            return
        counter = counter_for(model)
        local = counter.count_message({"role": "assistant", "content": text})
        local -= counter.count_message({"role": "assistant", "content": ""})
        calibration = self.rt.calibration
        calibration.observe(calibration.learn(config.name, model, answered_as), local, said)

    def _written(self, started: float, future: asyncio.Future[Any]) -> None:
        """``_write``'s ending, for a write the store queued itself."""
        if not future.cancelled() and future.exception() is None:
            self.rt.metrics.store_seconds.observe(("write",), time.perf_counter() - started)
        self._unlock()

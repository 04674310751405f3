"""Embedding stored messages in the background, off the request path.

After an exchange is stored, :meth:`Embeddings.stored` queues its new
messages (and any older message of the same conversation that a search found
without a vector: a session stored before embeddings were turned on gets
them as it is used). One drain task at a time takes up to :data:`BATCH`
messages, embeds them on a worker thread, and writes the vectors through the
store's vector index (proxy/store/vectors.py), session by session. Until
then a message is found lexically only.

The queue is bounded (:data:`MAX_PENDING`): past it messages are not queued
(counted, and found lexically). A failure (the model, the store) is logged
and counted, never raised: a request never waits on this, and shutdown
drains it (the drain task is the runtime's Background's).

The model loads on first need, on a worker thread (:meth:`Embeddings.start`);
until it has, requests search lexically (``semantic: loading``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.background import Background
from proxy.context.embedder import Embedder, Vectors, embedding_text, to_bytes
from proxy.context.semantic import VectorCache
from proxy.store.base import ExchangeResult, MessageIn, SessionRef, Storable
from proxy.store.search_text import search_text
from proxy.store.vectors import ItemVector, VectorIndex
from proxy.telemetry.logging import get_logger
from proxy.telemetry.metrics import Metrics

log = get_logger()

BATCH = 256
MAX_PENDING = 50_000
MAX_SCANNED = 10_000


@dataclass(frozen=True)
class _Job:
    ref: SessionRef
    item_id: int
    position: int
    content_hash: str
    text: str


class Embeddings:
    """The embedder, the vector index and the cache, for the recall step and the writes."""

    def __init__(
        self,
        embedder: Embedder,
        index: VectorIndex,
        background: Background,
        metrics: Metrics,
        cache: VectorCache | None = None,
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.cache = cache if cache is not None else VectorCache(index, embedder.dim)
        self._background = background
        self._metrics = metrics
        self._queue: deque[_Job] = deque()
        self._queued: set[int] = set()
        # Sessions whose older messages were looked over once (see ``stored``).
        self._scanned: OrderedDict[SessionRef, None] = OrderedDict()
        self._draining = False
        self._loading: asyncio.Task[None] | None = None
        self.load_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.embedder.loaded

    def start(self) -> None:
        """Load the model on a worker thread, once (a no-op when loaded or loading)."""
        if self._loading is None and not self.embedder.loaded:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no event loop here (a reload outside one): the first request
                return
            self._loading = self._background.spawn(self._load(), name="embedder-load")

    async def _load(self) -> None:
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.embedder.load)
        except Exception as exc:  # semantic recall is then off; lexical recall goes on
            self.load_error = f"{type(exc).__name__}: {exc}"[:300]
            log.error("embedder_load_failed", embedder=self.embedder.name, error=self.load_error)
            return
        log.info(
            "embedder_loaded",
            embedder=self.embedder.name,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )

    def query(self, text: str) -> Vectors | None:
        """The query's vector (inline: one short text), or None for a text without words."""
        words = embedding_text(text, max_words=64)
        if not words:
            return None
        vector: Vectors = self.embedder.embed([words])[0]
        return vector if float(vector @ vector) > 0 else None

    def stored(
        self,
        ref: SessionRef,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        result: ExchangeResult | None,
    ) -> None:
        """Queue the exchange's messages that have no vector yet (called once it is stored)."""
        if result is None:
            return
        items = list(conversation) + ([reply] if reply is not None else [])
        ids = list(result.item_ids) + ([result.reply_id] if result.reply_id is not None else [])
        # The new ones; and the first time a session is seen here with its
        # vectors cached and fewer than its messages, the older ones lacking one
        # (a session stored before embeddings were on): scanned once per session.
        first = len(result.item_ids) - result.new_messages
        cached = self.cache.peek(ref)
        if cached is not None and ref not in self._scanned and cached.count < len(ids):
            todo = [i for i in range(len(ids)) if ids[i] not in cached.ids]
            self._scanned[ref] = None
            if len(self._scanned) > MAX_SCANNED:
                self._scanned.popitem(last=False)
        else:
            todo = list(range(max(0, first), len(ids)))
        added = 0
        for i in todo:
            item_id = ids[i]
            if item_id in self._queued:
                continue
            if len(self._queue) >= MAX_PENDING:
                self._metrics.embeddings.inc(("dropped",), len(todo) - added)
                break
            if items[i].role in ("system", "developer"):
                continue  # always forwarded: never recalled, so never searched
            text = embedding_text(search_text(items[i].message))
            if not text:
                continue
            self._queue.append(_Job(ref, item_id, i, items[i].content_hash, text))
            self._queued.add(item_id)
            added += 1
        if self._queue and not self._draining:
            self._draining = True
            self._background.spawn(self._drain(), name="embed")

    async def _drain(self) -> None:
        try:
            while self._queue:
                if not self.embedder.loaded:
                    self.start()
                    if self._loading is not None:
                        await asyncio.shield(self._loading)
                    if not self.embedder.loaded:
                        self._metrics.embeddings.inc(("failed",), len(self._queue))
                        self._queue.clear()
                        self._queued.clear()
                        return
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                await self._embed(batch)
        finally:
            self._draining = False

    async def _embed(self, batch: list[_Job]) -> None:
        started = time.perf_counter()
        try:
            vectors = await asyncio.to_thread(self.embedder.embed, [j.text for j in batch])
            by_session: dict[SessionRef, list[ItemVector]] = {}
            for job, vector in zip(batch, vectors, strict=True):
                by_session.setdefault(job.ref, []).append(
                    ItemVector(job.item_id, job.position, job.content_hash, to_bytes(vector))
                )
            for ref, rows in by_session.items():
                await self.index.put_vectors(ref, rows)
        except Exception as exc:  # found lexically meanwhile; a later exchange may queue them again
            log.warning("embedding_failed", messages=len(batch), error=repr(exc)[:300])
            self._metrics.embeddings.inc(("failed",), len(batch))
        else:
            self._metrics.embeddings.inc(("stored",), len(batch))
            self._metrics.embedding_seconds.observe((), time.perf_counter() - started)
        finally:
            for job in batch:
                self._queued.discard(job.item_id)

    async def idle(self) -> None:
        """Wait until everything queued is embedded and stored (tests, benches)."""
        while self._queue or self._draining:
            await asyncio.sleep(0.005)

"""Semantic recall (``embeddings: wordllama``) on LoCoMo: evidence kept, the fusion weight, cost.

Run by bench/recall.py (``python bench/recall.py --only embeddings``; ``--quick``: 200
questions). The conversations are stored as for the lexical rows, then
embedded by the proxy's own background service (proxy/context/embeddings.py:
batches on a worker thread, vectors into SQLite), which gives the throughput
in ms per message. Then, at 10% and 25% of each history's tokens with
``recall: {share: 0.8}``:

- the weight sweep: fused score ``w * cos + (1 - w) * bm25`` (each scaled
  by its best) for each ``w`` of :data:`WEIGHTS`; ``w = 0`` keeps lexical
  order and only appends semantic hits after the lexical ones; then the
  default weight at the shares of :data:`MORE_SHARES`;
- the time the semantic step adds per request at 100, 1,000 and 5,000
  stored turns: the query's embedding, the vector cache's read (only what is
  new: none here), the cosine over the session's rows and the fusion.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from bench.recall_store import NEIGHBORS, ask, message_in, recall_at, record, session_of, window
from policies.types import SEMANTIC_WEIGHT, RecallSpec
from proxy.background import Background
from proxy.context.embedder import Embedder, WordLlamaEmbedder
from proxy.context.embeddings import Embeddings
from proxy.context.recall import RecallService
from proxy.store.base import SessionRef
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_search import SqliteRecallIndex
from proxy.store.sqlite_vectors import SqliteVectorIndex
from proxy.telemetry.metrics import Metrics

WEIGHTS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
SHARE = 0.8
MORE_SHARES = (0.9,)


def services(
    store: SqliteStore, embedder: Embedder | None = None
) -> tuple[RecallService, Embeddings]:
    """Recall with semantic search on ``store``; ``embedder``: wordllama unless given."""
    embeddings = Embeddings(
        embedder or WordLlamaEmbedder(),
        SqliteVectorIndex(store.fetch, store.write),
        Background(),
        Metrics(),
    )
    return RecallService(SqliteRecallIndex(store.fetch), Metrics(), embeddings), embeddings


async def embed_stored(
    embeddings: Embeddings, store: SqliteStore, refs: list[SessionRef], stored: list[Any]
) -> tuple[int, float]:
    """Embed stored sessions through the background service: (messages, ms per message)."""
    await asyncio.to_thread(embeddings.embedder.load)
    started = time.perf_counter()
    n = 0
    for ref, conv in zip(refs, stored, strict=True):
        ids = [item.id for item in await store.history(ref)]
        from proxy.store.base import ExchangeResult

        result = ExchangeResult(0, ids[: len(conv)], None, len(conv))
        embeddings.stored(ref, conv, None, result)
        n += sum(1 for m in conv if m.role not in ("system", "developer"))
    await embeddings.idle()
    return n, (time.perf_counter() - started) * 1000 / max(1, n)


async def sweep(
    bench: Any, store: SqliteStore, stored: list[Any], questions: list[Any]
) -> dict[str, dict[int, Any]]:
    """Evidence kept with embeddings at each fusion weight (the conversations are stored)."""
    service, embeddings = services(store)
    refs = [SessionRef("bench", f"conv-{k}") for k in range(len(stored))]
    n, per = await embed_stored(embeddings, store, refs, stored)
    print(f"\n(embedded {n} stored messages in the background: {per:.3f} ms per message)")
    rows: dict[str, dict[int, Any]] = {}
    for q in questions:
        a = bench.ask(stored[q.conversation], q)
        for fraction in bench.FRACTIONS:
            limit = int(fraction * a.total)
            label = f"{int(fraction * 100)}%"
            runs = [(SHARE, w) for w in WEIGHTS] + [(s, SEMANTIC_WEIGHT) for s in MORE_SHARES]
            for share, w in runs:
                spec = RecallSpec(
                    share=share,
                    neighbors=NEIGHBORS,
                    embeddings="wordllama",
                    semantic_weight=w,
                )
                base, decision, outcome = await bench.recall_at(service, spec, limit, a)
                assert outcome.semantic == "used", outcome.semantic
                ok = bench.retained(base, outcome.recalled.spans, q.evidence)
                name = f"embed w{w}" if share == SHARE else f"embed w{w} s{share}"
                bench._add(rows, f"{name} {label}", q, ok, decision)
    return rows


async def latency(
    bench: Any, store: SqliteStore, conversations: list[Any], questions: list[Any], rounds: int
) -> list[tuple[int, float, float, float, float, float, float]]:
    """Per request: the semantic step alone (p50/p99) and the whole recall step with it."""
    service, embeddings = services(store)
    out = []
    for turns in (100, 1000, 5000):
        ref = SessionRef("bench", f"semantic-latency-{turns}")
        stored = [message_in(m) for m in session_of(conversations, turns)]
        await store.record_exchange(ref, stored, None, record(f"sl{turns}"))
        await embed_stored(embeddings, store, [ref], [stored])
        spec = RecallSpec(share=0.7, neighbors=NEIGHBORS, embeddings="wordllama")
        semantic: list[float] = []
        whole: list[float] = []
        cpu: list[float] = []
        for r in range(rounds + 20):
            a = ask(stored, questions[r % len(questions)])
            windows = window(a, spec, 4000)
            cpu_started = time.process_time()
            _, _, outcome = await recall_at(service, spec, 4000, a, windows, ref)
            if r >= 20:  # warm-up excluded (the first read loads the session's vectors)
                semantic.append(outcome.semantic_ms)
                whole.append(outcome.ms)
                cpu.append((time.process_time() - cpu_started) * 1000)
        semantic.sort()
        whole.sort()

        def p99(xs: list[float]) -> float:
            return xs[min(len(xs) - 1, int(len(xs) * 0.99))]

        out.append(
            (
                turns,
                semantic[len(semantic) // 2],
                p99(semantic),
                statistics.mean(semantic),
                whole[len(whole) // 2],
                p99(whole),
                p99(sorted(cpu)),
            )
        )
    return out


def print_latency(rows: list[tuple[int, float, float, float, float, float, float]]) -> None:
    print("\n== time the semantic step adds per request (share 0.7 of a 4000-token trim budget)")
    print(
        f"{'stored turns':>13} {'sem p50':>8} {'sem p99':>8} {'sem mean':>8}"
        f" {'recall p50':>10} {'recall p99':>10} {'cpu p99':>8}"
    )
    for turns, p50, p99, mean, w50, w99, c99 in rows:
        print(f"{turns:13} {p50:8.3f} {p99:8.3f} {mean:8.3f} {w50:10.3f} {w99:10.3f} {c99:8.3f}")
    print(
        "(ms, wall clock; sem: embed the query, read new vectors, cosine, fuse; recall: the whole"
        f" step with it; cpu: its process CPU time; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )

"""Stored messages are embedded in the background (proxy/context/embeddings.py)."""

from __future__ import annotations

from proxy.background import Background
from proxy.context.embeddings import Embeddings
from proxy.store.base import MessageIn
from proxy.store.memory import MemoryStore
from proxy.telemetry.metrics import Metrics
from tests.fakes.embedder import FakeEmbedder
from tests.stores import ALICE, msg, req


def service(store: MemoryStore, embedder: FakeEmbedder) -> tuple[Embeddings, Background, Metrics]:
    background, metrics = Background(), Metrics()
    return Embeddings(embedder, store, background, metrics), background, metrics


async def exchange(
    store: MemoryStore, e: Embeddings, conversation: list[MessageIn], reply: MessageIn
):
    result = await store.record_exchange(ALICE, conversation, reply, req())
    e.stored(ALICE, conversation, reply, result)
    return result


async def test_an_exchange_s_new_messages_and_reply_get_vectors_once_stored_in_batches():
    store, embedder = MemoryStore(), FakeEmbedder()
    e, background, metrics = service(store, embedder)
    first = [msg("user", "where is my parcel"), msg("assistant", "shipped yesterday")]
    await exchange(store, e, first[:1], first[1])
    await background.drain()
    second = [*first, msg("user", "send it home")]
    result = await exchange(store, e, second, msg("assistant", "delivered tomorrow"))
    await background.drain()
    got = await store.vectors(ALICE)
    assert [r.position for r in got.rows] == [0, 1, 2, 3]
    assert [r.item_id for r in got.rows][2:] == [result.item_ids[2], result.reply_id]
    # Only what was new each time, content words only, one batch per drain.
    assert embedder.calls == [
        ["parcel", "shipped yesterday"],
        ["send home", "delivered tomorrow"],
    ]
    assert metrics.embeddings.value(("stored",)) == 4


async def test_a_session_stored_before_embeddings_gets_its_older_messages_once_searched():
    store, embedder = MemoryStore(), FakeEmbedder()
    e, background, _ = service(store, embedder)
    old = [msg("user", f"old message {i}") for i in range(5)]
    await store.record_exchange(ALICE, old, None, req())
    await e.cache.get(ALICE)  # a search: the session is cached, with no vectors
    await exchange(store, e, [*old, msg("user", "new one")], msg("assistant", "reply"))
    await background.drain()
    assert [r.position for r in (await store.vectors(ALICE)).rows] == list(range(7))


async def test_a_failing_model_is_counted_and_never_raises():
    store = MemoryStore()
    e, background, metrics = service(store, FakeEmbedder(fail=True))
    await exchange(store, e, [msg("user", "hello friend")], msg("assistant", "good evening"))
    await background.drain()
    assert (await store.vectors(ALICE)).rows == []
    assert metrics.embeddings.value(("failed",)) == 2

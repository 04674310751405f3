"""Every store keeps a request's prompt-cache figures and stable prefix as queryable fields."""

from __future__ import annotations

from tests.stores import ALICE, msg, req


async def test_cache_figures_round_trip(store):
    record = req(
        upstream_prompt_tokens=2048, cached_tokens=1920, cache_write_tokens=64, stable_prefix=7
    )
    await store.record_exchange(ALICE, [msg("user", "hi")], msg("assistant", "yo"), record)
    row = await store.request(record.id)
    assert row is not None
    assert (row["upstream_prompt_tokens"], row["cached_tokens"]) == (2048, 1920)
    assert (row["cache_write_tokens"], row["stable_prefix"]) == (64, 7)
    (listed,) = await store.requests(ALICE)
    assert listed["cached_tokens"] == 1920


async def test_unreported_figures_stay_null(store):
    record = req()
    await store.record_exchange(ALICE, [msg("user", "hi")], None, record)
    row = await store.request(record.id)
    assert row is not None
    assert [
        row[k]
        for k in ("upstream_prompt_tokens", "cached_tokens", "cache_write_tokens", "stable_prefix")
    ] == [None] * 4

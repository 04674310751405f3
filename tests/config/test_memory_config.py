"""The top-level `cache:` block: one byte budget for the in-memory caches, shared out."""

from __future__ import annotations

import pytest

from proxy.config.loader import parse_config
from proxy.config.model import DEFAULT_CACHE_BYTES
from proxy.errors import ConfigError
from proxy.runtime import Runtime
from proxy.store.base import CacheBudget
from proxy.store.memory import MemoryStore


def config(cache: object = None) -> dict[str, object]:
    out: dict[str, object] = {
        "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"upstream": "u"}],
    }
    if cache is not None:
        out["cache"] = cache
    return out


def test_the_default_budget_is_1_gib():
    assert parse_config(config()).cache.max_bytes == DEFAULT_CACHE_BYTES == 2**30


@pytest.mark.parametrize(
    ("value", "size"),
    [("256MiB", 256 * 2**20), ("1GB", 10**9), ("1.5GiB", 3 * 2**29), (50_000_000, 50_000_000)],
)
def test_sizes_take_a_unit_or_a_number_of_bytes(value, size):
    assert parse_config(config({"max_bytes": value})).cache.max_bytes == size


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({"max_bytes": "lots"}, "cache.max_bytes: must be a size like 256MiB"),
        ({"max_bytes": 1000}, "cache.max_bytes: must be at least 1048576 bytes"),
        ({"max_entries": 5}, "cache.max_entries: unknown key"),
    ],
)
def test_bad_values_name_the_path(cache, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(config(cache))


def test_the_runtime_shares_the_budget_out_to_its_caches():
    parsed = parse_config(config({"max_bytes": "64MiB"}))
    rt = Runtime(parsed, MemoryStore(), {})
    budget = CacheBudget(64 * 2**20)
    assert rt.messages.max_bytes == budget.messages
    assert rt.recall.memo.max_bytes == budget.recall_memo
    assert rt.summaries.memo.max_bytes == budget.plan_memo
    assert rt.summaries.chains is not None
    assert rt.summaries.chains.max_bytes == budget.path_hashes
    shares = (
        budget.messages,
        budget.histories,
        budget.counts,
        budget.chains,
        budget.prefixes,
        budget.recall_memo,
        budget.plan_memo,
        budget.path_hashes,
    )
    assert sum(shares) <= budget.max_bytes

"""SizedLRU: bounded by entries and bytes; with admission, a loop over more keys than fit still hits."""

from __future__ import annotations

import gc
import tracemalloc

from proxy.store.sized import USE_BYTES, SizedLRU, Uses

MB = 2**20


def loop_hits(cache: SizedLRU[str, int], keys: list[str], passes: int) -> int:
    """Hits over ``passes`` cycles through ``keys``, each miss put back (a request's pattern)."""
    hits = 0
    for _ in range(passes):
        for key in keys:
            if cache.get(key) is not None:
                hits += 1
            cache.put(key, 1, MB)
    return hits


def test_a_plain_lru_gets_no_hit_on_a_loop_larger_than_it():
    cache: SizedLRU[str, int] = SizedLRU(1024, 10 * MB)
    assert loop_hits(cache, [f"s{i}" for i in range(16)], 5) == 0


def test_with_admission_a_loop_larger_than_the_cache_keeps_hitting_on_what_fits():
    cache: SizedLRU[str, int] = SizedLRU(1024, 11 * MB, admission=True)
    keys = [f"s{i}" for i in range(16)]
    hits = loop_hits(cache, keys, 6)
    # Ten sessions of a megabyte fit (less the uses' reserve); from the third
    # pass on, those ten hit on every pass.
    assert len(cache) == 10
    assert hits >= 10 * 4
    assert cache.size <= 11 * MB


def test_a_hot_key_is_not_displaced_by_a_loop_and_a_growing_entry_passes_it_over():
    cache: SizedLRU[str, int] = SizedLRU(1024, 5 * MB, admission=True)
    keys = [f"s{i}" for i in range(8)]
    for _ in range(3):  # one session in use all along, eight agents in turn in between
        for _ in range(3):
            assert cache.get("hot") is not None or cache.put("hot", 1, MB)
        loop_hits(cache, keys, 1)
    assert cache.peek("hot") is not None
    # An entry of the loop grows past the budget: a colder one goes, not "hot".
    held = [k for k in keys if cache.peek(k) is not None]
    cache.get(held[-1])
    cache.put(held[-1], 2, 2 * MB)
    assert cache.peek("hot") is not None and cache.peek(held[-1]) == 2
    assert cache.size <= 5 * MB


def test_one_off_keys_are_evicted_least_recently_used_first_as_without_admission():
    cache: SizedLRU[str, int] = SizedLRU(1024, 5 * MB, admission=True)
    for i in range(8):
        cache.get(f"k{i}")
        cache.put(f"k{i}", i, MB)
    held = [k for k in (f"k{i}" for i in range(8)) if cache.peek(k) is not None]
    assert held == [f"k{i}" for i in range(4, 8)]


def test_sessions_that_ended_give_way_once_idle_past_twice_their_rhythm():
    """No wait for the uses to be halved: a session used every 4 uses that has not
    been for 8 has stopped, and a new one takes its place."""
    cache: SizedLRU[str, int] = SizedLRU(1024, 5 * MB, admission=True)
    old = [f"old{i}" for i in range(4)]
    loop_hits(cache, old, 6)  # used often, then never again
    new = [f"new{i}" for i in range(4)]
    loop_hits(cache, new, 3)
    assert all(cache.peek(k) is None for k in old)
    assert loop_hits(cache, new, 1) == 4


def test_uses_are_bounded_and_their_bytes_come_off_the_budget():
    cache: SizedLRU[str, int] = SizedLRU(64, 4 * MB, admission=True)
    assert cache._uses is not None and cache._uses.max_keys == 128
    for i in range(1000):
        cache.get(f"k{i}")
        cache.put(f"k{i}", i, 1000)
    assert len(cache._uses) <= 128
    assert cache.size <= 4 * MB
    assert (
        cache.size == sum(size for _, size in cache._data.values()) + len(cache._uses) * USE_BYTES
    )


def test_a_cache_too_small_to_track_uses_is_a_plain_lru():
    cache: SizedLRU[str, int] = SizedLRU(1024, 3_000, admission=True)
    assert cache._uses is not None and cache._uses.max_keys == 0
    for i in range(3):
        cache.get(f"k{i}")
        cache.put(f"k{i}", i, 1_000)
    cache.get("k3")
    assert cache.put("k3", 3, 1_000)
    assert cache.peek("k0") is None and len(cache) == 3


def test_uses_saturate_and_halve_and_know_each_keys_reuse_distance():
    uses: Uses[str] = Uses(100)
    for _ in range(40):
        uses.add("a")
    uses.add("b")
    assert uses.get("a") == 15 and uses.get("b") == 1
    assert uses.gap("a") == 1 and uses.gap("b") == 0  # b: seen once
    assert uses.idle("a") == 1 and uses.idle("b") == 0 and uses.idle("c") is None
    uses.add("a")
    assert uses.gap("a") == 2
    uses.age()
    assert uses.get("a") == 7 and uses.get("b") == 0 and len(uses) == 1


def test_what_tracking_uses_holds_is_within_its_estimate():
    """Keys of sessions not held: their strings are the uses' alone (tracemalloc)."""
    uses: Uses[tuple[str, str]] = Uses(100_000)
    tenant = "t" * 32
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            uses.add((tenant, f"{i:08d}" + "k" * 56))  # a 64-character session key
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= len(uses) * USE_BYTES, (held / len(uses), USE_BYTES)

"""Reading the upstream's own prompt-cache figures from every usage shape it sends."""

from __future__ import annotations

from proxy.telemetry.cache_usage import CacheUsage, cache_usage, estimate_cached, hit_ratio


def test_chat_completions_cached_tokens():
    usage = {"prompt_tokens": 2006, "prompt_tokens_details": {"cached_tokens": 1920}}
    assert cache_usage(usage) == CacheUsage(prompt_tokens=2006, cached_tokens=1920)


def test_responses_input_tokens_details():
    usage = {"input_tokens": 1500, "input_tokens_details": {"cached_tokens": 1152}}
    assert cache_usage(usage) == CacheUsage(prompt_tokens=1500, cached_tokens=1152)


def test_anthropic_through_litellm_reads_and_writes():
    usage = {
        "prompt_tokens": 3000,
        "cache_read_input_tokens": 2048,
        "cache_creation_input_tokens": 700,
        "prompt_tokens_details": {"cached_tokens": 2048, "cache_creation_tokens": 700},
    }
    assert cache_usage(usage) == CacheUsage(3000, 2048, 700)
    only_top_level = {"prompt_tokens": 10, "cache_read_input_tokens": 4}
    assert cache_usage(only_top_level) == CacheUsage(10, 4, None)


def test_missing_and_malformed_figures_stay_unknown():
    assert cache_usage(None) == CacheUsage()
    assert cache_usage({"prompt_tokens": 12}) == CacheUsage(prompt_tokens=12)
    bad = {"prompt_tokens": True, "prompt_tokens_details": {"cached_tokens": "9"}}
    assert cache_usage(bad) == CacheUsage()
    assert cache_usage({"prompt_tokens_details": None, "prompt_tokens": -1}) == CacheUsage()


def test_ratio_and_the_openai_estimate():
    assert hit_ratio(0, 0) is None
    assert hit_ratio(1, 3) == 0.3333
    assert [estimate_cached(n) for n in (0, 1023, 1024, 1151, 1152, 2000)] == [
        0,
        0,
        1024,
        1024,
        1152,
        1920,
    ]

"""Prompt-cache figures for the admin API and ``sessions show``: per request, session, policy.

Every figure is the upstream's own (``usage``; see
:mod:`proxy.telemetry.cache_usage`). A hit ratio is cached ÷ prompt tokens
over the requests whose upstream reported a prompt size; requests that
reported nothing (errors, streams without ``include_usage``) are left out of
both sides rather than counted as misses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from proxy.telemetry.cache_usage import hit_ratio
from proxy.telemetry.metrics import Metrics


def request_cache(row: Mapping[str, Any]) -> dict[str, Any]:
    """One request row's cache figures and the hints the proxy sent."""
    prompt = row.get("upstream_prompt_tokens")
    cached = row.get("cached_tokens")
    detail = row.get("detail") or {}
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_write_tokens": row.get("cache_write_tokens"),
        "hit_ratio": hit_ratio(cached or 0, prompt) if isinstance(prompt, int) else None,
        "stable_prefix": row.get("stable_prefix"),
        "hints": detail.get("cache_hints") if isinstance(detail, Mapping) else None,
    }


class _Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.prompt = 0
        self.cached = 0
        self.written = 0

    def add(self, prompt: int, cached: int, written: int) -> None:
        self.requests += 1
        self.prompt += prompt
        self.cached += cached
        self.written += written

    def view(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt,
            "cached_tokens": self.cached,
            "uncached_tokens": self.prompt - self.cached,
            "cache_write_tokens": self.written,
            "hit_ratio": hit_ratio(self.cached, self.prompt),
        }


def cache_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A session's cache figures: in total and per policy (rows as the store returns them)."""
    total = _Tally()
    by_policy: dict[str, _Tally] = {}
    for row in rows:
        prompt = row.get("upstream_prompt_tokens")
        if not isinstance(prompt, int):
            continue
        cached = row.get("cached_tokens") or 0
        written = row.get("cache_write_tokens") or 0
        total.add(prompt, cached, written)
        by_policy.setdefault(str(row.get("policy") or ""), _Tally()).add(prompt, cached, written)
    return {
        **total.view(),
        "by_policy": {policy: tally.view() for policy, tally in sorted(by_policy.items())},
    }


def metrics_cache(metrics: Metrics) -> dict[str, Any]:
    """Since start-up, per route and policy: what ``/metrics`` counts, as ratios."""
    data = []
    prompt = metrics.upstream_prompt_tokens.values
    for (route, policy), tokens in sorted(prompt.items()):
        cached = metrics.upstream_cached_tokens.value((route, policy))
        written = metrics.upstream_cache_write_tokens.value((route, policy))
        data.append(
            {
                "route": route,
                "policy": policy,
                "prompt_tokens": int(tokens),
                "cached_tokens": int(cached),
                "cache_write_tokens": int(written),
                "hit_ratio": hit_ratio(int(cached), int(tokens)),
            }
        )
    return {"object": "list", "data": data}

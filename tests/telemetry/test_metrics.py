"""GET /metrics: Prometheus text format; requests, latency, tokens, summaries, streams."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest

from proxy.telemetry.metrics import Counter, Gauge, Histogram, Metrics, Registry
from tests.fakes.upstream import Reply

_SAMPLE = re.compile(
    r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>(?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*)\})? '
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|Inf|NaN))"
)
_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a text exposition; fails on any line that is not valid."""
    out: Samples = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("# HELP "):
            continue
        m = _SAMPLE.fullmatch(line)
        assert m, f"not a valid sample line: {line!r}"
        labels = frozenset(_LABEL.findall(m["labels"] or ""))
        assert re.sub(r"_(bucket|sum|count)$", "", m["name"]) in typed | {m["name"]}
        out[(m["name"], labels)] = float(m["value"].replace("Inf", "inf"))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum over every sample of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_counter_gauge_and_histogram_render_in_text_format():
    registry = Registry()
    c = Counter("t_requests_total", "Requests.", ("route", "status"))
    g = Gauge("t_streams", "Streams.")
    h = Histogram("t_seconds", "Latency.", ("route",), buckets=(0.1, 1.0))
    for metric in (c, g, h):
        registry.add(metric)
    c.inc(("a", "200"))
    c.inc(("a", "200"), 2)
    c.inc(('we"ird\\\n', "500"))
    g.inc()
    g.inc()
    g.dec()
    for seconds in (0.05, 0.1, 0.5, 3.0):
        h.observe(("a",), seconds)
    text = registry.render()
    assert "# HELP t_requests_total Requests.\n# TYPE t_requests_total counter\n" in text
    assert 't_requests_total{route="we\\"ird\\\\\\n",status="500"} 1\n' in text
    samples = parse(text)
    assert value(samples, "t_requests_total", route="a", status="200") == 3
    assert value(samples, "t_streams") == 1
    # Buckets are cumulative; +Inf is the count; 0.1 falls in le="0.1".
    assert value(samples, "t_seconds_bucket", route="a", le="0.1") == 2
    assert value(samples, "t_seconds_bucket", route="a", le="1") == 3
    assert value(samples, "t_seconds_bucket", route="a", le="+Inf") == 4
    assert value(samples, "t_seconds_count", route="a") == 4
    assert value(samples, "t_seconds_sum", route="a") == pytest.approx(3.65)
    with pytest.raises(ValueError, match="already registered"):
        registry.add(Counter("t_streams", "again"))


def test_summary_and_fallback_metrics_exist_before_anything_happens():
    samples = parse(Metrics().render())
    for outcome in ("made", "reused", "failed"):
        assert ("ctxproxy_summaries_total", frozenset({("outcome", outcome)})) in samples
    assert total(samples, "ctxproxy_summaries_total") == 0
    text = Metrics().render()
    assert "# TYPE ctxproxy_fallbacks_total counter" in text
    assert "ctxproxy_active_streams 0" in text


def scrape(proxy: Any) -> Samples:
    r = httpx.get(f"{proxy.url}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(r.text)


def post(proxy: Any, body: dict[str, Any], session: str = "m") -> httpx.Response:
    return httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=orjson.dumps(body),
        headers={
            "content-type": "application/json",
            "x-session-id": session,
            "authorization": "Bearer k",
        },
    )


def test_requests_latency_and_tokens_are_counted_by_route_policy_and_status(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(
        policies={"last1": {"strategy": "trim", "max_turns": 1}},
        routes=[
            {
                "name": "trim",
                "match": {"path": "/v1/chat/completions", "model": "gpt-4o"},
                "upstream": "default",
                "policy": "last1",
            },
            {
                "name": "plain",
                "match": {"path": "/v1/chat/completions", "model": "gpt-4o-mini"},
                "upstream": "default",
            },
        ],
    )
    history = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "two"},
    ]
    before = {"gpt-4o": 0, "gpt-4o-mini": 0}
    after = dict(before)
    for model in ("gpt-4o", "gpt-4o", "gpt-4o-mini"):
        r = post(proxy, {"model": model, "messages": history})
        assert r.status_code == 200
        before[model] += int(r.headers["x-context-tokens-before"])
        after[model] += int(r.headers["x-context-tokens-after"])
    upstream.replies.append(Reply(status=500))
    assert post(proxy, {"model": "gpt-4o-mini", "messages": history}).status_code == 500
    assert post(proxy, {"model": "unrouted", "messages": history}).status_code == 404
    proxy.drain()
    s = scrape(proxy)
    assert value(s, "ctxproxy_requests_total", route="trim", policy="last1", status="200") == 2
    assert (
        value(s, "ctxproxy_requests_total", route="plain", policy="passthrough", status="200") == 1
    )
    assert (
        value(s, "ctxproxy_requests_total", route="plain", policy="passthrough", status="500") == 1
    )
    assert value(s, "ctxproxy_requests_total", route="none", policy="none", status="404") == 1
    # Tokens: the sums of what the response headers said.
    trim = {"route": "trim", "policy": "last1"}
    assert value(s, "ctxproxy_tokens_before_total", **trim) == before["gpt-4o"]
    assert value(s, "ctxproxy_tokens_after_total", **trim) == after["gpt-4o"]
    assert value(s, "ctxproxy_tokens_saved_total", **trim) == before["gpt-4o"] - after["gpt-4o"] > 0
    plain = {"route": "plain", "policy": "passthrough"}
    # The failed call was counted too: it was forwarded all the same.
    assert value(s, "ctxproxy_tokens_before_total", **plain) == 2 * before["gpt-4o-mini"]
    assert value(s, "ctxproxy_tokens_saved_total", **plain) == 0
    # Latency: one observation per request that got that far.
    assert value(s, "ctxproxy_request_duration_seconds_count", route="trim") == 2
    assert value(s, "ctxproxy_request_duration_seconds_count", route="plain") == 2
    assert value(s, "ctxproxy_upstream_duration_seconds_count", route="plain") == 2
    assert value(s, "ctxproxy_upstream_duration_seconds_sum", route="trim") > 0
    assert value(s, "ctxproxy_policy_duration_seconds_count", policy="last1") == 2
    assert value(s, "ctxproxy_policy_duration_seconds_count", policy="passthrough") == 2
    # Four exchanges with a session were written (the 404 had no route to file it under).
    assert value(s, "ctxproxy_store_duration_seconds_count", operation="write") == 4
    assert value(s, "ctxproxy_active_streams") == 0
    assert value(s, "ctxproxy_token_calibration_samples", upstream="default", model="gpt-4o") == 2


def test_active_streams_counts_streams_being_relayed(fake, start_proxy):
    upstream, _ = fake
    upstream.replies.append(Reply(content="x" * 40, chunk_delay=0.05))
    proxy = start_proxy()
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
    ) as response:
        chunks = response.iter_bytes()
        next(chunks)
        assert value(scrape(proxy), "ctxproxy_active_streams") == 1
        for _ in chunks:
            pass
    proxy.drain()
    assert value(scrape(proxy), "ctxproxy_active_streams") == 0


def test_server_history_reads_are_timed(fake, start_proxy):
    proxy = start_proxy(
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "history": "server"}
        ]
    )
    for n in range(2):
        post(proxy, {"model": "gpt-4o", "messages": [{"role": "user", "content": f"q{n}"}]})
        proxy.drain()
    assert value(scrape(proxy), "ctxproxy_store_duration_seconds_count", operation="history") == 2

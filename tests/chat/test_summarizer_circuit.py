"""A summarizer that keeps failing stops being called; requests are trimmed and say why."""

from __future__ import annotations

from typing import Any

import openai

from tests.fakes.upstream import Reply

ROUTE = [
    {
        "name": "support",
        "match": {"path": "/v1/chat/completions"},
        "upstream": "default",
        "policy": "support",
    }
]
POLICY = {
    "support": {
        "strategy": "summarize",
        "trigger": {"turns": 2},
        "keep_last_turns": 1,
        "prefetch": False,
        "summarizer": {"timeout_s": 2, "max_tokens": 100},
    }
}


def conversation(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for t in range(4):
        messages += [
            {"role": "user", "content": f"q{n}-{t}"},
            {"role": "assistant", "content": f"a{t}"},
        ]
    return [*messages, {"role": "user", "content": f"next {n}"}]


def test_after_three_failures_no_more_calls_until_the_cool_down_ends(fake, start_proxy):
    upstream, _ = fake
    upstream.summary_replies.extend(Reply(status=500) for _ in range(3))
    proxy = start_proxy(policies=POLICY, routes=ROUTE)
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)

    def ask(n: int) -> Any:
        # A new session each time: nothing stored to reuse, a summary is needed every time.
        return client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=conversation(n), extra_headers={"X-Session-Id": f"s{n}"}
        )

    reasons = [ask(n).headers["x-context-fallback"] for n in range(5)]
    assert reasons == ["summarizer_error"] * 3 + ["summarizer_unavailable"] * 2
    assert len(upstream.summarizer_requests) == 3  # the last two paid for no failing call
    proxy.drain()  # the exchanges' metrics are counted once each answer is sent
    metrics = proxy.runtime.metrics
    assert metrics.fallbacks.value(("support", "summarizer_unavailable")) == 2
    text = metrics.render()
    assert 'ctxproxy_summarizer_circuit_open{route="support"} 1' in text
    assert 'ctxproxy_summarizer_circuit_opened_total{route="support"} 1' in text

    # The cool-down passes: one trial call, which succeeds, closes the circuit.
    breaker = proxy.runtime.summaries.breaker
    breaker.clock = lambda: 10**9
    raw = ask(5)
    assert raw.headers["x-context-summary"] == "created"
    assert "x-context-fallback" not in raw.headers
    assert ask(6).headers["x-context-summary"] == "created"
    assert len(upstream.summarizer_requests) == 5

"""Prompt caching end to end: the upstream's own cache figures, the stable prefix, the
session's prompt_cache_key, through the proxy to the row, the log, /metrics and the admin API.

The fake upstream simulates OpenAI's prefix cache (tests/fakes/prefix_cache.py):
what it reports is what the proxy must record, plain and streamed.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.prefix_cache import OpenAIPrefixCache
from tests.harness import query

ADMIN_KEY = "admin-secret-cache"
# Long enough for a provider to cache (over 1,024 tokens on its own).
SYSTEM = "You are a meticulous airline support agent. " + " ".join(
    f"Rule {i}: check the booking reference and the passenger's name before any change."
    for i in range(90)
)


def client(proxy: Any, session: str | None = "c1") -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="sk-cache", default_headers=headers, max_retries=0
    )


@pytest.fixture
def cached(fake):
    upstream, _ = fake
    upstream.prefix_cache = OpenAIPrefixCache()
    return upstream


def rows(proxy: Any, tmp_path) -> list[Any]:
    proxy.drain()
    return query(
        tmp_path / "ctxproxy.db",
        "SELECT * FROM requests ORDER BY created_at",
    )


def reported(response: Any) -> int:
    """What the (fake) upstream said it served from cache, as the client received it."""
    return int(response.usage.prompt_tokens_details.cached_tokens)


def test_cached_tokens_on_the_row_header_and_metrics_are_the_upstreams(
    cached, start_proxy, tmp_path
):
    proxy = start_proxy()
    c = client(proxy)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    seen: list[int] = []
    stable: list[str] = []
    for t in range(4):
        messages.append({"role": "user", "content": f"question {t}"})
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        answer = raw.parse()
        seen.append(reported(answer))
        stable.append(raw.headers["x-context-stable-prefix"])
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    # The first request had nothing cached; later ones read the whole earlier prompt.
    assert seen[0] == 0 and all(n >= 1024 for n in seen[1:])
    # Each request forwards everything the previous one did, then two new messages.
    assert stable == ["0", "2", "4", "6"]
    got = rows(proxy, tmp_path)
    assert [r["cached_tokens"] for r in got] == seen
    assert [r["stable_prefix"] for r in got] == [0, 2, 4, 6]
    assert all(r["upstream_prompt_tokens"] == r["tokens_after"] for r in got)
    metrics = httpx.get(f"{proxy.url}/metrics").text
    line = 'ctxproxy_upstream_cached_tokens_total{route="routes[0]",policy="passthrough"}'
    assert f"{line} {sum(seen)}\n" in metrics


def test_streamed_cached_tokens_are_recorded_from_the_usage_chunk(cached, start_proxy, tmp_path):
    proxy = start_proxy()
    c = client(proxy, "stream")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    seen: list[int] = []
    for t in range(3):
        messages.append({"role": "user", "content": f"question {t}"})
        stream = c.chat.completions.create(
            model="gpt-4o",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = ""
        for chunk in stream:
            if chunk.usage is not None:
                seen.append(reported(chunk))
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        messages.append({"role": "assistant", "content": text})
    assert seen[0] == 0 and seen[2] >= seen[1] >= 1024
    got = rows(proxy, tmp_path)
    assert [r["cached_tokens"] for r in got] == seen
    assert all(r["stream"] for r in got)


def test_the_log_line_carries_the_cache_figures(cached, start_proxy, capsys):
    proxy = start_proxy()
    c = client(proxy, "logged")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    c.chat.completions.create(model="gpt-4o", messages=messages)
    second = c.chat.completions.create(
        model="gpt-4o", messages=[*messages, {"role": "assistant", "content": "echo: hi"}]
    )
    proxy.drain()  # the line is written once the answer is sent
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "request_completed" in line]
    assert f"cached_tokens={reported(second)}" in lines[-1]
    assert "stable_prefix=2" in lines[-1]
    assert re.search(r"upstream_prompt_tokens=\d+", lines[-1])


def test_each_session_gets_its_own_prompt_cache_key_and_a_clients_key_is_left_alone(
    cached, start_proxy
):
    proxy = start_proxy()
    hello = [{"role": "user", "content": "hello"}]
    client(proxy, "a").chat.completions.create(model="gpt-4o", messages=hello)
    client(proxy, "a").chat.completions.create(model="gpt-4o", messages=hello)
    client(proxy, "b").chat.completions.create(model="gpt-4o", messages=hello)
    client(proxy, "a").chat.completions.create(
        model="gpt-4o", messages=hello, extra_body={"prompt_cache_key": "mine"}
    )
    client(proxy, None).chat.completions.create(model="gpt-4o", messages=hello)
    keys = [r.json.get("prompt_cache_key") for r in cached.chat_requests]
    assert keys[0] == keys[1] != keys[2]
    assert keys[0].startswith("ctxproxy-") and keys[2].startswith("ctxproxy-")
    # The client's own key is forwarded as it sent it; no session, no key.
    assert keys[3] == "mine"
    assert keys[4] is None


def test_prompt_cache_key_off_sends_none(cached, start_proxy, fake):
    _, server = fake
    up = {"default": {"base_url": f"{server.url}/v1", "cache": {"prompt_cache_key": "off"}}}
    proxy = start_proxy(extra={"upstreams": up})
    client(proxy).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
    )
    assert "prompt_cache_key" not in cached.chat_requests[-1].json


def test_llama_cpp_slots_pin_each_session_to_one_and_the_row_says_which(
    fake, start_proxy, tmp_path
):
    """``cache: {slots: N}``: a session's every request goes to the same llama.cpp
    slot (``id_slot``), so another session's prompt never evicts its prefix."""
    upstream, server = fake
    up = {"default": {"base_url": f"{server.url}/v1", "cache": {"slots": 4}}}
    proxy = start_proxy(extra={"upstreams": up})
    hello = [{"role": "user", "content": "hello"}]
    sessions = [f"s{n}" for n in range(8)]
    for session in [*sessions, *sessions]:
        client(proxy, session).chat.completions.create(model="gpt-4o", messages=hello)
    client(proxy, "s0").chat.completions.create(
        model="gpt-4o", messages=hello, extra_body={"id_slot": 3}
    )
    slots = [r.json.get("id_slot") for r in upstream.chat_requests]
    assert slots[:8] == slots[8:16]  # the same slot each time
    assert all(0 <= s < 4 for s in slots[:16]) and len(set(slots[:16])) > 1
    assert slots[16] == 3  # the client's own choice is left alone
    # A body forwarded as it came is the client's bytes with the hints spliced in.
    assert upstream.chat_requests[0].raw.endswith(b',"id_slot":%d}' % slots[0])
    recorded = [json.loads(r["detail_json"]).get("cache_hints", {}) for r in rows(proxy, tmp_path)]
    assert [d.get("id_slot") for d in recorded[:16]] == slots[:16]
    assert "id_slot" not in recorded[16]


def test_stable_prefix_drops_once_at_a_trim_cut_and_holds_between_cuts(
    cached, start_proxy, tmp_path
):
    policies = {"fit": {"strategy": "trim", "max_tokens": 2600, "low_water": 0.6}}
    routes = [{"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fit"}]
    proxy = start_proxy(policies=policies, routes=routes)
    c = client(proxy, "trim")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    stable: list[int] = []
    forwarded: list[int] = []
    for t in range(24):
        messages.append({"role": "user", "content": f"question {t}: " + "details " * 40})
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        stable.append(int(raw.headers["x-context-stable-prefix"]))
        forwarded.append(len(cached.chat_requests[-1].json["messages"]))
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    cuts = [i for i in range(1, len(stable)) if stable[i] != forwarded[i - 1]]
    # Trimming happened, and only at the cuts does the prefix break (then to the system
    # message alone, which never moves); every other request keeps all of the last one.
    assert cuts and len(cuts) <= 4
    assert all(stable[i] == 1 for i in cuts)
    assert [r["stable_prefix"] for r in rows(proxy, tmp_path)] == stable


def test_preview_shows_the_stable_prefix_and_an_estimate_without_moving_it(cached, start_proxy):
    proxy = start_proxy()
    c = client(proxy, "pv")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "one"},
    ]
    c.chat.completions.create(model="gpt-4o", messages=messages)
    messages += [{"role": "assistant", "content": "echo: one"}, {"role": "user", "content": "two"}]
    body = {"model": "gpt-4o", "messages": messages}
    headers = {"X-Session-Id": "pv", "Authorization": "Bearer sk-cache"}
    for _ in range(2):  # the preview does not become the session's previous request
        preview = httpx.post(f"{proxy.url}/v1/context/preview", json=body, headers=headers)
        assert preview.status_code == 200
        estimate = preview.json()["cache"]
        assert estimate["stable_prefix"] == 2
        assert preview.headers["x-context-stable-prefix"] == "2"
        assert estimate["stable_prefix_tokens"] >= 1024
        assert 1024 <= estimate["estimated_cached_tokens"] <= estimate["stable_prefix_tokens"]
    answer = c.chat.completions.create(model="gpt-4o", messages=messages)
    # The estimate is what the (simulated) provider then reported.
    assert reported(answer) == estimate["estimated_cached_tokens"]


def test_admin_api_and_sessions_show_give_the_hit_ratio_per_session_and_policy(
    cached, start_proxy, monkeypatch, tmp_path
):
    monkeypatch.setenv("CTX_CACHE_ADMIN", ADMIN_KEY)
    proxy = start_proxy(extra={"admin": {"api_key": "os.environ/CTX_CACHE_ADMIN"}})
    c = client(proxy, "ratio")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    answers = []
    for t in range(3):
        messages.append({"role": "user", "content": f"q{t}"})
        answers.append(c.chat.completions.create(model="gpt-4o", messages=messages))
        messages.append({"role": "assistant", "content": answers[-1].choices[0].message.content})
    proxy.drain()
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    tenant = query(tmp_path / "ctxproxy.db", "SELECT tenant FROM sessions")[0]["tenant"]
    detail = httpx.get(f"{proxy.url}/admin/sessions/{tenant}/ratio", headers=auth).json()
    cached_sum = sum(reported(a) for a in answers)
    prompt_sum = sum(a.usage.prompt_tokens for a in answers)
    cache = detail["cache"]
    assert cache["cached_tokens"] == cached_sum and cache["prompt_tokens"] == prompt_sum
    assert cache["hit_ratio"] == round(cached_sum / prompt_sum, 4)
    assert cache["by_policy"]["passthrough"]["hit_ratio"] == cache["hit_ratio"]
    assert detail["requests"][1]["cache"]["cached_tokens"] == reported(answers[1])
    assert detail["requests"][1]["cache"]["stable_prefix"] == 2
    assert detail["requests"][1]["cache"]["hints"]["prompt_cache_key"].startswith("ctxproxy-")
    since_start = httpx.get(f"{proxy.url}/admin/cache", headers=auth).json()["data"]
    assert since_start == [
        {
            "route": "routes[0]",
            "policy": "passthrough",
            "prompt_tokens": prompt_sum,
            "cached_tokens": cached_sum,
            "cache_write_tokens": 0,
            "hit_ratio": round(cached_sum / prompt_sum, 4),
        }
    ]
    from proxy.ops.cli import print_session

    class Out:
        text = ""

        def write(self, s: str) -> None:
            Out.text += s

    print_session(detail, Out())  # type: ignore[arg-type]
    ratio = f"{cached_sum / prompt_sum:.1%}"
    assert f"prompt cache: {cached_sum} of {prompt_sum} prompt tokens cached ({ratio})" in Out.text
    assert "policy passthrough:" in Out.text
    assert json.dumps(detail)  # plain JSON all the way


def test_a_deleted_session_starts_again_with_no_stable_prefix(
    cached, start_proxy, monkeypatch, tmp_path
):
    monkeypatch.setenv("CTX_CACHE_ADMIN", ADMIN_KEY)
    proxy = start_proxy(extra={"admin": {"api_key": "os.environ/CTX_CACHE_ADMIN"}})
    c = client(proxy, "gone")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    c.chat.completions.create(model="gpt-4o", messages=messages)
    proxy.drain()
    tenant = query(tmp_path / "ctxproxy.db", "SELECT tenant FROM sessions")[0]["tenant"]
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    deleted = httpx.delete(f"{proxy.url}/admin/sessions/{tenant}/gone", headers=auth)
    assert deleted.status_code == 200
    raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    assert raw.headers["x-context-stable-prefix"] == "0"

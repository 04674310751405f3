"""POST /v1/context/preview: the decision and the messages the upstream would get, nothing sent."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import orjson
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.http.sessions import tenant_of
from tests.harness import AiohttpServer, make_config, query

POLICIES = {
    "last2": {"strategy": "trim", "max_turns": 2},
    "fit": {"strategy": "trim", "max_tokens": 300, "low_water": 0.7},
    "clip": {"strategy": "trim", "max_tokens": 400, "tool_output_max_tokens": 20},
}
# One route per policy, picked by a header, so one proxy serves every case.
ROUTES = [
    {
        "match": {"path": "/v1/chat/completions", "headers": {"X-Policy": name}},
        "upstream": "default",
        "policy": name,
    }
    for name in POLICIES
] + [{"match": {"path": "/v1/chat/completions"}, "upstream": "default"}]
SERVER_ROUTES = [
    {
        "match": {"path": "/v1/chat/completions"},
        "upstream": "default",
        "policy": "last2",
        "history": "server",
    }
]


def post(proxy: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{proxy.url}{path}",
        content=orjson.dumps(body),
        headers={
            "Authorization": "Bearer sk-p",
            "content-type": "application/json",
            **(headers or {}),
        },
    )


def preview(proxy: Any, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return post(proxy, "/v1/context/preview", body, headers)


def send(proxy: Any, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return post(proxy, "/v1/chat/completions", body, headers)


def long_chat(turns: int, words: int = 30) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} " + "word " * words})
        messages.append({"role": "assistant", "content": f"answer {t} " + "word " * words})
    messages.append({"role": "user", "content": "and finally?"})
    return messages


def test_preview_is_what_the_upstream_then_receives(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICIES, routes=ROUTES)
    body = {"model": "gpt-4o", "messages": long_chat(6), "temperature": 0}
    for policy in ("last2", "fit"):
        headers = {"X-Policy": policy, "X-Session-Id": f"p-{policy}"}
        before = len(upstream.received)
        shown = preview(proxy, body, headers)
        assert shown.status_code == 200
        assert len(upstream.received) == before  # nothing was sent upstream
        result = shown.json()
        assert result["policy"] == policy and result["decision"]["changed"] is True
        real = send(proxy, body, headers)
        assert real.status_code == 200
        assert upstream.received[-1].json["messages"] == result["messages"]
        for name in (
            "policy",
            "tokens-before",
            "tokens-after",
            "messages-dropped",
            "turns-dropped",
            "trim-reason",
        ):
            assert shown.headers[f"x-context-{name}"] == real.headers[f"x-context-{name}"], name
        assert "x-ctxproxy-request-id" not in shown.headers


def test_preview_reports_the_decision_and_stores_nothing(fake, start_proxy):
    proxy = start_proxy(policies=POLICIES, routes=ROUTES)
    messages = long_chat(4)
    r = preview(
        proxy,
        {"model": "gpt-4o", "messages": messages},
        {"X-Policy": "last2", "X-Session-Id": "look"},
    )
    result = r.json()
    assert result["object"] == "context.preview"
    assert (result["route"], result["upstream"], result["history"]) == (
        "routes[0]",
        "default",
        "client",
    )
    assert result["session"] == {"tenant": tenant_of("sk-p"), "key": "look"}
    d = result["decision"]
    # Four answered turns and the final question: the oldest three turns go.
    assert d["reason"] == "max_turns" and d["turns_dropped"] == 3
    assert d["dropped"] == [1, 2, 3, 4, 5, 6]
    assert d["kept"] == [0, 7, 8, 9]
    assert (d["messages_before"], d["messages_after"]) == (10, 4)
    assert d["tokens_saved"] == d["tokens_before"] - d["tokens_after"] > 0
    assert d["calibration"] == 1.0
    assert result["messages"] == [messages[0], *messages[7:]]
    proxy.drain()
    db = proxy.config.store.path
    assert query(db, "SELECT COUNT(*) FROM sessions")[0][0] == 0
    assert query(db, "SELECT COUNT(*) FROM requests")[0][0] == 0


def test_preview_with_server_history_prepends_the_stored_history_read_only(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICIES, routes=SERVER_ROUTES)
    headers = {"X-Session-Id": "srv"}
    for n in range(3):
        send(
            proxy, {"model": "gpt-4o", "messages": [{"role": "user", "content": f"q{n}"}]}, headers
        )
        proxy.drain()
    rows_before = query(proxy.config.store.path, "SELECT COUNT(*) FROM items")[0][0]
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "q3"}]}
    result = preview(proxy, body, headers).json()
    assert result["history"] == "server"
    assert result["stored_messages_prepended"] == 6
    assert [m["content"] for m in result["messages"]] == ["q2", "echo: q2", "q3"]
    proxy.drain()
    assert query(proxy.config.store.path, "SELECT COUNT(*) FROM items")[0][0] == rows_before
    send(proxy, body, headers)
    assert upstream.received[-1].json["messages"] == result["messages"]


def test_preview_errors_are_the_chat_endpoints_errors(fake, start_proxy):
    proxy = start_proxy(
        policies={"tiny": {"strategy": "trim", "max_tokens": 20}},
        routes=[
            {
                "match": {"path": "/v1/chat/completions", "model": "gpt-4o*"},
                "upstream": "default",
                "policy": "tiny",
            }
        ],
    )
    cases = [
        {"model": "gpt-4o"},
        {"model": "gpt-4o", "messages": [{"role": "robot", "content": "x"}]},
        {"model": "other", "messages": [{"role": "user", "content": "x"}]},
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "word " * 100}]},
    ]
    for body in cases:
        shown, real = preview(proxy, body), send(proxy, body)
        assert shown.status_code == real.status_code >= 400, body
        assert shown.json() == real.json()
    r = httpx.post(f"{proxy.url}/v1/context/preview", content=b"not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_preview_of_a_responses_body_is_the_input_the_upstream_then_receives(
    loop_thread, start_proxy, tmp_path
):
    received: list[dict[str, Any]] = []

    async def responses(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        n = len(received)
        message = {
            "type": "message",
            "id": f"msg_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"answer {n}", "annotations": []}],
        }
        return web.json_response(
            {
                "id": f"resp_{n}",
                "object": "response",
                "status": "completed",
                "model": body["model"],
                "output": [message],
                "usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    server = AiohttpServer(loop_thread, app)
    try:
        route = {"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "last2"}
        config = make_config(server.url, tmp_path, policies=POLICIES, routes=[route])
        proxy = start_proxy(config=config)
        items: list[dict[str, Any]] = []
        for t in range(4):
            items += [
                {"role": "user", "content": f"question {t}"},
                {"role": "assistant", "content": f"answer {t}"},
            ]
        body = {"model": "gpt-4o", "input": [*items, {"role": "user", "content": "last"}]}
        shown = preview(proxy, body, {"X-Session-Id": "resp-preview"})
        assert shown.status_code == 200, shown.text
        result = shown.json()
        assert (result["endpoint"], result["policy"]) == ("/v1/responses", "last2")
        assert result["decision"]["turns_dropped"] == 3
        # Four answered turns and the newest question: the last two turns are forwarded.
        assert result["input"] == [*items[6:], {"role": "user", "content": "last"}]
        assert result["stored_messages_prepended"] == 0
        assert received == []
        real = post(proxy, "/v1/responses", body, {"X-Session-Id": "resp-preview"})
        assert real.status_code == 200, real.text
        assert received[-1]["input"] == result["input"]
    finally:
        server.stop()


MODE_ROUTES = [
    {
        "match": {"path": "/v1/chat/completions"},
        "upstream": "default",
        "policy": "last2",
        "modes": {"header": True, "rules": [{"match": r"(?i)order\s*#?\d+", "mode": "full"}]},
    }
]


def test_preview_reports_the_policy_and_mode_a_mode_switched_to(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICIES, routes=MODE_ROUTES)
    plain = long_chat(4)
    by_rule = [*plain[:-1], {"role": "user", "content": "Where is order #4412?"}]
    cases = [
        # (messages, request headers, policy and mode applied, messages forwarded):
        # last2 keeps the system message and two turns; the modes all of them.
        (plain, {}, "last2", None, 4),
        (plain, {"X-Context-Mode": "full"}, "full", "full", 10),
        (by_rule, {}, "full", "full", 10),
        (by_rule, {"X-Context-Mode": "balanced"}, "balanced", "balanced", 10),
    ]
    for n, (messages, extra, policy, mode, forwarded) in enumerate(cases):
        headers = {"X-Session-Id": f"mode-{n}", **extra}
        body = {"model": "gpt-4o", "messages": messages}
        shown = preview(proxy, body, headers)
        assert shown.status_code == 200, shown.text
        result = shown.json()
        assert (result["policy"], result["mode"]) == (policy, mode), n
        real = send(proxy, body, headers)
        assert real.status_code == 200
        assert real.headers["x-context-policy"] == shown.headers["x-context-policy"] == policy
        assert real.headers.get("x-context-mode") == shown.headers.get("x-context-mode") == mode
        assert upstream.received[-1].json["messages"] == result["messages"], n
        assert len(result["messages"]) == forwarded, n
        summarizes = mode is not None
        assert (result["summary"] is not None) == summarizes
        if summarizes:
            assert result["summary"] == {"status": "none", "fallback": None}
            assert real.headers["x-context-summary"] == "none"


def test_preview_says_when_the_real_request_would_make_a_summary(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICIES, routes=MODE_ROUTES)
    body = {"model": "gpt-4o", "messages": long_chat(6, words=3)}
    headers = {"X-Session-Id": "needs", "X-Context-Mode": "concise"}
    shown = preview(proxy, body, headers)
    result = shown.json()
    assert (result["policy"], result["mode"]) == ("concise", "concise")
    assert result["summary"] == {"status": "needed", "fallback": None}
    assert shown.headers["x-context-summary"] == "needed"
    assert result["decision"]["extra"]["summary_needed"] is True
    assert upstream.summarizer_requests == []  # a preview makes no summary
    real = send(proxy, body, headers)
    assert real.headers["x-context-summary"] == "created"


_texts = st.text(alphabet="abcdefgh ", min_size=1, max_size=120)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(_texts)}]
    for t in range(draw(st.integers(0, 6))):
        messages.append({"role": "user", "content": draw(_texts)})
        if draw(st.booleans()):
            call = {
                "id": f"call_{t}",
                "type": "function",
                "function": {"name": "look", "arguments": json.dumps({"q": t})},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{t}", "content": draw(_texts) * 3}
            )
        messages.append({"role": "assistant", "content": draw(_texts)})
    messages.append({"role": "user", "content": draw(_texts)})
    return messages


_session = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=conversations(), policy=st.sampled_from([*POLICIES, "passthrough"]))
def test_preview_always_equals_the_forwarded_messages(fake, start_proxy, messages, policy):
    upstream, _ = fake
    if not hasattr(start_proxy, "shared"):
        start_proxy.shared = start_proxy(policies=POLICIES, routes=ROUTES)
    proxy = start_proxy.shared
    headers = {"X-Policy": policy, "X-Session-Id": f"h{next(_session)}"}
    body = {"model": "gpt-4o", "messages": messages}
    shown = preview(proxy, body, headers)
    real = send(proxy, body, headers)
    assert shown.status_code == real.status_code
    if real.status_code == 200:
        assert upstream.received[-1].json["messages"] == shown.json()["messages"]
    else:
        assert shown.json() == real.json()

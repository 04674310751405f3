"""Known agents' sessions, found with no configuration: Codex, Claude Code, prompt_cache_key.

Real HTTP: the proxy under uvicorn, the official openai SDK (and httpx where
the SDK adds nothing) as the client, a recording fake upstream; each test
asserts on the stored session and the response headers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.config.model import AgentSessions, SessionConfig
from proxy.http.session_lookup import session_hint
from tests.fakes.responses import FakeResponses
from tests.harness import AiohttpServer, ProxyServer, make_config, query

RESPONSES = [{"match": {"path": "/v1/responses"}, "upstream": "default"}]
CODEX_THREAD = "0199a213-81c0-7800-8aa1-bbab2a035a53"


@pytest.fixture
def responses_proxy(
    start_proxy: Callable[..., ProxyServer],
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    tmp_path: Path,
) -> Callable[..., ProxyServer]:
    """Starts a proxy routing /v1/responses to the fake Responses upstream."""

    def start(session: dict[str, Any] | None = None) -> ProxyServer:
        extra = {"session": session} if session is not None else None
        url = responses_upstream[1].url
        return start_proxy(config=make_config(url, tmp_path, routes=RESPONSES, extra=extra))

    return start


def sessions(tmp_path: Path) -> list[str]:
    return [
        r["key"] for r in query(tmp_path / "ctxproxy.db", "SELECT key FROM sessions ORDER BY id")
    ]


def codex_headers(window: int) -> dict[str, str]:
    """What Codex CLI sends on each request of a thread (0.171: both ids are the thread's)."""
    return {
        "session-id": CODEX_THREAD,
        "thread-id": CODEX_THREAD,
        "x-codex-window-id": f"{CODEX_THREAD}:{window}",
        "originator": "codex_exec",
    }


def codex_body(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "gpt-5.1-codex",
        "instructions": "You are Codex.",
        "input": items,
        "store": False,
        "stream": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": CODEX_THREAD,
        "client_metadata": {"x-codex-installation-id": "inst-1"},
    }


def sdk(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the SDK's keyword arguments (client_metadata is not one of its own)."""
    known = {k: v for k, v in body.items() if k != "client_metadata"}
    return {**known, "extra_body": {"client_metadata": body["client_metadata"]}}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_a_codex_thread_is_one_session_across_its_compaction_windows(
    responses_proxy, responses_upstream, tmp_path
):
    fake, _ = responses_upstream
    proxy = responses_proxy()
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-codex", max_retries=0)
    first = client.responses.with_raw_response.create(
        **sdk(codex_body([user("list the files")])), extra_headers=codex_headers(0)
    )
    assert first.headers["x-session-id"] == CODEX_THREAD
    assert first.headers["x-context-session-source"] == "codex:session-id"
    reply = first.parse().output[0].model_dump(exclude_none=True)
    proxy.drain()
    # The next window (after a compaction): a new window id, the same thread.
    second = client.responses.with_raw_response.create(
        **sdk(codex_body([user("list the files"), reply, user("now the tests")])),
        extra_headers=codex_headers(1),
    )
    assert second.headers["x-session-id"] == CODEX_THREAD
    proxy.drain()
    assert sessions(tmp_path) == [CODEX_THREAD]
    requests = query(tmp_path / "ctxproxy.db", "SELECT detail_json FROM requests ORDER BY rowid")
    sources = [json.loads(r["detail_json"])["session_source"] for r in requests]
    assert sources == ["codex:session-id", "codex:session-id"]
    rows = query(tmp_path / "ctxproxy.db", "SELECT role FROM items ORDER BY id")
    assert [r["role"] for r in rows] == ["user", "assistant", "user", "assistant"]
    # Codex's own headers and body fields reached the upstream as they came.
    sent = fake.received[-1]
    assert sent.headers["session-id"] == CODEX_THREAD
    assert sent.headers["x-codex-window-id"] == f"{CODEX_THREAD}:1"
    assert sent.json["client_metadata"] == {"x-codex-installation-id": "inst-1"}
    assert sent.json["store"] is False


def test_thread_id_alone_names_the_session(responses_proxy, tmp_path):
    proxy = responses_proxy()
    answer = httpx.post(
        f"{proxy.url}/v1/responses",
        json=codex_body([user("hi")]) | {"prompt_cache_key": None},
        headers={"authorization": "Bearer sk-codex", "thread-id": "thread-7"},
    )
    assert answer.status_code == 200
    assert answer.headers["x-session-id"] == "thread-7"
    assert answer.headers["x-context-session-source"] == "codex:thread-id"
    proxy.drain()
    assert sessions(tmp_path) == ["thread-7"]


def test_the_configured_header_wins_over_an_agents_own_id(responses_proxy, tmp_path):
    proxy = responses_proxy()
    answer = httpx.post(
        f"{proxy.url}/v1/responses",
        json=codex_body([user("hi")]),
        headers={"authorization": "Bearer sk-codex", "x-session-id": "mine", **codex_headers(0)},
    )
    assert answer.headers["x-session-id"] == "mine"
    assert answer.headers["x-context-session-source"] == "header"
    proxy.drain()
    assert sessions(tmp_path) == ["mine"]


def test_prompt_cache_key_is_the_last_resort(responses_proxy, tmp_path):
    proxy = responses_proxy()
    answer = httpx.post(
        f"{proxy.url}/v1/responses",
        json=codex_body([user("hi")]) | {"prompt_cache_key": "pck-1"},
        headers={"authorization": "Bearer sk-codex"},
    )
    assert answer.headers["x-session-id"] == "pck-1"
    assert answer.headers["x-context-session-source"] == "prompt_cache_key"
    proxy.drain()
    assert sessions(tmp_path) == ["pck-1"]


def test_codex_and_prompt_cache_key_switched_off_store_nothing(responses_proxy, tmp_path):
    proxy = responses_proxy({"agents": {"codex": False, "prompt_cache_key": False}})
    answer = httpx.post(
        f"{proxy.url}/v1/responses",
        json=codex_body([user("hi")]),
        headers={"authorization": "Bearer sk-codex", **codex_headers(0)},
    )
    assert answer.status_code == 200
    assert "x-session-id" not in answer.headers
    assert "x-context-session-source" not in answer.headers
    proxy.drain()
    # store: false and no session: nothing but the request row.
    assert sessions(tmp_path) == []


def test_a_codex_session_id_too_long_is_a_400_naming_the_header(responses_proxy):
    proxy = responses_proxy()
    answer = httpx.post(
        f"{proxy.url}/v1/responses",
        json=codex_body([user("hi")]),
        headers={"authorization": "Bearer sk-codex", "session-id": "s" * 300},
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_session_id"
    assert error["param"] == "session-id"
    assert error["type"] == "invalid_request_error"


# -- Claude Code (chat completions through the proxy) ---------------------------------


def claude(proxy: ProxyServer, headers: dict[str, str]) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="sk-claude", default_headers=headers, max_retries=0
    )


def test_a_claude_code_sub_agent_is_kept_apart_from_its_parent(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy()
    parent = claude(proxy, {"X-Claude-Code-Session-Id": "cc-1"})
    child = claude(proxy, {"X-Claude-Code-Session-Id": "cc-1", "X-Claude-Code-Agent-Id": "a7"})
    said = parent.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "plan the refactor"}]
    )
    assert said.headers["x-session-id"] == "cc-1"
    assert said.headers["x-context-session-source"] == "claude-code"
    proxy.drain()
    sub = child.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "search the code base"}]
    )
    assert sub.headers["x-session-id"] == "cc-1/agent/a7"
    assert sub.headers["x-context-session-source"] == "claude-code:agent"
    proxy.drain()
    assert sessions(tmp_path) == ["cc-1", "cc-1/agent/a7"]
    contents = query(
        tmp_path / "ctxproxy.db",
        "SELECT s.key, i.role FROM items i JOIN sessions s ON s.id = i.session_id ORDER BY i.id",
    )
    assert [(r["key"], r["role"]) for r in contents] == [
        ("cc-1", "user"),
        ("cc-1", "assistant"),
        ("cc-1/agent/a7", "user"),
        ("cc-1/agent/a7", "assistant"),
    ]
    assert upstream.received[-1].headers["x-claude-code-agent-id"] == "a7"


def test_claude_code_switched_off_is_no_session(fake, start_proxy, tmp_path):
    proxy = start_proxy(extra={"session": {"agents": {"claude_code": False}}})
    said = claude(proxy, {"X-Claude-Code-Session-Id": "cc-1"}).chat.completions.with_raw_response
    answer = said.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "x-session-id" not in answer.headers
    proxy.drain()
    assert sessions(tmp_path) == []


def test_a_configured_fallback_comes_before_the_agents(fake, start_proxy, tmp_path):
    proxy = start_proxy(extra={"session": {"fallbacks": ["body.metadata.session_id"]}})
    said = claude(proxy, {"X-Claude-Code-Session-Id": "cc-1"}).chat.completions.with_raw_response
    answer = said.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        metadata={"session_id": "from-metadata"},
    )
    assert answer.headers["x-session-id"] == "from-metadata"
    assert answer.headers["x-context-session-source"] == "body.metadata.session_id"


def test_the_session_hint_before_the_parse_follows_the_lookups_order():
    config = SessionConfig()
    body = b'{"model":"m","messages":[],"prompt_cache_key":"pck-1"}'
    assert session_hint(config, {"x-session-id": "s", "session-id": "c"}, body) == "s"
    assert session_hint(config, {"session-id": "c", "thread-id": "t"}, body) == "c"
    claude = {"x-claude-code-session-id": "cc", "x-claude-code-agent-id": "a1"}
    assert session_hint(config, claude, body) == "cc/agent/a1"
    assert session_hint(config, {}, body) == "pck-1"
    assert session_hint(config, {}, b'{"prompt_cache_key" : "spaced"}') == "spaced"
    # The last one wins, as in a parse; one a parse must unescape is no hint.
    assert session_hint(config, {}, body[:-1] + b',"prompt_cache_key":"pck-2"}') == "pck-2"
    assert session_hint(config, {}, b'{"prompt_cache_key":"a\\"b"}') is None
    assert session_hint(config, {}, b'{"messages":[]}') is None
    # A header the lookup would refuse is no hint (the request gets its 400 from the lookup).
    assert session_hint(config, {"x-session-id": "x" * 300}, body) is None
    off = SessionConfig(agents=AgentSessions(codex=False, prompt_cache_key=False))
    assert session_hint(off, {"session-id": "c"}, body) is None

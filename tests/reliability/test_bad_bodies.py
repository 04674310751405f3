"""The bodies that once got the proxy's own 500 now get a 4xx in OpenAI's shape."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import httpx
import orjson
import pytest

from tests.harness import ProxyServer, query

CHAT = "/v1/chat/completions"


def deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def user(content: Any = "x") -> dict[str, Any]:
    return {"role": "user", "content": content}


BAD_BODIES: dict[str, dict[str, Any]] = {
    "unhashable role": {"model": "gpt-4o", "messages": [{"role": ["user"], "content": "x"}]},
    "role is an object": {"model": "gpt-4o", "messages": [{"role": {"a": 1}, "content": "x"}]},
    "content 300 levels deep": {"model": "gpt-4o", "messages": [user(deep(300))]},
    "tools is a number": {"model": "gpt-4o", "messages": [user()], "tools": 5},
    "tools holds a string": {"model": "gpt-4o", "messages": [user()], "tools": ["f"]},
    "functions is a boolean": {"model": "gpt-4o", "messages": [user()], "functions": True},
    "tool_calls function is a string": {
        "model": "gpt-4o",
        "messages": [
            user(),
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": "f"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            user(),
        ],
    },
    "tool_calls id is a list": {
        "model": "gpt-4o",
        "messages": [
            user(),
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": ["c1"], "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            user(),
        ],
    },
    "tool_calls id is an object": {
        "model": "gpt-4o",
        "messages": [
            user(),
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": {"a": 1}, "type": "function", "function": {"name": "f", "arguments": ""}}
                ],
            },
            {"role": "tool", "tool_call_id": {"a": 1}, "content": "r"},
            user(),
        ],
    },
    "tool_calls is an object": {
        "model": "gpt-4o",
        "messages": [user(), {"role": "assistant", "tool_calls": {"id": "c1"}}, user()],
    },
    "content is a number": {"model": "gpt-4o", "messages": [user(5)]},
    "content part is a string": {"model": "gpt-4o", "messages": [user(["hi"])]},
    "name is a list": {"model": "gpt-4o", "messages": [{**user(), "name": ["n"]}]},
    "model is a list": {"model": ["gpt-4o"], "messages": [user()]},
    "stream_options is a string": {
        "model": "gpt-4o",
        "messages": [user()],
        "stream": True,
        "stream_options": "x",
    },
    "metadata is a list": {"model": "gpt-4o", "messages": [user()], "metadata": [1]},
}

HEADERS = {
    "passthrough": {},
    "trim": {"x-app": "trim"},
    "server": {"x-app": "server"},
}


def post(proxy: ProxyServer, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        proxy.url + path,
        content=body,
        headers={"content-type": "application/json", "authorization": "Bearer sk-a", **headers},
        timeout=20,
    )


def assert_openai_4xx(response: httpx.Response) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert "Traceback" not in response.text
    return dict(error)


@pytest.mark.parametrize("route", sorted(HEADERS))
@pytest.mark.parametrize("session", [None, "s-1"])
def test_each_once_fatal_chat_body_gets_an_openai_4xx(reliable_proxy, both, route, session):
    proxy = reliable_proxy()
    headers = dict(HEADERS[route])
    if session:
        headers["x-session-id"] = session
    for name, body in BAD_BODIES.items():
        raw = orjson.dumps(body) if name != "content 300 levels deep" else _dumps_deep(body)
        error = assert_openai_4xx(post(proxy, CHAT, raw, headers))
        assert error["type"] == "invalid_request_error", name
    assert both.chat.chat_requests == []


def _dumps_deep(body: dict[str, Any]) -> bytes:
    # orjson itself refuses to serialize past 254 levels: write it by hand.
    inner = b'"x"'
    for _ in range(300):
        inner = b"[" + inner + b"]"
    return b'{"model":"gpt-4o","messages":[{"role":"user","content":' + inner + b"}]}"


def test_nesting_past_the_limit_is_named_in_the_error(reliable_proxy):
    proxy = reliable_proxy()
    error = assert_openai_4xx(post(proxy, CHAT, _dumps_deep({}), {}))
    assert "nest" in error["message"]
    assert error["code"] == "invalid_json"


def test_an_echoed_value_is_capped(reliable_proxy):
    proxy = reliable_proxy()
    role = "r" * (1024 * 1024)
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": role, "content": "x"}]})
    response = post(proxy, CHAT, body, {"x-session-id": "s"})
    error = assert_openai_4xx(response)
    assert len(response.content) < 1000
    assert "…" in error["message"] or "..." in error["message"]


@pytest.mark.parametrize(
    ("where", "value"),
    [("user", "ユーザー"), ("metadata", "セッション-1"), ("user", "naïve ü")],
)
def test_non_latin1_session_id_round_trips_percent_encoded_and_is_stored_once(
    reliable_proxy, both, tmp_path, where, value
):
    proxy = reliable_proxy(session={"fallbacks": ["body.user", "body.metadata.session_id"]})
    body: dict[str, Any] = {"model": "gpt-4o", "messages": [user("hello")]}
    if where == "user":
        body["user"] = value
    else:
        body["metadata"] = {"session_id": value}
    response = post(proxy, CHAT, orjson.dumps(body), {"x-app": "server"})
    assert response.status_code == 200, response.text
    from urllib.parse import unquote

    assert unquote(response.headers["x-session-id"]) == value
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT key FROM sessions")
    assert [r["key"] for r in rows] == [value]
    items = query(tmp_path / "ctxproxy.db", "SELECT count(*) AS n FROM items")
    assert items[0]["n"] == 2


def test_session_id_in_a_header_with_high_latin1_bytes_round_trips(reliable_proxy):
    proxy = reliable_proxy()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    body = orjson.dumps({"model": "gpt-4o", "messages": [user()]})
    conn.putrequest("POST", CHAT)
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(len(body)))
    conn.putheader("x-session-id", "caf\u00e9".encode("utf-8"))
    conn.endheaders(body)
    response = conn.getresponse()
    assert response.status == 200
    response.read()
    conn.close()


def _raw_session_header(proxy: Any, raw: bytes, path: str = CHAT) -> tuple[int, str]:
    """A request whose X-Session-Id is these bytes as they are; (status, its X-Session-Id)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    body = orjson.dumps({"model": "gpt-4o", "messages": [user()]})
    conn.putrequest("POST", path)
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(len(body)))
    conn.putheader("x-session-id", raw)
    conn.putheader("x-app", "server")
    conn.putheader("authorization", "Bearer sk-header")  # anonymous requests store nothing
    conn.endheaders(body)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status, response.getheader("x-session-id") or ""


@pytest.mark.parametrize(
    ("raw", "meant"),
    [
        ("ユーザー-1".encode(), "ユーザー-1"),  # raw UTF-8: what most HTTP clients send
        ("café".encode(), "café"),
        (b"caf\xe9", "café"),  # not UTF-8: read as Latin-1, as before
    ],
)
def test_a_session_id_sent_as_raw_header_bytes_round_trips(
    reliable_proxy, tmp_path, monkeypatch, raw, meant
):
    monkeypatch.setenv("CTX_HEADER_ADMIN_KEY", "adm-header-0123456789")
    proxy = reliable_proxy(admin={"api_key": "os.environ/CTX_HEADER_ADMIN_KEY"})
    status, echoed = _raw_session_header(proxy, raw)
    assert status == 200
    from urllib.parse import quote, unquote

    assert unquote(echoed) == meant
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT tenant, key FROM sessions")
    assert [r["key"] for r in rows] == [meant]
    found = httpx.get(
        f"{proxy.url}/admin/sessions/{rows[0]['tenant']}/{quote(meant)}",
        headers={"Authorization": "Bearer adm-header-0123456789"},
    )
    assert found.status_code == 200 and found.json()["key"] == meant


def test_a_session_shared_by_responses_then_server_history_chat_keeps_working(reliable_proxy, both):
    proxy = reliable_proxy()
    headers = {"x-session-id": "shared"}
    first = post(
        proxy,
        "/v1/responses",
        orjson.dumps(
            {
                "model": "gpt-4o",
                "input": [
                    {"role": "user", "content": "call it"},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "42"},
                ],
            }
        ),
        headers,
    )
    assert first.status_code == 200, first.text
    proxy.drain()
    for _ in range(2):
        second = post(
            proxy,
            CHAT,
            orjson.dumps({"model": "gpt-4o", "messages": [user("and now?")]}),
            {**headers, "x-app": "server"},
        )
        assert second.status_code < 500, second.text
        if second.status_code != 200:
            error = assert_openai_4xx(second)
            assert "responses" in error["message"].lower()
        proxy.drain()


class RawConnection:
    """One keep-alive socket: no client library that reconnects behind the test's back."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def request(
        self, method: str, path: str, body: bytes = b"", **headers: str
    ) -> tuple[int, bytes]:
        lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", f"content-length: {len(body)}"]
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        response = http.client.HTTPResponse(self.sock)
        response.begin()
        data = response.read()
        assert not response.will_close, "the server closed the keep-alive connection"
        return response.status, data

    def close(self) -> None:
        self.sock.close()


def test_keep_alive_connection_stays_usable_after_an_unexpected_error(reliable_proxy):
    proxy = reliable_proxy()

    async def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    store = proxy.runtime.store
    original = store.history
    store.history = boom
    conn = RawConnection(proxy.port)
    try:
        body = orjson.dumps({"model": "gpt-4o", "messages": [user()]})
        headers = {
            "x_app": "server",
            "x_session_id": "s",
            "content_type": "application/json",
            "authorization": "Bearer sk-a",
        }
        status, data = conn.request("POST", CHAT, body, **headers)
        assert status == 500
        assert orjson.loads(data)["error"]["type"] == "server_error"
        assert b"a bug" not in data
        store.history = original
        status, data = conn.request("POST", CHAT, body, **headers)
        assert status == 200, data
        assert conn.request("GET", "/healthz")[0] == 200
    finally:
        store.history = original
        conn.close()


def test_the_same_connection_serves_requests_after_each_bad_body(reliable_proxy):
    proxy = reliable_proxy()
    conn = RawConnection(proxy.port)
    try:
        for name, body in BAD_BODIES.items():
            raw = _dumps_deep(body) if name == "content 300 levels deep" else orjson.dumps(body)
            status, data = conn.request("POST", CHAT, raw)
            assert 400 <= status < 500, (name, data[:200])
        ok = orjson.dumps({"model": "gpt-4o", "messages": [user()]})
        assert conn.request("POST", CHAT, ok)[0] == 200
    finally:
        conn.close()


RESPONSES_BAD: dict[str, dict[str, Any]] = {
    "input is a number": {"model": "gpt-4o", "input": 5},
    "input item is a string": {"model": "gpt-4o", "input": ["x"]},
    "role is a list": {"model": "gpt-4o", "input": [{"role": ["user"], "content": "x"}]},
    "tools is a number": {"model": "gpt-4o", "input": "x", "tools": 5},
    "previous id is a list": {"model": "gpt-4o", "input": "x", "previous_response_id": ["r"]},
    "call_id is an object": {
        "model": "gpt-4o",
        "input": [{"type": "function_call_output", "call_id": {"a": 1}, "output": "x"}],
    },
    "context_management is a string": {
        "model": "gpt-4o",
        "input": "x",
        "context_management": "compaction",
    },
    "compact_threshold is a string": {
        "model": "gpt-4o",
        "input": "x",
        "context_management": [{"type": "compaction", "compact_threshold": "10"}],
    },
    "a damaged ctxproxy compaction item": {
        "model": "gpt-4o",
        "input": [{"type": "compaction", "encrypted_content": "ctxproxy.compaction.v1:AAAA.00"}],
    },
}


@pytest.mark.parametrize("session", [None, "s-1"])
def test_each_bad_responses_body_gets_an_openai_4xx(reliable_proxy, both, session):
    proxy = reliable_proxy()
    headers = {"x-session-id": session} if session else {}
    for name, body in RESPONSES_BAD.items():
        error = assert_openai_4xx(post(proxy, "/v1/responses", orjson.dumps(body), headers))
        assert error["type"] == "invalid_request_error", name
        if "context_management" not in body:  # /compact reads no context_management
            error = assert_openai_4xx(
                post(proxy, "/v1/responses/compact", orjson.dumps(body), headers)
            )
            assert error["type"] == "invalid_request_error", name
    deep_body = b'{"model":"gpt-4o","input":' + b"[" * 300 + b"]" * 300 + b"}"
    assert_openai_4xx(post(proxy, "/v1/responses", deep_body, headers))

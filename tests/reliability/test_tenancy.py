"""Tenants: no key, no store (unless an anonymous tenant is named); client keys; 401s."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.config.loader import parse_config
from proxy.errors import ConfigError
from tests.harness import query

CHAT = "/v1/chat/completions"


def chat(proxy: Any, text: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        proxy.url + CHAT,
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": text}]},
        headers={"x-app": "server", **headers},
        timeout=10,
    )


def test_requests_without_a_key_are_proxied_but_nothing_is_stored(reliable_proxy, both, tmp_path):
    proxy = reliable_proxy()
    first = chat(proxy, "my secret is 42", {"x-session-id": "shared-name"})
    assert first.status_code == 200
    assert first.headers["x-context-store"] == "off-no-api-key"
    proxy.drain()
    # Another unauthenticated client naming the same session sees nothing of the first.
    second = chat(proxy, "what is my secret?", {"x-session-id": "shared-name"})
    assert second.status_code == 200
    forwarded = both.chat.chat_requests[-1].json["messages"]
    assert forwarded == [{"role": "user", "content": "what is my secret?"}]
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    assert query(db, "SELECT count(*) AS n FROM items")[0]["n"] == 0
    assert query(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 0


def test_a_named_anonymous_tenant_stores_requests_without_a_key(reliable_proxy, both, tmp_path):
    proxy = reliable_proxy(session={"anonymous_tenant": "public"})
    first = chat(proxy, "hello", {"x-session-id": "s"})
    assert first.headers["x-context-store"] == "anonymous-tenant"
    proxy.drain()
    chat(proxy, "again", {"x-session-id": "s"})
    assert len(both.chat.chat_requests[-1].json["messages"]) == 3
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT tenant, key FROM sessions")
    assert [(r["tenant"], r["key"]) for r in rows] == [("public", "s")]


def test_a_keyed_request_carries_no_store_header(reliable_proxy):
    proxy = reliable_proxy()
    response = chat(proxy, "hi", {"x-session-id": "s", "authorization": "Bearer sk-a"})
    assert "x-context-store" not in response.headers


@pytest.fixture
def keyed(reliable_proxy, both, monkeypatch, tmp_path):
    monkeypatch.setenv("CTX_ALICE", "ck-alice-secret")
    monkeypatch.setenv("CTX_BOB", "ck-bob-secret")
    monkeypatch.setenv("UPSTREAM_KEY", "sk-upstream")
    return reliable_proxy(
        server={
            "client_keys": ["os.environ/CTX_ALICE", {"name": "bob", "key": "os.environ/CTX_BOB"}]
        },
        upstreams={"default": {"base_url": f"{both.url}/v1", "api_key": "os.environ/UPSTREAM_KEY"}},
    )


GUARDED = [
    ("POST", CHAT),
    ("POST", "/v1/responses"),
    ("POST", "/v1/context/preview"),
    ("GET", "/v1/models"),
    ("GET", "/v1/responses/resp_1"),
    ("DELETE", "/v1/responses/resp_1"),
    ("GET", "/metrics"),
]


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", "Bearer ck-alice-secre", "ck-alice-secret"]
)
def test_without_a_valid_client_key_every_guarded_path_is_a_401(keyed, both, authorization):
    headers = {"authorization": authorization} if authorization else {}
    if authorization == "ck-alice-secret":
        headers = {"authorization": "Basic ck-alice-secret"}
    for method, path in GUARDED:
        response = httpx.request(
            method,
            keyed.url + path,
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
            headers=headers,
            timeout=10,
        )
        assert response.status_code == 401, (method, path, response.text)
        error = response.json()["error"]
        assert error["type"] == "authentication_error"
        assert error["code"] == "invalid_api_key"
    assert both.chat.received == []
    assert httpx.get(keyed.url + "/healthz").status_code == 200


def test_a_client_key_names_the_tenant_and_never_reaches_the_upstream(keyed, both, tmp_path):
    alice = {"authorization": "Bearer ck-alice-secret", "x-session-id": "s"}
    bob = {"authorization": "Bearer ck-bob-secret", "x-session-id": "s"}
    assert chat(keyed, "alice's", alice).status_code == 200
    keyed.drain()
    assert chat(keyed, "bob's", bob).status_code == 200
    keyed.drain()
    # Same session name, different tenants: bob does not see alice's turn.
    assert both.chat.chat_requests[-1].json["messages"] == [{"role": "user", "content": "bob's"}]
    for received in both.chat.chat_requests:
        assert received.headers["Authorization"] == "Bearer sk-upstream"
    rows = query(tmp_path / "ctxproxy.db", "SELECT tenant FROM sessions ORDER BY id")
    assert [r["tenant"] for r in rows] == ["CTX_ALICE", "bob"]
    metrics = httpx.get(keyed.url + "/metrics", headers={"authorization": "Bearer ck-bob-secret"})
    assert metrics.status_code == 200


def test_client_keys_from_a_file_of_hashes(reliable_proxy, both, tmp_path):
    digest = hashlib.sha256(b"ck-carol").hexdigest()
    (tmp_path / "keys.txt").write_text(f"# name sha256\ncarol {digest}\n")
    config_path = tmp_path / "config.yaml"
    config_path.write_text("")
    proxy = reliable_proxy(server={"client_keys": {"file": str(tmp_path / "keys.txt")}})
    assert chat(proxy, "x", {"authorization": "Bearer ck-carol"}).status_code == 200
    assert chat(proxy, "x", {"authorization": "Bearer ck-dave"}).status_code == 401


@pytest.mark.parametrize(
    ("client_keys", "message"),
    [
        (["ck-literal"], "os.environ/NAME"),
        ([{"name": "a", "key": "ck-literal"}], "not the key itself"),
        (["os.environ/CTX_UNSET_FOR_TEST"], "is not set"),
        ({"file": "/nonexistent/keys"}, "cannot read"),
        ([], "non-empty"),
    ],
)
def test_client_key_config_errors_name_the_path(client_keys, message):
    with pytest.raises(ConfigError) as error:
        parse_config(
            {
                "server": {"client_keys": client_keys},
                "upstreams": {"u": {"base_url": "http://127.0.0.1:1/v1"}},
                "routes": [{"match": {"path": CHAT}, "upstream": "u"}],
            }
        )
    assert "server.client_keys" in str(error.value)
    assert message in str(error.value)


def test_a_file_line_that_is_not_name_and_hash_is_refused(tmp_path: Path):
    (tmp_path / "keys.txt").write_text("carol not-a-hash\n")
    with pytest.raises(ConfigError, match=r"keys.txt:1"):
        parse_config(
            {
                "server": {"client_keys": {"file": str(tmp_path / "keys.txt")}},
                "upstreams": {"u": {"base_url": "http://127.0.0.1:1/v1"}},
                "routes": [{"match": {"path": CHAT}, "upstream": "u"}],
            }
        )

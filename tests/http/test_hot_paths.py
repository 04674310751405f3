"""The hot endpoints, dispatched before Starlette's router (proxy.app.ProxyApp)."""

from __future__ import annotations

import httpx


def test_a_post_is_answered_and_other_methods_go_the_routers_way(fake, start_proxy):
    proxy = start_proxy()
    chat = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": "Bearer sk-a"},
    )
    assert chat.status_code == 200 and chat.headers["x-context-policy"]
    # Not the chat endpoint's: the router's catch-all relays it (the fake answers 405).
    other = httpx.get(proxy.url + "/v1/chat/completions")
    assert other.status_code == 405 and "x-context-policy" not in other.headers


def test_a_bad_body_on_a_hot_path_is_a_json_400(fake, start_proxy):
    proxy = start_proxy()
    for path in ("/v1/chat/completions", "/v1/responses"):
        bad = httpx.post(proxy.url + path, content=b"{not json", headers={"x-session-id": "s"})
        assert bad.status_code == 400, path
        assert bad.json()["error"]["type"] == "invalid_request_error"

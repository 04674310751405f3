"""Every error the client sees is OpenAI's JSON error shape with a fitting status."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.fakes.upstream import Reply
from tests.harness import free_port, make_config, query
from tests.openapi import validate

URL = "/v1/chat/completions"


def post(proxy: Any, content: bytes | str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        proxy.url + URL,
        content=content,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer sk-x",
            **(headers or {}),
        },
        timeout=10,
    )


def assert_openai_error(
    response: httpx.Response, status: int, code: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    validate("ErrorResponse", body)
    assert "Traceback" not in response.text
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (b'{"model": "gpt-4o"}', "messages"),
        (b'{"model": "gpt-4o", "messages": "hi"}', "messages"),
        (b'{"model": "gpt-4o", "messages": [1]}', "messages[0]"),
        (b'{"model": "gpt-4o", "messages": [{"content": "x"}]}', "messages[0].role"),
        (
            b'{"model": "gpt-4o", "messages": [{"role": "wizard", "content": "x"}]}',
            "messages[0].role",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    ],
)
def test_malformed_requests_get_400_in_openai_shape(fake, start_proxy, payload, param):
    upstream, _ = fake
    proxy = start_proxy()
    error = assert_openai_error(post(proxy, payload), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert upstream.received == []


def test_body_over_the_limit_gets_413(fake, start_proxy):
    proxy = start_proxy(extra={"server": {"max_body_bytes": 4096}})
    big = '{"model": "gpt-4o", "messages": [{"role": "user", "content": "' + "x" * 5000 + '"}]}'
    assert_openai_error(post(proxy, big), 413, "request_too_large")


def test_body_over_the_limit_without_content_length_gets_413(fake, start_proxy):
    proxy = start_proxy(extra={"server": {"max_body_bytes": 4096}})

    def chunks() -> Any:
        yield b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    response = httpx.post(
        proxy.url + URL, content=chunks(), headers={"content-type": "application/json"}
    )
    assert_openai_error(response, 413, "request_too_large")


def test_unrouted_model_gets_404(fake, start_proxy):
    proxy = start_proxy(
        routes=[{"match": {"path": URL, "model": "gpt-4o*"}, "upstream": "default"}]
    )
    error = assert_openai_error(
        post(proxy, b'{"model": "claude-3", "messages": [{"role": "user", "content": "x"}]}'), 404
    )
    assert "claude-3" in error["message"]


def test_unknown_path_gets_404_in_openai_shape(fake, start_proxy):
    proxy = start_proxy()
    assert_openai_error(httpx.get(proxy.url + "/v1/nope"), 404)


def test_session_id_too_long_gets_400(fake, start_proxy):
    proxy = start_proxy()
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}'
    error = assert_openai_error(
        post(proxy, body, {"x-session-id": "s" * 257}), 400, "invalid_session_id"
    )
    assert "256" in error["message"]
    assert post(proxy, body, {"x-session-id": "s" * 256}).status_code == 200


def test_session_id_with_control_characters_gets_400(fake, start_proxy):
    proxy = start_proxy()
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}'
    assert_openai_error(post(proxy, body, {"x-session-id": "a\tb"}), 400, "invalid_session_id")


def test_unreachable_upstream_gets_502_and_is_recorded(tmp_path, start_proxy):
    config = make_config(f"http://127.0.0.1:{free_port()}", tmp_path)
    proxy = start_proxy(config=config)
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="k",
        max_retries=0,
        default_headers={"X-Session-Id": "s"},
    )
    with pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 502
    validate("ErrorResponse", info.value.response.json())
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    assert query(db, "SELECT count(*) AS n FROM items")[0]["n"] == 0
    row = query(db, "SELECT status, upstream_status, error FROM requests")[0]
    assert row["status"] == 502 and row["upstream_status"] is None and row["error"]


def test_upstream_timeout_gets_504(fake, start_proxy, tmp_path):
    upstream, server = fake
    upstream.replies.append(Reply(delay=2.0))
    config = make_config(server.url, tmp_path)
    import dataclasses

    config = dataclasses.replace(
        config,
        upstreams={"default": dataclasses.replace(config.upstreams["default"], timeout_s=0.3)},
    )
    proxy = start_proxy(config=config)
    response = post(proxy, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}')
    assert_openai_error(response, 504, "upstream_timeout")


@pytest.mark.parametrize("status", [400, 401, 429, 500, 503])
def test_upstream_errors_are_relayed_and_history_is_untouched(fake, start_proxy, tmp_path, status):
    upstream, _ = fake
    body = b'{"error": {"message": "upstream says no", "type": "x", "param": null, "code": "c"}}'
    proxy = start_proxy()
    headers = {"x-session-id": "keep"}
    ok = post(
        proxy, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "one"}]}', headers
    )
    assert ok.status_code == 200
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    before = query(db, "SELECT id, message_json FROM items ORDER BY id")
    head = query(db, "SELECT head_item_id FROM sessions")[0]["head_item_id"]
    upstream.replies.append(Reply(status=status, body=body))
    two = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "echo: one"}, {"role": "user", "content": "two"}]}'
    failed = post(proxy, two, headers)
    assert failed.status_code == status
    assert failed.content == body
    proxy.drain()
    assert [tuple(r) for r in query(db, "SELECT id, message_json FROM items ORDER BY id")] == [
        tuple(r) for r in before
    ]
    assert query(db, "SELECT head_item_id FROM sessions")[0]["head_item_id"] == head
    rows = query(db, "SELECT status, upstream_status, error FROM requests ORDER BY created_at")
    assert (rows[-1]["status"], rows[-1]["upstream_status"]) == (status, status)
    # A 5xx's row names the upstream's error; a refused request's status says it all.
    expected = f"c: The upstream answered {status}: upstream says no" if status >= 500 else None
    assert rows[-1]["error"] == expected

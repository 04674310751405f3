"""Chat completions end to end: the openai SDK -> ctxproxy -> the recording fake upstream."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.upstream import Reply
from tests.harness import query
from tests.openapi import validate

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def client(
    proxy: Any, session: str | None = "s1", key: str = "sk-test-1", **kw: Any
) -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key=key, default_headers=headers, max_retries=0, **kw
    )


def test_plain_completion_reaches_client_byte_for_byte(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy()
    raw = client(proxy).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
    )
    assert raw.http_response.content == upstream.last_response
    completion = raw.parse()
    assert completion.choices[0].message.content == "echo: hello"
    validate("CreateChatCompletionResponse", orjson.loads(raw.http_response.content))
    assert raw.headers["x-request-id"].startswith("req_chatcmpl-")


def test_request_bytes_reach_upstream_unchanged_with_passthrough(fake, start_proxy, tmp_path):
    upstream, server = fake
    # cache.prompt_cache_key off: no documented addition, the bytes are the client's.
    extra = {
        "upstreams": {
            "default": {"base_url": f"{server.url}/v1", "cache": {"prompt_cache_key": "off"}}
        }
    }
    proxy = start_proxy(extra=extra)
    sent: list[bytes] = []

    def capture(request: httpx.Request) -> None:
        sent.append(request.read())

    c = client(proxy, http_client=httpx.Client(event_hooks={"request": [capture]}))
    c.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        tools=[WEATHER_TOOL],
        response_format={"type": "json_object"},
        temperature=0.2,
        extra_body={"future_field": {"nested": [1, 2, 3]}, "metadata": {"k": "v"}},
    )
    assert upstream.received[-1].raw == sent[-1]
    body = upstream.received[-1].json
    assert body["future_field"] == {"nested": [1, 2, 3]}
    assert body["tools"] == [WEATHER_TOOL]
    assert body["response_format"] == {"type": "json_object"}


def test_passthrough_bytes_gain_only_the_session_prompt_cache_key(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy()
    sent: list[bytes] = []

    def capture(request: httpx.Request) -> None:
        sent.append(request.read())

    c = client(proxy, http_client=httpx.Client(event_hooks={"request": [capture]}))
    c.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"future_field": {"nested": [1, 2, 3]}},
    )
    raw = upstream.received[-1].raw
    key = upstream.received[-1].json["prompt_cache_key"]
    assert key.startswith("ctxproxy-") and "s1" not in key
    # Every byte the client sent, in order, then the one documented addition.
    assert raw == sent[-1][:-1] + b',"prompt_cache_key":"' + key.encode() + b'"}'


def test_client_key_is_forwarded_and_session_header_is_not(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy()
    client(proxy, key="sk-client-key").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    headers = {k.lower(): v for k, v in upstream.received[-1].headers.items()}
    assert headers["authorization"] == "Bearer sk-client-key"
    assert "x-session-id" not in headers


def test_configured_api_key_replaces_client_key(fake, start_proxy, tmp_path, monkeypatch):
    upstream, server = fake
    monkeypatch.setenv("CTX_TEST_KEY", "sk-configured")
    from proxy.config.loader import parse_config

    config = parse_config(
        {
            "store": {"path": str(tmp_path / "k.db")},
            "upstreams": {
                "default": {"base_url": f"{server.url}/v1", "api_key": "os.environ/CTX_TEST_KEY"}
            },
            "routes": [{"match": {"path": "/v1/chat/completions"}, "upstream": "default"}],
        }
    )
    proxy = start_proxy(config=config)
    client(proxy, key="sk-client").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    headers = {k.lower(): v for k, v in upstream.received[-1].headers.items()}
    assert headers["authorization"] == "Bearer sk-configured"


def test_stream_is_relayed_byte_for_byte_and_reply_is_stored(fake, start_proxy, tmp_path):
    upstream, _ = fake
    upstream.replies.append(Reply(content="streamed answer, in pieces"))
    proxy = start_proxy()
    c = client(proxy)
    with c.chat.completions.with_streaming_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "tell me"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        received = b"".join(response.iter_bytes())
        assert response.headers["x-context-policy"] == "passthrough"
    assert received == upstream.last_response
    for line in received.split(b"\n\n"):
        if line.startswith(b"data: {"):
            validate("CreateChatCompletionStreamResponse", orjson.loads(line[6:]))
    assert upstream.received[-1].json["stream_options"] == {"include_usage": True}
    proxy.drain()
    rows = query(
        tmp_path / "ctxproxy.db", "SELECT role, message_json, status FROM items ORDER BY id"
    )
    assert [r["role"] for r in rows] == ["user", "assistant"]
    assert json.loads(rows[1]["message_json"])["content"] == "streamed answer, in pieces"
    assert rows[1]["status"] == "complete"
    req = query(tmp_path / "ctxproxy.db", "SELECT * FROM requests")[0]
    assert req["stream"] == 1 and req["incomplete"] == 0
    assert json.loads(req["usage_json"])["completion_tokens"] == 5


def test_sdk_stream_iterates_content(fake, start_proxy):
    upstream, _ = fake
    upstream.replies.append(Reply(content="abcdefghij"))
    proxy = start_proxy()
    stream = client(proxy).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == "abcdefghij"


def test_tool_call_round_trip_is_stored_once_per_message(fake, start_proxy, tmp_path):
    upstream, _ = fake
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    upstream.replies += [Reply(content=None, tool_calls=[call]), Reply(content="It is sunny.")]
    proxy = start_proxy()
    c = client(proxy)
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = c.chat.completions.create(model="gpt-4o", messages=messages, tools=[WEATHER_TOOL])
    tool_call = first.choices[0].message.tool_calls[0]
    assert tool_call.function.arguments == '{"city": "Paris"}'
    messages.append(first.choices[0].message)
    messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "sunny, 24C"})
    second = c.chat.completions.create(model="gpt-4o", messages=messages, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It is sunny."
    sent = upstream.received[-1].json["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_1"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24C"}
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    items = query(db, "SELECT id, parent_id, role FROM items ORDER BY id")
    # user, assistant(tool_calls), tool, assistant: the resent prefix is not duplicated
    assert [r["role"] for r in items] == ["user", "assistant", "tool", "assistant"]
    assert [r["parent_id"] for r in items] == [None, items[0]["id"], items[1]["id"], items[2]["id"]]
    session = query(db, "SELECT head_item_id FROM sessions")[0]
    assert session["head_item_id"] == items[3]["id"]


def test_streamed_tool_calls_are_assembled_for_storage(fake, start_proxy, tmp_path):
    upstream, _ = fake
    call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome, Italy"}'},
    }
    upstream.replies.append(Reply(content=None, tool_calls=[call]))
    proxy = start_proxy()
    stream = client(proxy).chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Rome?"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    list(stream)
    proxy.drain()
    row = query(tmp_path / "ctxproxy.db", "SELECT message_json FROM items WHERE role='assistant'")
    stored = json.loads(row[0]["message_json"])
    assert stored["tool_calls"] == [call]


def test_ollamas_tool_calls_all_at_index_zero_are_stored_as_separate_calls(
    fake, start_proxy, tmp_path
):
    """Ollama streams each call whole under index 0: the stored reply has each call
    apart, and the client gets the upstream's bytes as they came."""
    upstream, _ = fake
    upstream.tool_calls_at_index_zero = True
    calls = [
        {
            "id": f"call_{city}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        for city in ("Rome", "Oslo", "Lima")
    ]
    upstream.replies.append(Reply(content=None, tool_calls=calls))
    proxy = start_proxy()
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/chat/completions",
        json={
            "model": "llama3.2",
            "messages": [{"role": "user", "content": "Weather in three cities?"}],
            "tools": [WEATHER_TOOL],
            "stream": True,
        },
        headers={"authorization": "Bearer k", "x-session-id": "ollama"},
    ) as response:
        received = b"".join(response.iter_bytes())
    assert received == upstream.last_response
    proxy.drain()
    row = query(tmp_path / "ctxproxy.db", "SELECT message_json FROM items WHERE role='assistant'")
    assert json.loads(row[0]["message_json"])["tool_calls"] == calls


def test_context_headers_on_every_response(fake, start_proxy):
    proxy = start_proxy()
    raw = client(proxy, session="abc").chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    h = raw.headers
    assert h["x-session-id"] == "abc"
    assert h["x-context-policy"] == "passthrough"
    assert int(h["x-context-tokens-before"]) == int(h["x-context-tokens-after"]) > 0
    assert h["x-context-messages-dropped"] == "0"


def test_models_and_healthz(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy()
    before = len(upstream.received)
    assert httpx.get(f"{proxy.url}/healthz").json() == {"status": "ok"}
    assert len(upstream.received) == before
    models = client(proxy).models.list()
    assert [m.id for m in models.data] == ["gpt-4o", "gpt-4o-mini"]
    assert client(proxy).models.retrieve("gpt-4o").id == "gpt-4o"


@pytest.mark.parametrize("parts", [True, False])
def test_content_parts_pass_through(fake, start_proxy, parts):
    upstream, _ = fake
    proxy = start_proxy()
    content: Any = (
        [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ]
        if parts
        else "plain"
    )
    client(proxy).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": content}]
    )
    assert upstream.received[-1].json["messages"][0]["content"] == content


def test_unusual_json_formatting_reaches_upstream_as_sent(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy()
    # Whitespace, key order, escapes and number forms that a re-serialiser would change.
    raw = (
        b'{ "temperature" : 1.0e0, "model":"gpt-4o",\n  "messages" : [ {"content": "caf\\u00e9",'
        b' "role":"user"} ], "x_unknown": {"b": 2, "a": 1} }'
    )
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=raw,
        headers={
            "content-type": "application/json",
            "x-session-id": "fmt",
            "authorization": "Bearer sk-x",
        },
    )
    assert response.status_code == 200
    # The one documented addition (the session's prompt_cache_key) aside, byte for byte.
    key = upstream.received[-1].json["prompt_cache_key"]
    added = b',"prompt_cache_key":"' + key.encode() + b'"'
    assert upstream.received[-1].raw == raw[:-1] + added + raw[-1:]

"""count_tokens, the model list in Anthropic's shape, and errors in Anthropic's shape,
with the official ``anthropic`` SDK as the client."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from proxy.context.tokens import counter_for
from proxy.messages.view import chat_view
from tests.fakes.anthropic import FakeAnthropic, Reply, closed_port
from tests.fakes.upstream import FakeUpstream
from tests.harness import AiohttpServer, ProxyServer, query
from tests.messages.sdk import sdk_client

MODEL = "claude-fake-1"


def long_chat(turns: int) -> list[Any]:
    out: list[Any] = []
    for i in range(turns):
        out += [
            {"role": "user", "content": f"question {i} " + "words " * 50},
            {"role": "assistant", "content": f"answer {i} " + "words " * 50},
        ]
    return [*out, {"role": "user", "content": "and now?"}]


def test_count_tokens_goes_to_an_anthropic_upstream_as_the_policy_would_forward_it(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"}, {"strategy": "trim", "max_turns": 2}
    )
    client = sdk_client(proxy)
    messages = long_chat(6)
    counted = client.messages.count_tokens(model=MODEL, messages=messages)
    sent = claude.requests[0]
    assert sent.path == "/v1/messages/count_tokens"
    # The last two turns: what /v1/messages would forward, so the count and the
    # usage.input_tokens the client then sees agree.
    assert sent.json["messages"] == messages[-3:]
    assert counted.input_tokens > 0
    client.messages.create(model=MODEL, max_tokens=8, messages=messages)
    forwarded = claude.requests[1].json["messages"]
    assert len(forwarded) == 3 and forwarded[0] == messages[-3] and forwarded[2] == messages[-1]
    # Nothing of a count is recorded: one request row, the message's.
    proxy.drain()
    assert len(query(tmp_path / "ctxproxy.db", "SELECT id FROM requests")) == 1


def test_count_tokens_for_a_translated_upstream_uses_the_models_tokenizer(
    fake: tuple[FakeUpstream, AiohttpServer], start_messages: Callable[..., ProxyServer]
) -> None:
    upstream, server = fake
    proxy = start_messages({"base_url": f"{server.url}/v1"})
    body: dict[str, Any] = {
        "model": "gpt-4o",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    }
    counted = sdk_client(proxy).messages.count_tokens(**body)
    counter = counter_for("gpt-4o")
    expected = counter.count_messages(chat_view(body)) + counter.count_request_fixed(body)
    assert counted.input_tokens == expected
    assert upstream.received == []  # counted here, not asked


def test_models_answer_in_anthropics_shape_to_an_anthropic_client_and_openais_otherwise(
    claude: FakeAnthropic,
    fake: tuple[FakeUpstream, AiohttpServer],
    start_messages: Callable[..., ProxyServer],
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        upstreams={
            "up": {"base_url": f"{claude.url}/v1", "api": "anthropic"},
            "openai": {"base_url": f"{fake[1].url}/v1"},
        },
    )
    page = sdk_client(proxy).models.list()
    ids = [m.id for m in page.data]
    assert ids == [MODEL, "gpt-4o", "gpt-4o-mini"]
    gpt = next(m for m in page.data if m.id == "gpt-4o")
    assert gpt.type == "model" and gpt.display_name == "gpt-4o"
    assert gpt.max_input_tokens == 128000  # litellm's model map: the context window
    plain = httpx.get(f"{proxy.url}/v1/models", headers={"authorization": "Bearer k"}).json()
    assert plain["object"] == "list"
    assert [m["id"] for m in plain["data"]] == ids
    assert all(m["object"] == "model" for m in plain["data"])
    # One model, too: the SDK's retrieve reads Anthropic's shape.
    one = sdk_client(proxy).models.retrieve("gpt-4o-mini")
    assert one.type == "model" and one.id == "gpt-4o-mini" and one.max_input_tokens == 128000


def test_an_upstream_error_reaches_the_sdk_as_anthropic_sent_it(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    claude.script(Reply.error(429, "rate_limit_error", "Slow down.", retry_after="3"))
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk_client(proxy).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Slow down."},
    }
    assert caught.value.response.headers["retry-after"] == "3"


def test_the_proxys_own_errors_have_anthropics_shape_and_status(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    client = sdk_client(proxy)
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "tool", "content": "no such role"}],  # type: ignore[typeddict-item]
        )
    assert bad.value.body["type"] == "error"  # type: ignore[index]
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages.0.role" in bad.value.body["error"]["message"]  # type: ignore[index]
    # Not JSON at all: still Anthropic's shape.
    raw = httpx.post(f"{proxy.url}/v1/messages", content=b"{oops", headers={"x-api-key": "k"})
    assert raw.status_code == 400
    assert raw.json()["type"] == "error"
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert claude.requests == []  # nothing reached the upstream


def test_an_unreachable_upstream_is_a_502_in_anthropics_shape(
    start_messages: Callable[..., ProxyServer],
) -> None:
    proxy = start_messages({"base_url": f"http://127.0.0.1:{closed_port()}/v1", "api": "anthropic"})
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk_client(proxy).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 502
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_an_in_stream_error_reaches_the_sdk_as_an_error_event(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    claude.script(Reply(text="partial answer", stream_error=("overloaded_error", "Overloaded")))
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        sdk_client(proxy).messages.stream(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        stream.get_final_message()
    assert "Overloaded" in str(caught.value)


def test_client_keys_accept_x_api_key_and_refuse_others_in_anthropics_shape(
    claude: FakeAnthropic,
    start_messages: Callable[..., ProxyServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTX_TEAM", "team-key")
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic", "api_key": "sk-upstream"},
        server={"client_keys": [{"name": "team", "key": "os.environ/CTX_TEAM"}]},
    )
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    ok = httpx.post(f"{proxy.url}/v1/messages", json=body, headers={"x-api-key": "team-key"})
    assert ok.status_code == 200
    # The client's key is consumed; the upstream gets the configured one as x-api-key.
    sent = claude.requests[0].headers
    assert sent["x-api-key"] == "sk-upstream" and "authorization" not in sent
    with pytest.raises(anthropic.AuthenticationError) as caught:
        sdk_client(proxy, key="wrong").messages.create(**body)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Invalid or missing client API key."},
    }


def test_requests_litellm_cannot_translate_are_400s_not_500s(
    fake: tuple[FakeUpstream, AiohttpServer], start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{fake[1].url}/v1"})
    url, headers = f"{proxy.url}/v1/messages", {"x-api-key": "k"}
    user = [{"role": "user", "content": "hi"}]
    # litellm's first import (on the second request, the translated path) takes seconds
    # on a loaded machine: more than httpx's default 5 s timeout.
    missing = httpx.post(
        url, json={"model": "gpt-4o", "messages": user}, headers=headers, timeout=60
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["message"].startswith("max_tokens: Field required")
    empty = httpx.post(
        url, json={"model": "gpt-4o", "max_tokens": 5, "messages": []}, headers=headers, timeout=60
    )
    assert empty.status_code == 400
    assert empty.json()["error"]["type"] == "invalid_request_error"
    # Fields the API takes as objects (litellm's translator crashed on a list: the fuzz's
    # find), and tools that are not objects: the client's error, named.
    base = {"model": "gpt-4o", "max_tokens": 5, "messages": user}
    for field, value, param in [
        ("thinking", [], "thinking"),
        ("metadata", "x", "metadata"),
        ("tool_choice", ["auto"], "tool_choice"),
        ("tools", [1], "tools"),
    ]:
        bad = httpx.post(url, json={**base, field: value}, headers=headers, timeout=60)
        assert bad.status_code == 400, (field, bad.text)
        assert bad.json()["error"]["message"].startswith(f"{param}:"), bad.text
    assert fake[0].received == []

"""``responses: bridge``: Responses clients served by an upstream that only has chat completions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import structlog

from proxy.config.loader import parse_config
from proxy.errors import ConfigError
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.anthropic import Reply as AnthropicReply
from tests.fakes.upstream import Reply
from tests.harness import ProxyServer, query
from tests.openapi import validate

# litellm builds some pydantic schemas lazily, on first use; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


def bridged(url: str, tmp_path: Path, policy: str = "passthrough") -> Any:
    return parse_config(
        {
            "store": {"path": str(tmp_path / "ctxproxy.db")},
            "upstreams": {"vllm": {"base_url": f"{url}/v1", "timeout_s": 5, "responses": "bridge"}},
            "routes": [{"match": {"path": "/v1/responses"}, "upstream": "vllm", "policy": policy}],
            "policies": {"last2": {"strategy": "trim", "max_turns": 2}},
        }
    )


def client(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-b", max_retries=0)


def chat_messages(fake: Any) -> list[tuple[str, Any]]:
    """What the chat upstream got: (role, content or tool call ids) per message."""
    out = []
    for m in fake.received[-1].json["messages"]:
        if m.get("tool_calls"):
            out.append((m["role"], [c["id"] for c in m["tool_calls"]]))
        elif m["role"] == "tool":
            out.append(("tool", m["tool_call_id"]))
        else:
            content = m["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            out.append((m["role"], text))
    return out


def test_bridged_answer_is_a_responses_object_made_from_a_chat_completion(
    fake, start_proxy, tmp_path
):
    upstream, server = fake
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    raw = client(proxy).responses.with_raw_response.create(
        model="gpt-4o", input="hello", instructions="be brief"
    )
    response = raw.parse()

    assert upstream.received[-1].path == "/v1/chat/completions"
    assert upstream.received[-1].headers["Authorization"] == "Bearer sk-b"
    assert chat_messages(upstream) == [("system", "be brief"), ("user", "hello")]
    assert response.output_text == "echo: hello"
    assert response.model == "gpt-4o"
    validate("Response", orjson.loads(raw.http_response.content))
    assert raw.headers["x-session-id"] == f"resp:{response.id}"


def test_bridged_chain_is_rebuilt_and_trimmed_by_the_proxy(fake, start_proxy, tmp_path):
    upstream, server = fake
    proxy = start_proxy(config=bridged(server.url, tmp_path, "last2"))
    c = client(proxy)
    previous = None
    for turn in range(4):
        chained = {"previous_response_id": previous} if previous else {}
        previous = c.responses.create(model="gpt-4o", input=f"turn {turn}", **chained).id

    assert chat_messages(upstream) == [
        ("user", "turn 2"),
        ("assistant", "echo: turn 2"),
        ("user", "turn 3"),
    ]
    assert c.responses.retrieve(previous).output_text == "echo: turn 3"


def test_bridged_stream_events_match_the_spec_and_chain(fake, start_proxy, tmp_path):
    upstream, server = fake
    upstream.replies.append(Reply(content="streamed through the bridge"))
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    c = client(proxy)
    with c.responses.with_streaming_response.create(model="gpt-4o", input="go", stream=True) as r:
        received = b"".join(r.iter_bytes())
    events = []
    for block in received.split(b"\n\n"):
        if block.strip():
            fields = dict(line.split(b": ", 1) for line in block.split(b"\n"))
            events.append(orjson.loads(fields[b"data"]))
            assert fields[b"event"].decode() == events[-1]["type"]
    for event in events:
        validate("ResponseStreamEvent", event)
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["output"][0]["content"][0]["text"] == "streamed through the bridge"

    c.responses.create(model="gpt-4o", input="more", previous_response_id=final["response"]["id"])
    assert chat_messages(upstream)[:2] == [
        ("user", "go"),
        ("assistant", "streamed through the bridge"),
    ]


def test_bridged_function_calling_round_trip(fake, start_proxy, tmp_path):
    upstream, server = fake
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    upstream.replies += [Reply(content=None, tool_calls=[call]), Reply(content="Cold.")]
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    c = client(proxy)
    first = c.responses.create(model="gpt-4o", input="Oslo?", tools=[WEATHER])
    fc = first.output[0]
    assert (fc.type, fc.call_id, fc.arguments) == ("function_call", "call_7", '{"city":"Oslo"}')
    assert upstream.received[-1].json["tools"][0]["function"]["name"] == "get_weather"

    second = c.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": "call_7", "output": "-3C"}],
    )
    assert second.output_text == "Cold."
    assert chat_messages(upstream) == [
        ("user", "Oslo?"),
        ("assistant", ["call_7"]),
        ("tool", "call_7"),
    ]


def test_unknown_previous_response_id_cannot_be_served_by_a_bridge(fake, start_proxy, tmp_path):
    upstream, server = fake
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    with pytest.raises(openai.BadRequestError) as failed:
        client(proxy).responses.create(
            model="gpt-4o", input="x", previous_response_id="resp_nowhere"
        )

    assert failed.value.code == "previous_response_not_found"
    assert upstream.received == []


def test_ids_a_bridge_never_stored_are_not_found_without_asking_it(fake, start_proxy, tmp_path):
    upstream, server = fake
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    response = httpx.get(f"{proxy.url}/v1/responses/resp_nowhere")

    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert upstream.received == []


def test_chat_upstream_error_is_relayed_in_openai_shape(fake, start_proxy, tmp_path):
    upstream, server = fake
    upstream.replies.append(
        Reply(
            status=429,
            body=b'{"error": {"message": "slow down", "type": "rate_limit_error", "param": null, "code": null}}',
        )
    )
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    with pytest.raises(openai.RateLimitError) as failed:
        client(proxy).responses.create(model="gpt-4o", input="x")

    assert "slow down" in failed.value.message


def test_chained_turn_reaches_a_server_that_takes_only_string_content(fake, start_proxy, tmp_path):
    """llama-cpp-python's chat formats take ``content`` as a string: the stored
    assistant turn, replayed as text parts, is sent joined into one."""
    upstream, server = fake
    upstream.string_content_only = True
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    c = client(proxy)
    first = c.responses.create(model="gpt-4o", input="one", instructions="be brief")
    second = c.responses.create(
        model="gpt-4o",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "two"}]}],
        previous_response_id=first.id,
    )

    assert second.output_text == "echo: two"
    assert [(m["role"], m["content"]) for m in upstream.received[-1].json["messages"]] == [
        ("user", "one"),
        ("assistant", "echo: one"),
        ("user", "two"),
    ]


def test_upstream_5xx_through_the_bridge_is_named_in_the_row_and_the_log_line(
    fake, start_proxy, tmp_path
):
    upstream, server = fake
    upstream.replies.append(Reply(status=500))
    proxy = start_proxy(config=bridged(server.url, tmp_path))
    with structlog.testing.capture_logs() as logs, pytest.raises(openai.InternalServerError):
        client(proxy).responses.create(
            model="gpt-4o", input="x", extra_headers={"x-session-id": "s5"}
        )
    proxy.drain()

    [row] = query(tmp_path / "ctxproxy.db", "SELECT status, error FROM requests")
    assert row["status"] == 500
    assert "The upstream answered 500" in row["error"]
    assert "scripted failure" in row["error"]
    [line] = [e for e in logs if e["event"] == "request_completed"]
    assert line["error"] == row["error"] and line["log_level"] == "warning"


@pytest.mark.parametrize(
    ("upstream", "error"),
    [
        (
            {"base_url": "http://h/v1", "responses": "sometimes"},
            "upstreams.u.responses: must be native or bridge",
        ),
        (
            {"litellm_model": "anthropic/claude", "responses": "native"},
            "upstreams.u.responses: must be bridge",
        ),
    ],
)
def test_responses_mode_is_validated_with_its_path(upstream: dict[str, Any], error: str) -> None:
    data = {"upstreams": {"u": upstream}, "routes": [{"upstream": "u"}]}
    with pytest.raises(ConfigError, match=error.replace(".", r"\.")):
        parse_config(data)


def test_responses_mode_defaults_to_native_and_to_bridge_for_litellm_models() -> None:
    config = parse_config(
        {
            "upstreams": {
                "a": {"base_url": "http://h/v1"},
                "b": {"litellm_model": "anthropic/claude"},
            },
            "routes": [{"upstream": "a"}],
        }
    )
    assert (config.upstreams["a"].responses, config.upstreams["b"].responses) == (
        "native",
        "bridge",
    )


def test_litellm_provider_upstream_serves_responses_through_the_bridge(loop_thread, tmp_path):
    anthropic = FakeAnthropic()
    loop_thread.run(anthropic.start())
    config = parse_config(
        {
            "store": {"path": str(tmp_path / "a.db")},
            "upstreams": {
                "claude": {
                    "litellm_model": "anthropic/claude-sonnet-4-5",
                    "api_base": anthropic.url,
                    "timeout_s": 10,
                }
            },
            "routes": [{"match": {"path": "/v1/responses"}, "upstream": "claude"}],
        }
    )
    proxy = ProxyServer(loop_thread, config)
    try:
        anthropic.script(AnthropicReply(text="Bonjour."), AnthropicReply(text="Au revoir."))
        c = client(proxy)
        first = c.responses.create(
            model="my-claude", input="Say hello in French.", instructions="Be terse."
        )
        second = c.responses.create(
            model="my-claude", input="Now goodbye.", previous_response_id=first.id
        )
    finally:
        proxy.stop()
        loop_thread.run(anthropic.stop())

    assert (first.output_text, second.output_text) == ("Bonjour.", "Au revoir.")
    assert second.model == "my-claude"
    sent = anthropic.requests[-1].json
    assert [
        (m["role"], m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
        for m in sent["messages"]
    ] == [
        ("user", "Say hello in French."),
        ("assistant", "Bonjour."),
        ("user", "Now goodbye."),
    ]
    assert "system" not in sent  # the first response's instructions are not inherited

"""An OpenAI client talks to an Anthropic-shaped provider through the proxy, unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.config.loader import parse_config
from tests.fakes.anthropic import FakeAnthropic, Reply
from tests.harness import LoopThread, ProxyServer, query

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def anthropic(loop_thread: LoopThread) -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic()
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())


@pytest.fixture
def proxy(
    loop_thread: LoopThread, anthropic: FakeAnthropic, tmp_path: Path
) -> Iterator[ProxyServer]:
    config = parse_config(
        {
            "store": {"path": str(tmp_path / "p.db")},
            "upstreams": {
                "claude": {
                    "litellm_model": "anthropic/claude-sonnet-4-5",
                    "api_base": anthropic.url,
                    "timeout_s": 10,
                }
            },
            "routes": [
                {
                    "match": {"path": "/v1/chat/completions", "model": "claude*"},
                    "upstream": "claude",
                    "policy": "last2",
                }
            ],
            "policies": {"last2": {"strategy": "trim", "max_turns": 2}},
        }
    )
    server = ProxyServer(loop_thread, config)
    yield server
    server.stop()


def client(proxy: ProxyServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-ant-client",
        max_retries=0,
        default_headers={"X-Session-Id": "claude-chat"},
    )


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "three"},
    ]


def test_openai_client_gets_an_openai_answer_from_anthropic_with_policy_applied(
    proxy, anthropic, tmp_path
):
    anthropic.script(Reply(text="Three it is."))
    completion = client(proxy).chat.completions.create(
        model="claude-sonnet-4-5", messages=conversation()
    )
    assert completion.choices[0].message.content == "Three it is."
    assert completion.model == "claude-sonnet-4-5"
    sent = anthropic.requests[-1]
    assert sent.headers["x-api-key"] == "sk-ant-client"
    system = sent.json["system"]
    assert (system if isinstance(system, str) else system[0]["text"]) == "Be terse."
    # max_turns: 2 -> the first turn ("one", "1") never reached the provider.
    texts = [
        block["text"] if isinstance(block, dict) else block
        for m in sent.json["messages"]
        for block in (m["content"] if isinstance(m["content"], list) else [m["content"]])
    ]
    assert "one" not in texts and "two" in texts and "three" in texts
    proxy.drain()
    assert (
        query(tmp_path / "p.db", "SELECT count(*) AS n FROM items")[0]["n"]
        == len(conversation()) + 1
    )


def test_streaming_from_anthropic_arrives_as_openai_chunks(proxy, anthropic, tmp_path):
    anthropic.script(Reply(text="streamed from claude"))
    stream = client(proxy).chat.completions.create(
        model="claude-sonnet-4-5", messages=conversation(), stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "streamed from claude"
    proxy.drain()
    rows = query(
        tmp_path / "p.db",
        "SELECT message_json FROM items WHERE role = 'assistant' ORDER BY id DESC",
    )
    assert "streamed from claude" in rows[0]["message_json"]


def test_provider_error_reaches_the_client_as_openai_error(proxy, anthropic):
    anthropic.script(Reply.error(429, "rate_limit_error", "slow down"))
    with pytest.raises(openai.RateLimitError) as info:
        client(proxy).chat.completions.create(model="claude-sonnet-4-5", messages=conversation())
    assert "slow down" in info.value.response.json()["error"]["message"]

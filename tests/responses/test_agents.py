"""The openai-agents SDK's Runner, with its default Responses model, through the proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.fakes.responses import Call, FakeResponses, RReply
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query

agents = pytest.importorskip("agents", reason="the openai-agents dev extra is not installed")


@pytest.fixture
def upstream(
    responses_upstream: tuple[FakeResponses, AiohttpServer],
) -> tuple[FakeResponses, AiohttpServer]:
    return responses_upstream


@pytest.fixture
def proxy(
    loop_thread: LoopThread, upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path
) -> Iterator[ProxyServer]:
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "last3"}]
    policies = {"last3": {"strategy": "trim", "max_turns": 3}}
    server = ProxyServer(
        loop_thread, make_config(upstream[1].url, tmp_path, policies=policies, routes=routes)
    )
    yield server
    server.stop()


@pytest.fixture
def agent(proxy: ProxyServer) -> Iterator[Any]:
    client = AsyncOpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-agents",
        max_retries=0,
        default_headers={"X-Session-Id": "agent-1"},
    )
    agents.set_default_openai_client(client, use_for_tracing=False)
    agents.set_default_openai_api("responses")
    agents.set_tracing_disabled(True)
    looked_up: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return f"sunny and 24C in {city}"

    yield (
        agents.Agent(name="forecaster", instructions="Answer briefly.", tools=[get_weather]),
        looked_up,
    )
    agents.set_tracing_disabled(False)


async def test_runner_completes_a_multi_turn_conversation_with_a_tool(upstream, agent, tmp_path):
    fake, _ = upstream
    forecaster, looked_up = agent
    fake.replies += [
        RReply(text=None, calls=[Call("get_weather", '{"city": "Paris"}')]),
        RReply(text="Sunny in Paris."),
        RReply(text="Still sunny tomorrow."),
        RReply(text="You asked about Paris."),
    ]

    first = await agents.Runner.run(forecaster, "Weather in Paris?")
    assert first.final_output == "Sunny in Paris."
    assert looked_up == ["Paris"]
    # The SDK sent its tool round trip as explicit input; the pair reached the upstream intact.
    kinds = [i.get("type", "message") for i in fake.last["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]
    assert fake.last["instructions"] == "Answer briefly."

    # Second turn chained by id: the proxy rebuilds the chain from its store.
    second = await agents.Runner.run(
        forecaster, "And tomorrow?", previous_response_id=first.last_response_id
    )
    assert second.final_output == "Still sunny tomorrow."
    assert "previous_response_id" not in fake.last
    kinds = [i.get("type", "message") for i in fake.last["input"]]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message"]

    # Third turn the SDK's own way: the whole history as input.
    history = [*first.to_input_list(), *second.to_input_list()]
    third = await agents.Runner.run(
        forecaster, [*history, {"role": "user", "content": "What city was it?"}]
    )
    assert third.final_output == "You asked about Paris."
    assert len(fake.received) == 4
    sessions = query(tmp_path / "ctxproxy.db", "SELECT key FROM sessions")
    assert [s["key"] for s in sessions] == ["agent-1"]
    # The SDK resent the history its own way; the store recognised every item of it.
    rows = query(tmp_path / "ctxproxy.db", "SELECT role FROM items ORDER BY id")
    assert [r["role"] for r in rows] == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]

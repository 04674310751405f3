"""Recall on /v1/responses: the openai SDK chains with previous_response_id through the proxy.

An early turn the budget evicted comes back, quoted, when a question needs it;
a function call comes back with its output; what is forwarded before the
recall block is the previous request's, byte for byte; and no function call
or output reaches the upstream without its other half.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from policies.recall import BLOCK_OPEN
from tests.chat.test_recall_e2e import ORDER_TURN, POLICY, recall_row, user_turn
from tests.fakes.responses import Call, FakeResponses, RReply
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config
from tests.openapi import validate
from tests.responses.test_e2e import WEATHER

# The chat test's policy (tests/chat/test_recall_e2e.py) with a smaller budget.
POLICIES = {"support": {**POLICY["support"], "max_tokens": 900}}
TOOL_OUTPUT = "Forecast for Villeurbanne: heavy hailstorm expected, couriers suspended."


@pytest.fixture
def proxy(
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    tmp_path: Path,
) -> Iterator[ProxyServer]:
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "support"}]
    config = make_config(responses_upstream[1].url, tmp_path, policies=POLICIES, routes=routes)
    server = ProxyServer(loop_thread, config)
    yield server
    server.stop()


def block_at(items: list[dict[str, Any]]) -> int | None:
    for i, item in enumerate(items):
        content = item.get("content")
        if isinstance(content, str) and BLOCK_OPEN in content:
            return i
    return None


def quoted(item: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in item["content"].splitlines() if line.startswith("{")]


def paired(items: list[dict[str, Any]]) -> bool:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    return sorted(calls) == sorted(outputs)


def chain(
    proxy: ProxyServer, fake: FakeResponses, turns: int, on_turn: Callable[[int], None]
) -> tuple[openai.OpenAI, str]:
    """``turns`` chained requests (turn 5 calls the weather tool); the last response's id."""
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-a", max_retries=0)
    previous: str | None = None
    for t in range(1, turns + 1):
        if t == 5:
            fake.replies += [
                RReply(text=None, calls=[Call("get_weather", '{"city": "Villeurbanne"}')]),
                RReply(text="Noted the forecast."),
            ]
        chained = {"previous_response_id": previous} if previous else {}
        response = c.responses.create(
            model="gpt-4o", input=user_turn(t), tools=[WEATHER], **chained
        )
        if t == 5:
            call = next(o for o in response.output if o.type == "function_call")
            output = {"type": "function_call_output", "call_id": call.call_id}
            response = c.responses.create(
                model="gpt-4o",
                input=[{**output, "output": TOOL_OUTPUT}],
                tools=[WEATHER],
                previous_response_id=response.id,
            )
        previous = response.id
        proxy.drain()
        on_turn(t)
    assert previous is not None
    return c, previous


def test_an_evicted_turn_and_a_tool_call_with_its_output_come_back_for_questions_about_them(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path
) -> None:
    fake, _ = responses_upstream
    c, previous = chain(proxy, fake, 40, lambda t: None)
    first = c.responses.with_raw_response.create(
        model="gpt-4o",
        input="What did the weather tool say about Villeurbanne?",
        tools=[WEATHER],
        previous_response_id=previous,
    )
    proxy.drain()
    earlier = fake.last["input"]
    raw = c.responses.with_raw_response.create(
        model="gpt-4o",
        input="Remind me, what delivery address did I give for the order?",
        tools=[WEATHER],
        previous_response_id=first.parse().id,
    )
    proxy.drain()
    last = fake.last["input"]
    validate("CreateResponse", fake.last)

    # The tool call was evicted, and came back with its output, both quoted.
    at = block_at(earlier)
    assert at is not None and at == len(earlier) - 2
    assert not any(i.get("type") == "function_call" for i in earlier)
    lines = quoted(earlier[at])
    kinds = {line["role"]: line for line in lines if "call_id" in line}
    assert kinds["function_call"]["call_id"] == kinds["function_call_output"]["call_id"]
    assert kinds["function_call_output"]["text"] == TOOL_OUTPUT
    assert "Villeurbanne" in kinds["function_call"]["text"]

    # Turn 3 was evicted and came back, quoted right before the question.
    at = block_at(last)
    assert at is not None and at == len(last) - 2
    assert not any(i.get("content") == ORDER_TURN for i in last)
    assert last[-1] == {
        "role": "user",
        "content": "Remind me, what delivery address did I give for the order?",
    }
    assert any(q["role"] == "user" and q["text"] == ORDER_TURN for q in quoted(last[at]))

    # Before the block: the previous request's items up to its own block, byte for
    # byte, then its question and its answer.
    before = earlier[: block_at(earlier)]
    assert orjson.dumps(last[: len(before)]) == orjson.dumps(before)
    assert [i.get("role") for i in last[len(before) : at]] == ["user", "assistant"]

    # No call or output without its other half in anything forwarded.
    posts = [r.json for r in fake.received if r.method == "POST"]
    assert all(paired(body["input"]) for body in posts if isinstance(body["input"], list))

    recall_row(tmp_path, raw.headers, budget=900, needle="%88412-KX%")
    metrics = openai.OpenAI(base_url=proxy.url, api_key="x").get("/metrics", cast_to=str)
    assert 'ctxproxy_recall_total{policy="support",outcome="recalled"} 2' in metrics

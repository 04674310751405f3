"""Compaction answered by the proxy for an upstream that is not OpenAI's, over real HTTP.

The client is the openai SDK (raw httpx for what the SDK does not expose);
the Responses upstream is a recording fake that, like any upstream but
OpenAI's, refuses ``compaction`` and ``compaction_trigger`` items; the
summarizer is a recording chat fake on its own upstream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.fakes.responses import FakeResponses
from tests.fakes.upstream import FakeUpstream
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query

TRIGGER = {"type": "compaction_trigger"}
SESSION = {"X-Session-Id": "codex-1"}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def history() -> list[dict[str, Any]]:
    """A short coding session: a tool call and its output between two turns."""
    return [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        user("Find the port the server listens on."),
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "exec_command",
            "arguments": '{"cmd":"grep -r PORT ."}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "config.py: PORT = 8731"},
        assistant("The server listens on port 8731."),
        user("Now rename the config module to settings."),
        assistant("Renamed config.py to settings.py."),
    ]


def proxy_config(
    responses: AiohttpServer,
    summarizer: AiohttpServer,
    tmp_path: Path,
    *,
    compaction: str | None = None,
    policy: str = "passthrough",
) -> Any:
    route: dict[str, Any] = {
        "match": {"path": "/v1/responses"},
        "upstream": "default",
        "policy": policy,
        "compaction_summarizer": {"upstream": "summarizer", "model": "small", "timeout_s": 5},
    }
    if compaction is not None:
        route["compaction"] = compaction
    policies = {"recalling": {"strategy": "trim", "max_turns": 2, "recall": {"max_tokens": 800}}}
    return make_config(
        responses.url,
        tmp_path,
        routes=[route],
        policies=policies,
        extra={
            "upstreams": {
                "default": {"base_url": f"{responses.url}/v1", "timeout_s": 5},
                "summarizer": {"base_url": f"{summarizer.url}/v1", "timeout_s": 5},
            }
        },
    )


@pytest.fixture
def proxy(
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
    tmp_path: Path,
) -> Iterator[ProxyServer]:
    server = ProxyServer(loop_thread, proxy_config(responses_upstream[1], fake[1], tmp_path))
    yield server
    server.stop()


def client(proxy: ProxyServer, headers: dict[str, str] | None = None) -> OpenAI:
    return OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers=headers if headers is not None else SESSION,
    )


def test_a_trigger_is_answered_with_exactly_one_compaction_item_and_no_upstream_call(
    proxy: ProxyServer,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
    tmp_path: Path,
):
    answer = client(proxy).responses.create(
        model="qwen3-coder", input=[*history(), TRIGGER], store=False
    )
    assert [item.type for item in answer.output] == ["compaction"]
    item = answer.output[0]
    assert item.encrypted_content.startswith("ctxproxy.compaction.v1:")
    assert item.id.startswith("cmp_")
    assert answer.status == "completed"
    assert answer.usage is not None and answer.usage.input_tokens > 0
    assert answer.usage.output_tokens > 0
    # Nothing reached the Responses upstream; the summarizer saw the whole session.
    assert responses_upstream[0].received == []
    calls = fake[0].summarizer_requests
    assert len(calls) == 1
    prompt = json.dumps(calls[0].json)
    assert "grep -r PORT" in prompt and "8731" in prompt and "settings" in prompt
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT detail_json FROM requests")
    detail = json.loads(rows[-1]["detail_json"])["compaction"]
    assert detail["asked"] == "trigger" and detail["mode"] == "proxy"
    assert detail["status"] == "created" and detail["item_id"] == item.id
    assert detail["covered_items"] == len(history())


def test_a_streamed_trigger_is_a_well_formed_event_sequence(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    with (
        httpx.Client(base_url=proxy.url, timeout=10) as http,
        http.stream(
            "POST",
            "/v1/responses",
            json={"model": "qwen3-coder", "input": [*history(), TRIGGER], "stream": True},
            headers=SESSION,
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-context-compaction"] == "created"
        raw = response.read().decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    kinds = [e["type"] for e in events]
    assert (
        kinds
        == names
        == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed",
        ]
    )
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3, 4]
    done = events[3]["item"]
    assert done["type"] == "compaction" and events[2]["item"] == done
    assert events[2]["output_index"] == events[3]["output_index"] == 0
    completed = events[4]["response"]
    assert completed["output"] == [done] and completed["status"] == "completed"
    assert completed["usage"]["total_tokens"] == (
        completed["usage"]["input_tokens"] + completed["usage"]["output_tokens"]
    )
    assert events[0]["response"]["id"] == completed["id"]
    assert responses_upstream[0].received == []


def test_the_sdk_stream_of_a_trigger_ends_with_one_compaction_item(proxy: ProxyServer):
    with client(proxy).responses.stream(model="qwen3-coder", input=[*history(), TRIGGER]) as s:
        done = [e.item.type for e in s if e.type == "response.output_item.done"]
        final = s.get_final_response()
    assert done == ["compaction"]
    assert [o.type for o in final.output] == ["compaction"]


def test_the_next_request_expands_the_item_and_no_compaction_item_reaches_the_upstream(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    sdk = client(proxy)
    compacted = sdk.responses.create(model="qwen3-coder", input=[*history(), TRIGGER])
    item = compacted.output[0].model_dump(exclude_none=True)
    # As Codex continues: the user messages it retains, the item, the new turn.
    retained = [i for i in history() if i.get("role") == "user"]
    follow = sdk.responses.create(
        model="qwen3-coder", input=[*retained, item, user("Which port was it again?")]
    )
    assert follow.status == "completed"
    (received,) = responses_upstream[0].received
    sent = received.json["input"]
    assert all(i.get("type") not in ("compaction", "compaction_trigger") for i in sent)
    summary = [i for i in sent if "Summary of the earlier conversation" in json.dumps(i)]
    assert len(summary) == 1 and summary[0]["role"] == "user"
    assert "fake summary" in json.dumps(summary[0])
    assert sent[-1] == user("Which port was it again?")
    assert sent[: len(retained)] == retained


def test_a_foreign_compaction_item_never_reaches_an_upstream_that_cannot_read_it(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    openai_made = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABfernet"}
    answer = client(proxy).responses.create(
        model="qwen3-coder", input=[user("hello"), openai_made, user("go on")]
    )
    assert answer.status == "completed"
    (received,) = responses_upstream[0].received
    assert received.json["input"] == [user("hello"), user("go on")]


def test_a_damaged_item_is_a_400_naming_it(proxy: ProxyServer):
    sdk = client(proxy)
    item = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    damaged = item.model_dump(exclude_none=True)
    damaged["encrypted_content"] = damaged["encrypted_content"][:-3] + "abc"
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        response = http.post(
            "/v1/responses", json={"model": "m", "input": [damaged, user("x")]}, headers=SESSION
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_compaction_item" and error["param"] == "input[0]"

"""Streamed /v1/responses: typed events relayed as they arrive, the response assembled and stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.responses import Call, FakeResponses, RReply
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query, wait_until
from tests.openapi import validate

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


@pytest.fixture
def upstream(
    responses_upstream: tuple[FakeResponses, AiohttpServer],
) -> tuple[FakeResponses, AiohttpServer]:
    return responses_upstream


@pytest.fixture
def proxy(
    loop_thread: LoopThread, upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path
) -> Iterator[ProxyServer]:
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "last2"}]
    policies = {"last2": {"strategy": "trim", "max_turns": 2}}
    server = ProxyServer(
        loop_thread, make_config(upstream[1].url, tmp_path, policies=policies, routes=routes)
    )
    yield server
    server.stop()


def client(proxy: ProxyServer, session: str | None = None) -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="sk-s", default_headers=headers, max_retries=0
    )


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.split(b"\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n"))
        out.append((lines[b"event"].decode(), orjson.loads(lines[b"data"])))
    return out


def slow_store(proxy: ProxyServer, seconds: float) -> list[str]:
    """Make every chain write take ``seconds``; returns the ids written, in order."""
    store = proxy.runtime.store
    original = store.record_response
    written: list[str] = []

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(seconds)
        result = await original(*args, **kwargs)
        written.append(args[3].id)
        return result

    store.record_response = slow
    return written


def test_events_are_relayed_byte_for_byte_and_match_the_spec(upstream, proxy, tmp_path):
    fake, _ = upstream
    fake.replies.append(RReply(text="streamed answer, in pieces"))
    with client(proxy, session="st").responses.with_streaming_response.create(
        model="gpt-4o", input="tell me", stream=True
    ) as response:
        received = b"".join(response.iter_bytes())
        assert response.headers["x-context-policy"] == "last2"
        assert response.headers["x-session-id"] == "st"

    assert received == fake.last_response
    parsed = events(received)
    for name, event in parsed:
        assert name == event["type"]
        validate("ResponseStreamEvent", event)
    assert [n for n, _ in parsed][-1] == "response.completed"
    validate("CreateResponse", fake.last)
    proxy.drain()
    stored = query(tmp_path / "ctxproxy.db", "SELECT response_json, status FROM responses")
    assert json.loads(stored[0]["response_json"]) == parsed[-1][1]["response"]
    row = query(tmp_path / "ctxproxy.db", "SELECT stream, incomplete FROM requests")[0]
    assert (row["stream"], row["incomplete"]) == (1, 0)


def test_the_chain_is_stored_before_the_stream_ends_so_a_follow_up_finds_it(upstream, proxy):
    fake, _ = upstream
    written = slow_store(proxy, 0.3)
    c = client(proxy)
    previous = None
    for turn in range(3):
        chained = {"previous_response_id": previous} if previous else {}
        with c.responses.stream(model="gpt-4o", input=f"turn {turn}", **chained) as stream:
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            final = stream.get_final_response()
        assert text == f"echo: turn {turn}"
        assert final.id in written  # the write finished before the client saw the end
        previous = final.id
        if turn:
            # Chained from the proxy's store, not the upstream's.
            assert "previous_response_id" not in fake.last
            assert len(fake.last["input"]) == 3


def test_streamed_function_call_round_trip(upstream, proxy):
    fake, _ = upstream
    fake.replies += [
        RReply(text=None, calls=[Call("get_weather", '{"city": "Rome, Italy"}')]),
        RReply(text="Warm."),
    ]
    c = client(proxy)
    with c.responses.stream(model="gpt-4o", input="Rome?", tools=[WEATHER]) as stream:
        first = stream.get_final_response()
    call = first.output[0]
    assert (call.type, call.arguments) == ("function_call", '{"city": "Rome, Italy"}')
    with c.responses.stream(
        model="gpt-4o",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "25C"}],
    ) as stream:
        second = stream.get_final_response()

    assert second.output_text == "Warm."
    sent = fake.last["input"]
    assert [i.get("type", "message") for i in sent] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert sent[1]["call_id"] == sent[2]["call_id"] == call.call_id


def test_stream_cut_short_tells_the_client_and_keeps_what_finished(upstream, proxy, tmp_path):
    fake, _ = upstream
    fake.replies.append(RReply(text="a long answer that never ends", break_after_events=6))
    with client(proxy, session="cut").responses.with_streaming_response.create(
        model="gpt-4o", input="go", stream=True
    ) as response:
        received = b"".join(response.iter_bytes())

    name, error = events(received)[-1]
    assert name == "error" and error["type"] == "error"
    validate("ResponseErrorEvent", error)
    assert received.startswith(fake.last_response)  # everything before the cut, as sent
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    row = query(db, "SELECT incomplete, error FROM requests")[0]
    assert row["incomplete"] == 1 and row["error"].startswith("upstream_unavailable")
    stored = query(db, "SELECT id, status FROM responses")[0]
    assert (stored["id"], stored["status"]) == ("resp_1", "incomplete")
    # What it was given is kept; a follow-up continues from there.
    client(proxy).responses.create(model="gpt-4o", input="again", previous_response_id="resp_1")
    assert [i["content"] for i in fake.last["input"]] == ["go", "again"]


def test_client_leaving_mid_stream_keeps_the_response_marked_incomplete(upstream, proxy, tmp_path):
    fake, _ = upstream
    fake.replies.append(RReply(text="word " * 60, chunk_delay=0.02))
    body = {"model": "gpt-4o", "input": "go", "stream": True}
    headers = {"x-session-id": "gone", "authorization": "Bearer sk-s"}
    with httpx.stream("POST", f"{proxy.url}/v1/responses", json=body, headers=headers) as response:
        for line in response.iter_lines():
            if "response.output_text.delta" in line:
                break  # the client goes away mid-answer

    db = tmp_path / "ctxproxy.db"
    wait_until(lambda: bool(query(db, "SELECT 1 FROM responses")))
    proxy.drain()
    assert query(db, "SELECT status FROM responses")[0]["status"] == "incomplete"
    assert query(db, "SELECT incomplete FROM requests")[0]["incomplete"] == 1
    assert fake.events_sent < 60  # the upstream stream was closed, not read to its end


def test_stream_ending_without_response_completed_gets_response_failed(upstream, proxy, tmp_path):
    fake, _ = upstream
    fake.replies.append(RReply(text="an answer that stops early", no_terminal=True))
    with client(proxy, session="early").responses.with_streaming_response.create(
        model="gpt-4o", input="go", stream=True
    ) as response:
        received = b"".join(response.iter_bytes())

    assert received.startswith(fake.last_response)  # everything the upstream sent, as sent
    name, failed = events(received)[-1]
    assert name == "response.failed" and failed["type"] == "response.failed"
    validate("ResponseFailedEvent", failed)
    assert failed["response"]["status"] == "failed"
    error = failed["response"]["error"]
    assert error["code"] == "server_error"
    assert error["message"].startswith("upstream_stream_incomplete: ")
    assert "response.completed" not in [n for n, _ in events(received)]
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert (
        'ctxproxy_unfinished_streams_total{route="routes[0]",code="upstream_stream_incomplete"} 1'
        in metrics
    )
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    row = query(db, "SELECT incomplete, error FROM requests")[0]
    assert row["incomplete"] == 1 and row["error"].startswith("upstream_stream_incomplete")
    assert query(db, "SELECT status FROM responses")[0]["status"] == "incomplete"
    # Never shown as a whole answer: retrieved, it is incomplete, as are its items.
    assert client(proxy).responses.retrieve("resp_1").status == "incomplete"
    # The input item as it came (complete), the answer's item marked incomplete.
    assert [r["incomplete"] for r in query(db, "SELECT incomplete FROM items ORDER BY id")] == [
        0,
        1,
    ]
    # What finished is kept, as for a stream cut short: a follow-up continues from there.
    client(proxy).responses.create(model="gpt-4o", input="again", previous_response_id="resp_1")
    assert fake.last["input"][0]["content"] == "go" and fake.last["input"][-1]["content"] == "again"

"""Compaction answered by the proxy for an upstream that is not OpenAI's, over real HTTP.

The client is the openai SDK (raw httpx for what the SDK does not expose);
the Responses upstream is a recording fake that, like any upstream but
OpenAI's, refuses ``compaction`` and ``compaction_trigger`` items; the
summarizer is a recording chat fake on its own upstream.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from redis import Redis

from proxy.context.compaction_item import decode
from proxy.http.sessions import tenant_of
from tests.fakes.responses import FakeResponses
from tests.fakes.upstream import FakeUpstream, Reply
from tests.harness import (
    AiohttpServer,
    LoopThread,
    ProxyServer,
    make_config,
    query,
    wait_until,
)
from tests.openapi import validate
from tests.servers import RUN, require_postgres, require_redis

TRIGGER = {"type": "compaction_trigger"}
SESSION = {"X-Session-Id": "codex-1"}
ADMIN_KEY = "adm-compaction-0123"
# What the SDK sends besides: the client's key (a request without one stores nothing).
HEADERS = {**SESSION, "Authorization": "Bearer sk-test"}
# About a turn a compaction folds away: history()'s assistant answer has its words.
QUESTION = "Which port did you say the server listens on?"


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
    shared: dict[str, Any] | None = None,
    summarizer_keys: dict[str, Any] | None = None,
) -> Any:
    summarizer_spec = {"upstream": "summarizer", "model": "small", "timeout_s": 5}
    route: dict[str, Any] = {
        "match": {"path": "/v1/responses"},
        "upstream": "default",
        "policy": policy,
        "compaction_summarizer": {**summarizer_spec, **(summarizer_keys or {})},
    }
    if compaction is not None:
        route["compaction"] = compaction
    recall = {"max_tokens": 150, "neighbors": 1}
    policies = {
        "recalling": {"strategy": "trim", "max_tokens": 200, "recall": recall},
        # Room for whatever the folded turns held (recall spends at most what a fold saved).
        "recalling_wide": {"strategy": "trim", "max_tokens": 4000, "recall": {"max_tokens": 1000}},
    }
    return make_config(
        responses.url,
        tmp_path,
        routes=[route],
        policies=policies,
        extra={
            **(shared or {}),
            "admin": {"api_key": "os.environ/CTX_COMPACTION_ADMIN_KEY"},
            "upstreams": {
                "default": {"base_url": f"{responses.url}/v1", "timeout_s": 5},
                "summarizer": {"base_url": f"{summarizer.url}/v1", "timeout_s": 5},
            },
        },
    )


@pytest.fixture(autouse=True)
def admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_COMPACTION_ADMIN_KEY", ADMIN_KEY)


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
    rows = query(tmp_path / "ctxproxy.db", "SELECT upstream_status, detail_json FROM requests")
    assert rows[-1]["upstream_status"] is None  # answered by the proxy
    detail = json.loads(rows[-1]["detail_json"])["compaction"]
    assert detail["asked"] == "trigger" and detail["mode"] == "proxy"
    assert detail["status"] == "created" and detail["item_id"] == item.id
    assert detail["covered_items"] == len(history())
    assert detail["model"] == "small"  # the compaction summarizer's


def test_a_streamed_trigger_is_a_well_formed_event_sequence(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    with (
        httpx.Client(base_url=proxy.url, timeout=10) as http,
        http.stream(
            "POST",
            "/v1/responses",
            json={"model": "qwen3-coder", "input": [*history(), TRIGGER], "stream": True},
            headers=HEADERS,
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


@pytest.fixture
def start(
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
    tmp_path: Path,
) -> Iterator[Any]:
    """Start another proxy (a route's compaction and policy; its own store folder)."""
    started: list[ProxyServer] = []

    def run(folder: str = "other", **route: Any) -> ProxyServer:
        (tmp_path / folder).mkdir(exist_ok=True)
        config = proxy_config(responses_upstream[1], fake[1], tmp_path / folder, **route)
        started.append(ProxyServer(loop_thread, config))
        return started[-1]

    yield run
    for server in started:
        server.stop()


def test_compact_endpoint_answers_the_user_messages_and_one_compaction_item(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path
):
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        response = http.post(
            "/v1/responses/compact",
            json={"model": "qwen3-coder", "input": history(), "instructions": "Be brief."},
            headers=HEADERS,
        )
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "response.compaction" and body["id"].startswith("resp_")
    output = body["output"]
    users = [i for i in history() if i.get("role") == "user"]
    assert [{k: v for k, v in o.items() if k not in ("id", "status")} for o in output[:-1]] == users
    assert all(o["id"].startswith("msg_") and o["status"] == "completed" for o in output[:-1])
    assert output[-1]["type"] == "compaction"
    assert body["usage"]["input_tokens"] > 0
    assert response.headers["x-context-compaction"] == "created"
    assert responses_upstream[0].received == []
    sql = "SELECT endpoint, detail_json FROM requests"
    wait_until(lambda: bool(query(tmp_path / "ctxproxy.db", sql)))
    rows = query(tmp_path / "ctxproxy.db", sql)
    assert rows[-1]["endpoint"] == "/v1/responses/compact"
    assert json.loads(rows[-1]["detail_json"])["compaction"]["asked"] == "compact"


def test_compact_endpoint_continues_a_stored_response(proxy: ProxyServer):
    sdk = client(proxy)
    first = sdk.responses.create(model="qwen3-coder", input="The build id is 5521.")
    compacted = sdk.responses.compact(model="qwen3-coder", previous_response_id=first.id)
    assert compacted.object == "response.compaction"
    assert [o.type for o in compacted.output] == ["message", "compaction"]
    assert compacted.output[0].content[0].text == "The build id is 5521."


def test_past_the_threshold_the_answer_carries_the_compaction_item_first(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    answer = client(proxy).responses.create(
        model="qwen3-coder",
        input=[*history(), user("And the tests?")],
        context_management=[{"type": "compaction", "compact_threshold": 50}],
    )
    assert [o.type for o in answer.output] == ["compaction", "message"]
    (received,) = responses_upstream[0].received
    sent = received.json["input"]
    assert "context_management" not in received.json
    assert sent[0]["role"] == "developer"
    assert "Summary of the earlier conversation" in json.dumps(sent[1])
    assert sent[2:] == [user("And the tests?")]


def test_under_the_threshold_nothing_is_compacted(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    answer = client(proxy).responses.create(
        model="qwen3-coder",
        input=[*history(), user("And the tests?")],
        context_management=[{"type": "compaction", "compact_threshold": 100000}],
    )
    assert [o.type for o in answer.output] == ["message"]
    (received,) = responses_upstream[0].received
    assert received.json["input"] == [*history(), user("And the tests?")]
    assert "context_management" not in received.json


def test_a_streamed_answer_past_the_threshold_leads_with_the_item_in_sequence(
    proxy: ProxyServer,
):
    with client(proxy).responses.stream(
        model="qwen3-coder",
        input=[*history(), user("And the tests?")],
        context_management=[{"type": "compaction", "compact_threshold": 50}],
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.done"]
    assert done == [(0, "compaction"), (1, "message")]
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert [o.type for o in final.output] == ["compaction", "message"]


def test_a_failing_summarizer_still_answers_with_the_offline_summary(
    proxy: ProxyServer, fake: tuple[FakeUpstream, AiohttpServer]
):
    fake[0].summary_replies.append(Reply(status=500, body=b'{"error": {"message": "down"}}'))
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        response = http.post(
            "/v1/responses",
            json={"model": "qwen3-coder", "input": [*history(), TRIGGER]},
            headers=HEADERS,
        )
    assert response.status_code == 200
    assert response.headers["x-context-compaction"] == "fallback"
    assert response.headers["x-context-compaction-fallback"].startswith("summarizer_")
    assert decode(response.json()["output"][0]["encrypted_content"]).model == "ctxproxy/extractive"
    (item,) = response.json()["output"]
    assert item["type"] == "compaction"
    # The extractive summary quotes the conversation: the next request carries it.
    follow = client(proxy).responses.create(model="m", input=[item, user("go on")])
    assert follow.status == "completed"


def test_an_item_expands_on_a_fresh_proxy_with_an_empty_store(
    proxy: ProxyServer, start: Any, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    item = client(proxy).responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    other = start("fresh")
    follow = client(other, {"X-Session-Id": "elsewhere"}).responses.create(
        model="m", input=[item.model_dump(exclude_none=True), user("continue")]
    )
    assert follow.status == "completed"
    (received,) = responses_upstream[0].received
    sent = received.json["input"]
    assert len(sent) == 2 and "fake summary" in json.dumps(sent[0])


@pytest.mark.parametrize(
    "body",
    [
        {"input": [user("hi"), TRIGGER]},
        {"input": [user("hi")], "context_management": [{"type": "compaction"}]},
    ],
    ids=["trigger", "context_management"],
)
def test_compaction_off_is_a_400_compaction_not_supported(
    start: Any, body: dict[str, Any], responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    off = start(compaction="off")
    with httpx.Client(base_url=off.url, timeout=10) as http:
        response = http.post("/v1/responses", json={"model": "m", **body})
        compact = http.post("/v1/responses/compact", json={"model": "m", "input": "hi"})
    for answered in (response, compact):
        assert answered.status_code == 400
        assert answered.json()["error"]["code"] == "compaction_not_supported"
        assert answered.json()["error"]["type"] == "invalid_request_error"
    assert responses_upstream[0].received == []


def test_compaction_upstream_relays_the_trigger_as_it_came(
    start: Any, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    responses_upstream[0].compaction = True
    relayed = start(compaction="upstream")
    client(relayed).responses.create(model="m", input=[user("hi"), TRIGGER])
    (received,) = responses_upstream[0].received
    assert received.json["input"][-1] == TRIGGER


def test_recall_reaches_a_turn_the_compaction_folded_away(
    start: Any, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    recalling = start(policy="recalling")
    sdk = client(recalling)
    item = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    retained = [i for i in history() if i.get("role") == "user"]
    question = user(QUESTION)
    answer = sdk.responses.with_raw_response.create(
        model="m", input=[*retained, item.model_dump(exclude_none=True), question]
    )
    assert int(answer.headers["x-context-recalled"]) >= 1
    (received,) = responses_upstream[0].received
    sent = json.dumps(received.json["input"])
    # A verbatim turn the client no longer holds, recalled from the proxy's stored history;
    # the summary itself does not carry the value.
    assert "[ctxproxy recall]" in sent and "The server listens on port 8731." in sent
    summary = [i for i in received.json["input"] if "Summary of the earlier" in json.dumps(i)]
    assert "8731" not in json.dumps(summary)
    assert "compaction" not in [i.get("type") for i in received.json["input"]]


def test_recall_never_quotes_an_expanded_summary_or_a_compaction_item(
    start: Any,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    tmp_path: Path,
):
    recalling = start(policy="recalling_wide")
    sdk = client(recalling)
    first = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    retained = [i for i in history() if i.get("role") == "user"]
    call = {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c2", "output": "settings.py"}
    window = [*retained, first.model_dump(exclude_none=True), call, output]
    second = sdk.responses.create(model="m", input=[*window, TRIGGER]).output[0]
    # The session's stored history now holds the first summary, expanded (the second
    # window's input), among the turns the second compaction folded away.
    question = user("What goal and context did the fake summary and its compaction give?")
    sdk.responses.create(
        model="m", input=[*retained, second.model_dump(exclude_none=True), question]
    )
    (received,) = responses_upstream[0].received
    sent = json.dumps(received.json["input"])
    assert "fake summary 2" in sent and "fake summary 1" not in sent
    recalling.drain()
    rows = query(tmp_path / "other" / "ctxproxy.db", "SELECT detail_json FROM requests")
    recall = json.loads(rows[-1]["detail_json"])["recall"]
    stored = query(tmp_path / "other" / "ctxproxy.db", "SELECT id, message_json FROM items")
    summaries = {r["id"] for r in stored if "Summary of the earlier" in r["message_json"]}
    items = {r["id"] for r in stored if '"compaction' in r["message_json"]}
    assert summaries and items
    assert not {hit[1] for hit in recall["hits"]} & (summaries | items)


def test_a_second_compaction_extends_the_first_summary_with_only_the_newer_turns(
    proxy: ProxyServer, fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
):
    sdk = client(proxy)
    first = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    retained = [i for i in history() if i.get("role") == "user"]
    later = [
        *retained,
        first.model_dump(exclude_none=True),
        user("Add a test for the settings module."),
        assistant("Added tests/test_settings.py."),
    ]
    second = sdk.responses.create(model="m", input=[*later, TRIGGER])
    assert [o.type for o in second.output] == ["compaction"]
    calls = fake[0].summarizer_requests
    assert len(calls) == 2
    prompt = json.dumps(calls[1].json)
    # Incremental: the first summary, then only what came after it.
    assert "fake summary 1" in prompt and "test_settings" in prompt
    assert "grep -r PORT" not in prompt
    proxy.drain()
    sql = "SELECT detail_json FROM requests ORDER BY id"
    wait_until(lambda: len(query(tmp_path / "ctxproxy.db", sql)) == 2)
    detail = json.loads(query(tmp_path / "ctxproxy.db", sql)[-1]["detail_json"])["compaction"]
    assert detail["incremental"] is True and detail["expanded"] == 1
    assert detail["restored"] == len(history())
    # The stored session holds each compaction item as the answer it was.
    stored = query(tmp_path / "ctxproxy.db", "SELECT role FROM items WHERE role = 'compaction'")
    assert len(stored) == 2


def test_a_second_compaction_after_tool_calls_extends_the_first_summary_as_codex_sends_it(
    proxy: ProxyServer, fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
):
    # Codex's window after a compaction: its retained user messages, the item, then the
    # model's own tool calls (no new user message: the covered prefix ends mid-turn).
    sdk = client(proxy)
    first = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    retained = [i for i in history() if i.get("role") == "user"]
    call = {
        "type": "function_call",
        "call_id": "c2",
        "name": "exec_command",
        "arguments": '{"cmd":"cat settings.py"}',
    }
    output = {"type": "function_call_output", "call_id": "c2", "output": "SETTINGS_V2 = True"}
    window = [*retained, first.model_dump(exclude_none=True), call, output]
    second = sdk.responses.create(model="m", input=[*window, TRIGGER])
    assert [o.type for o in second.output] == ["compaction"]
    calls = fake[0].summarizer_requests
    assert len(calls) == 2
    prompt = calls[1].json["messages"][-1]["content"]
    summary, _, newer = prompt.partition("New turns since then:")
    # The first summary as the previous one, never as a turn; only the call and its output new.
    assert "fake summary 1" in summary and "fake summary 1" not in newer
    assert "Summary of the earlier conversation" not in prompt
    assert "SETTINGS_V2" in newer and "Find the port" not in newer and "rename" not in newer
    proxy.drain()
    sql = "SELECT detail_json FROM requests ORDER BY id"
    wait_until(lambda: len(query(tmp_path / "ctxproxy.db", sql)) == 2)
    detail = json.loads(query(tmp_path / "ctxproxy.db", sql)[-1]["detail_json"])["compaction"]
    assert detail["incremental"] is True and detail["new_items"] == 2
    # It covers the whole conversation: the restored turns, the window, the new items.
    assert detail["covered_items"] == len(history()) + len(window)
    item = second.output[0].model_dump()
    assert decode(item["encrypted_content"]).items == detail["covered_items"]


def test_the_viewer_shows_each_compaction(proxy: ProxyServer):
    sdk = client(proxy)
    item = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    sdk.responses.create(model="m", input=[item.model_dump(exclude_none=True), user("next")])
    proxy.drain()
    path = f"/admin/sessions/{tenant_of('sk-test')}/codex-1"
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    view = httpx.get(f"{proxy.url}{path}", headers=auth).json()
    compactions = [r["compaction"] for r in view["requests"]]
    assert compactions[0]["status"] == "created" and compactions[0]["asked"] == "trigger"
    assert compactions[1]["expanded"] == 1 and compactions[1]["restored"] == len(history())
    page = httpx.get(f"{proxy.url}/admin/ui/viewer.js").text
    assert "compactionText" in page


def test_a_trigger_without_a_session_is_answered_and_nothing_summarized_is_stored(
    proxy: ProxyServer, fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
):
    answer = client(proxy, {}).responses.create(model="m", input=[*history(), TRIGGER], store=False)
    assert [o.type for o in answer.output] == ["compaction"]
    assert len(fake[0].summarizer_requests) == 1
    proxy.drain()
    assert query(tmp_path / "ctxproxy.db", "SELECT id FROM summaries") == []


def test_the_summarizers_breaker_opens_and_compaction_still_answers(
    proxy: ProxyServer, fake: tuple[FakeUpstream, AiohttpServer]
):
    down = Reply(status=500, body=b'{"error": {"message": "down"}}')
    fake[0].summary_replies.extend([down, down, down])
    sdk = client(proxy).responses.with_raw_response
    fallbacks = []
    for _ in range(4):
        raw = sdk.create(model="m", input=[*history(), TRIGGER])
        assert [o.type for o in raw.parse().output] == ["compaction"]
        fallbacks.append(raw.headers["x-context-compaction-fallback"])
    assert fallbacks[-1] == "summarizer_unavailable"
    assert len(fake[0].summarizer_requests) == 3  # the open circuit made no call


def test_the_answers_match_openais_published_shapes(proxy: ProxyServer):
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        whole = http.post(
            "/v1/responses", json={"model": "m", "input": [*history(), TRIGGER]}, headers=HEADERS
        ).json()
        streamed = http.post(
            "/v1/responses",
            json={"model": "m", "input": [*history(), TRIGGER], "stream": True},
            headers=HEADERS,
        ).text
        compacted = http.post(
            "/v1/responses/compact", json={"model": "m", "input": history()}, headers=HEADERS
        ).json()
    validate("Response", whole)
    for line in streamed.splitlines():
        if line.startswith("data: "):
            validate("ResponseStreamEvent", json.loads(line[6:]))
    validate("CompactResource", compacted)


def test_a_threshold_compaction_folds_a_stored_chain_too(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    sdk = client(proxy)
    first = sdk.responses.create(model="m", input=history())
    answer = sdk.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[user("And the tests?")],
        context_management=[{"type": "compaction", "compact_threshold": 40}],
    )
    assert [o.type for o in answer.output] == ["compaction", "message"]
    assert answer.previous_response_id == first.id
    sent = responses_upstream[0].received[-1].json["input"]
    # The developer message stays; the rest of the chain is the summary now.
    assert [i.get("role") for i in sent] == ["developer", "user", "user"]
    assert "Summary of the earlier conversation" in json.dumps(sent[1])
    assert sent[-1] == user("And the tests?")


def test_a_preview_shows_the_item_expanded_and_compacts_nothing(
    proxy: ProxyServer,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
):
    item = client(proxy).responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    body = {
        "model": "m",
        "input": [item.model_dump(exclude_none=True), *history(), user("next")],
        "context_management": [{"type": "compaction", "compact_threshold": 10}],
    }
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        shown = http.post("/v1/context/preview", json=body, headers=HEADERS)
    assert shown.status_code == 200
    sent = shown.json()["input"]
    assert "Summary of the earlier conversation" in json.dumps(sent[0])
    assert all(i.get("type") != "compaction" for i in sent)
    assert len(fake[0].summarizer_requests) == 1  # the trigger's only
    assert responses_upstream[0].received == []


def test_compaction_upstream_relays_the_compact_endpoint_to_the_upstreams_own(
    start: Any, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    responses_upstream[0].compaction = True
    relayed = start(compaction="upstream")
    body = {"model": "m", "input": history()}
    with httpx.Client(base_url=relayed.url, timeout=10) as http:
        response = http.post("/v1/responses/compact", json=body, headers=HEADERS)
    assert response.status_code == 200
    assert response.json()["output"][-1]["encrypted_content"] == "gAAAA"  # OpenAI's own
    (received,) = responses_upstream[0].received
    assert received.path == "/v1/responses/compact" and received.json == body


def test_after_a_threshold_compaction_the_resent_history_forwards_the_same_prefix(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    sdk = client(proxy)
    asked = [*history(), user("And the tests?")]
    managed = [{"type": "compaction", "compact_threshold": 50}]
    answer = sdk.responses.create(model="m", input=asked, context_management=managed)
    first = responses_upstream[0].received[-1].json["input"]
    # As a client continues: its input, the output (compaction item first), a new turn.
    output = [o.model_dump(exclude_none=True) for o in answer.output]
    follow = [*asked, *output, user("Run them.")]
    sdk.responses.create(model="m", input=follow)
    second = responses_upstream[0].received[-1].json["input"]
    assert second[: len(first)] == first  # the summary in place of what it folded
    assert second[-1] == user("Run them.")
    assert all(i.get("type") != "compaction" for i in second)


def test_a_compaction_continued_by_previous_response_id_is_expanded_from_the_store(
    proxy: ProxyServer, responses_upstream: tuple[FakeResponses, AiohttpServer]
):
    sdk = client(proxy)
    compacted = sdk.responses.create(model="m", input=[*history(), TRIGGER])
    follow = sdk.responses.create(
        model="m", previous_response_id=compacted.id, input=[user("Which port?")]
    )
    assert follow.status == "completed" and follow.previous_response_id == compacted.id
    sent = responses_upstream[0].received[-1].json["input"]
    # The stored chain's item became its summary, in place of the turns it covers.
    assert [i.get("role") for i in sent] == ["developer", "user", "user"]
    assert "fake summary 1" in json.dumps(sent[1])
    assert sent[-1] == user("Which port?")


@pytest.fixture(params=["postgres", "redis"])
def shared_store(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A shared store (a PostgreSQL schema or a Redis key prefix of this test's own) with
    Redis coordination, as several instances run; removed afterwards."""
    redis_url = require_redis()
    prefix = f"ctxtest:{RUN}:{uuid.uuid4().hex[:8]}"
    store: dict[str, Any] = {"url": redis_url, "key_prefix": f"{prefix}:store"}
    if request.param == "postgres":
        # Dropped with this run's other schemas (tests/stores.py).
        store = {"url": require_postgres(), "schema": f"ctxtest_{RUN}_{uuid.uuid4().hex[:8]}"}
    yield {"store": store, "coordination": {"redis_url": redis_url, "key_prefix": prefix}}
    redis = Redis.from_url(redis_url)
    keys = list(redis.scan_iter(match=f"{prefix}:*"))
    if keys:
        redis.delete(*keys)
    redis.close()


def test_the_codex_flow_on_the_shared_stores(
    start: Any,
    shared_store: dict[str, Any],
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
):
    sdk = client(start(policy="recalling", shared=shared_store))
    item = sdk.responses.create(model="m", input=[*history(), TRIGGER]).output[0]
    retained = [i for i in history() if i.get("role") == "user"]
    question = user(QUESTION)
    sdk.responses.create(model="m", input=[*retained, item.model_dump(exclude_none=True), question])
    (received,) = responses_upstream[0].received
    sent = json.dumps(received.json["input"])
    assert "fake summary 1" in sent and "The server listens on port 8731." in sent
    assert "compaction" not in [i.get("type") for i in received.json["input"]]
    # The same compaction again: the stored summary is reused, no summarizer call.
    again = sdk.responses.with_raw_response.create(model="m", input=[*history(), TRIGGER])
    assert again.headers["x-context-compaction"] == "reused"
    assert len(fake[0].summarizer_requests) == 1


def test_a_codex_shaped_trigger_is_answered_as_codex_expects(
    proxy: ProxyServer, fake: tuple[FakeUpstream, AiohttpServer]
):
    """Codex's remote compaction v2: its request's fields and item kinds, streamed."""
    conversation = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sandbox"}],
        },
        user("Patch the retry limit to 5."),
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAreasoning"},
        {
            "type": "custom_tool_call",
            "call_id": "t1",
            "name": "apply_patch",
            "input": "*** Begin Patch\n-RETRIES = 3\n+RETRIES = 5\n*** End Patch",
        },
        {"type": "custom_tool_call_output", "call_id": "t1", "output": "Success. Updated retry.py"},
        assistant("Set RETRIES to 5 in retry.py."),
    ]
    body = {
        "model": "gpt-5.1-codex",
        "instructions": "You are Codex.",
        "input": [*conversation, TRIGGER],
        "tools": [{"type": "custom", "name": "apply_patch", "description": "patch"}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a-thread",
    }
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        raw = http.post("/v1/responses", json=body, headers=HEADERS).text
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    done = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    # Codex: exactly one compaction item before response.completed, which has usage.
    assert done == ["compaction"] and kinds[-1] == "response.completed"
    assert events[-1]["response"]["usage"]["input_tokens"] > 0
    prompt = json.dumps(fake[0].summarizer_requests[-1].json)
    assert "RETRIES = 5" in prompt and "Success. Updated retry.py" in prompt

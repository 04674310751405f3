"""/v1/responses end to end: the openai SDK -> ctxproxy -> a recording fake Responses upstream."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.responses.items import ItemCounter, item_hash
from proxy.responses.replay import ids_of, replay
from tests.fakes.responses import Call, FakeResponses, RReply
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query
from tests.openapi import validate

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
POLICIES = {
    "last2": {"strategy": "trim", "max_turns": 2},
    "last1": {"strategy": "trim", "max_turns": 1},
    "clip": {"strategy": "trim", "max_tokens": 100_000, "tool_output_max_tokens": 50},
}


@pytest.fixture
def upstream(
    responses_upstream: tuple[FakeResponses, AiohttpServer],
) -> tuple[FakeResponses, AiohttpServer]:
    return responses_upstream


@pytest.fixture
def start(
    loop_thread: LoopThread, upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path
) -> Iterator[Callable[..., ProxyServer]]:
    started: list[ProxyServer] = []

    def run(policy: str = "passthrough", **extra: Any) -> ProxyServer:
        routes = [{"match": {"path": "/v1/responses"}, "upstream": "default", "policy": policy}]
        config = make_config(
            upstream[1].url, tmp_path, policies=POLICIES, routes=routes, extra=extra
        )
        proxy = ProxyServer(loop_thread, config)
        started.append(proxy)
        return proxy

    yield run
    for proxy in started:
        proxy.stop()


def client(
    proxy: ProxyServer, session: str | None = None, key: str = "sk-a", **kw: Any
) -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key=key, default_headers=headers, max_retries=0, **kw
    )


def texts(items: str | list[dict[str, Any]]) -> list[str]:
    """Each item as a short label: user text, assistant text, or call/output ids."""
    if isinstance(items, str):
        return [f"user:{items}"]
    out = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            out.append(f"{item['role']}:{text}")
        else:
            out.append(f"{kind}:{item.get('call_id') or item.get('id')}")
    return out


def db(tmp_path: Path, sql: str, *args: Any) -> list[Any]:
    return query(tmp_path / "ctxproxy.db", sql, *args)


# -- bytes ---------------------------------------------------------------------------


def test_plain_request_and_answer_cross_the_proxy_byte_for_byte(upstream, start):
    fake, _ = upstream
    proxy = start()
    sent: list[bytes] = []
    c = client(
        proxy, http_client=httpx.Client(event_hooks={"request": [lambda r: sent.append(r.read())]})
    )
    raw = c.responses.with_raw_response.create(
        model="gpt-4o",
        input=[{"role": "user", "content": "hello"}],
        instructions="be brief",
        tools=[WEATHER],
        temperature=0.2,
        store=True,
        extra_body={"future_field": {"nested": [1, 2]}},
    )

    assert fake.received[-1].raw == sent[-1]
    assert raw.http_response.content == fake.last_response
    assert raw.parse().output_text == "echo: hello"
    validate("CreateResponse", orjson.loads(sent[-1]))
    validate("Response", orjson.loads(raw.http_response.content))
    assert raw.headers["x-request-id"] == "req_resp_1"
    assert raw.headers["x-context-policy"] == "passthrough"
    assert int(raw.headers["x-context-tokens-before"]) > 0
    assert raw.headers["x-context-messages-dropped"] == "0"


def test_string_input_is_forwarded_as_sent(upstream, start):
    fake, _ = upstream
    proxy = start()
    response = client(proxy).responses.create(model="gpt-4o", input="just text")

    assert fake.last["input"] == "just text"
    assert response.output_text == "echo: just text"


# -- the chain -------------------------------------------------------------------------


def test_five_turn_chain_under_max_turns_2_sends_explicit_trimmed_input(upstream, start, tmp_path):
    fake, _ = upstream
    proxy = start("last2")
    c = client(proxy)
    previous = None
    ids = []
    for turn in range(5):
        chained = {"previous_response_id": previous} if previous else {}
        raw = c.responses.with_raw_response.create(
            model="gpt-4o", input=f"turn {turn}", instructions="be brief", **chained
        )
        response = raw.parse()
        ids.append(response.id)
        # The client's id is put back (the upstream got explicit input, so it said null).
        assert response.previous_response_id == previous
        upstream_bytes = fake.last_response
        if previous is not None:
            field = b'"previous_response_id":'
            upstream_bytes = upstream_bytes.replace(
                field + b"null", field + f'"{previous}"'.encode()
            )
        previous = response.id
        sent = fake.last
        validate("CreateResponse", sent)
        assert "previous_response_id" not in sent
        assert sent["instructions"] == "be brief"
        expected = []
        for t in range(max(0, turn - 1), turn):
            expected += [f"user:turn {t}", f"assistant:echo: turn {t}"]
        assert texts(sent["input"]) == [*expected, f"user:turn {turn}"]
        assert raw.headers["x-context-turns-dropped"] == str(max(0, turn - 1))
        assert raw.headers["x-session-id"] == f"resp:{ids[0]}"
        # The answer is the upstream's own, that one field aside.
        assert raw.http_response.content == upstream_bytes
    assert ids == [f"resp_{n}" for n in range(1, 6)]
    # The store has the whole chain, untrimmed, under the first response's session.
    chain = [
        json.loads(r["message_json"])
        for r in db(tmp_path, "SELECT message_json FROM items ORDER BY id")
    ]
    assert len(chain) == 10
    rows = db(tmp_path, "SELECT id, previous_response_id FROM responses ORDER BY created_at, rowid")
    assert [(r["id"], r["previous_response_id"]) for r in rows] == list(
        zip(ids, [None, *ids[:-1]], strict=True)
    )
    requests = db(
        tmp_path,
        "SELECT endpoint, messages_before, messages_after, reason FROM requests ORDER BY created_at",
    )
    assert [r["messages_before"] for r in requests] == [1, 3, 5, 7, 9]
    assert [r["messages_after"] for r in requests] == [1, 3, 3, 3, 3]
    assert {r["endpoint"] for r in requests} == {"/v1/responses"}
    assert requests[-1]["reason"] == "max_turns"


def test_five_turn_chain_with_tool_calls_keeps_every_pair_under_max_turns_2(upstream, start):
    fake, _ = upstream
    proxy = start("last2")
    c = client(proxy)
    sent: list[dict[str, Any]] = []

    def ask(**kwargs: Any) -> Any:
        response = c.responses.create(model="gpt-4o", tools=[WEATHER], **kwargs)
        sent.append(fake.last)
        return response

    previous = None
    for turn in range(5):
        if turn % 2:
            calls = [Call("get_weather", f'{{"turn": {turn}}}'), Call("get_weather", "{}")]
            fake.replies += [RReply(text=None, calls=calls), RReply(text=f"done {turn}")]
        chained = {"previous_response_id": previous} if previous else {}
        response = ask(input=f"turn {turn}", **chained)
        if turn % 2:
            outputs = [
                {"type": "function_call_output", "call_id": o.call_id, "output": f"result {turn}"}
                for o in response.output
                if o.type == "function_call"
            ]
            response = ask(input=outputs, previous_response_id=response.id)
        previous = response.id

    assert len(sent) == 7
    for body in sent:
        validate("CreateResponse", body)
        assert "previous_response_id" not in body
        items = (
            [{"role": "user", "content": body["input"]}]
            if isinstance(body["input"], str)
            else body["input"]
        )
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
        assert calls == outputs  # every call with its output, in order
        assert sum(1 for i in items if i.get("role") == "user") <= 2
    assert texts(sent[-1]["input"]) == [
        "user:turn 3",
        "function_call:call_5_0",
        "function_call:call_5_1",
        "function_call_output:call_5_0",
        "function_call_output:call_5_1",
        "assistant:done 3",
        "user:turn 4",
    ]


def test_instructions_are_not_inherited_from_the_previous_response(upstream, start):
    fake, _ = upstream
    proxy = start()
    c = client(proxy)
    first = c.responses.create(model="gpt-4o", input="hi", instructions="talk like a pirate")
    c.responses.create(model="gpt-4o", input="again", previous_response_id=first.id)

    assert "instructions" not in fake.last
    assert texts(fake.last["input"]) == ["user:hi", "assistant:echo: hi", "user:again"]


def test_function_calling_round_trip_keeps_call_and_output_together(upstream, start, tmp_path):
    fake, _ = upstream
    fake.replies += [
        RReply(text=None, calls=[Call("get_weather", '{"city":"Paris"}')]),
        RReply(text="Sunny."),
    ]
    proxy = start("last1")
    c = client(proxy, session="weather")
    first = c.responses.create(model="gpt-4o", input="Weather in Paris?", tools=[WEATHER])
    call = first.output[0]
    assert call.type == "function_call" and call.arguments == '{"city":"Paris"}'
    second = c.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"}],
    )
    assert second.output_text == "Sunny."
    sent = fake.last
    validate("CreateResponse", sent)
    # One turn (max_turns: 1) is the whole round trip: nothing to drop, the pair intact.
    assert texts(sent["input"]) == [
        "user:Weather in Paris?",
        f"function_call:{call.call_id}",
        f"function_call_output:{call.call_id}",
    ]
    # A third turn drops the first whole: call and output go together.
    c.responses.create(model="gpt-4o", previous_response_id=second.id, input="Thanks!")
    assert texts(fake.last["input"]) == ["user:Thanks!"]
    roles = [r["role"] for r in db(tmp_path, "SELECT role FROM items ORDER BY id")]
    assert roles == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
        "assistant",
    ]


def test_session_header_names_the_session_and_followers_inherit_it(upstream, start, tmp_path):
    proxy = start()
    first = client(proxy, session="conv-7").responses.create(model="gpt-4o", input="one")
    raw = client(proxy).responses.with_raw_response.create(
        model="gpt-4o", input="two", previous_response_id=first.id
    )

    assert raw.headers["x-session-id"] == "conv-7"
    sessions = db(tmp_path, "SELECT key FROM sessions")
    assert [s["key"] for s in sessions] == ["conv-7"]


def test_reasoning_without_encrypted_content_is_not_replayed_and_its_message_loses_its_id(
    upstream, start, tmp_path
):
    fake, _ = upstream
    fake.replies.append(RReply(text="thought about it", reasoning=True, encrypted=False))
    proxy = start()
    c = client(proxy)
    first = c.responses.create(model="gpt-4o", input="think")
    assert [o.type for o in first.output] == ["reasoning", "message"]
    second = c.responses.create(model="gpt-4o", input="and?", previous_response_id=first.id)

    # The fake, like OpenAI without stored state, rejects id-only reasoning
    # (404) and a linked message without its reasoning (400): it answered.
    assert second.output_text == "echo: and?"
    sent = fake.last["input"]
    assert sent[1] == {"type": "message", "role": "assistant", "content": "thought about it"}
    assert all(i.get("type") != "reasoning" for i in sent)
    validate("CreateResponse", fake.last)
    detail = json.loads(
        db(tmp_path, "SELECT detail_json FROM requests ORDER BY created_at")[-1]["detail_json"]
    )
    assert detail["replay"] == {"reasoning_dropped": 1, "ids_stripped": 1, "references_resolved": 0}


def test_reasoning_with_encrypted_content_is_replayed_whole_with_its_follower(upstream, start):
    fake, _ = upstream
    fake.replies.append(RReply(text="done", reasoning=True, encrypted=True))
    proxy = start()
    c = client(proxy)
    first = c.responses.create(
        model="gpt-4o", input="think", include=["reasoning.encrypted_content"]
    )
    c.responses.create(model="gpt-4o", input="more", previous_response_id=first.id)

    sent = fake.last["input"]
    assert sent[1] == first.output[0].model_dump(exclude_unset=True)
    assert sent[2]["id"] == first.output[1].id


def test_unknown_previous_response_id_is_forwarded_untouched_and_recorded(
    upstream, start, tmp_path
):
    fake, server = upstream
    direct = httpx.post(
        f"{server.url}/v1/responses", json={"model": "gpt-4o", "input": "made upstream"}
    ).json()
    proxy = start("last1")
    sent: list[bytes] = []
    c = client(
        proxy,
        session="s",
        http_client=httpx.Client(event_hooks={"request": [lambda r: sent.append(r.read())]}),
    )
    response = c.responses.create(
        model="gpt-4o", input="continue", previous_response_id=direct["id"]
    )

    assert fake.received[-1].raw == sent[-1]
    assert fake.last["previous_response_id"] == direct["id"]
    assert response.output_text == "echo: continue"
    proxy.drain()
    row = db(tmp_path, "SELECT detail_json FROM requests")[0]
    detail = json.loads(row["detail_json"])
    assert (detail["previous_response_id"], detail["previous_response"]) == (
        direct["id"],
        "unknown",
    )
    # Not a chain the proxy can continue: not stored as one.
    assert db(tmp_path, "SELECT COUNT(*) AS n FROM responses")[0]["n"] == 0
    c.responses.create(model="gpt-4o", input="next", previous_response_id=response.id)
    assert fake.last["previous_response_id"] == response.id


def test_store_false_without_a_session_keeps_no_chain(upstream, start, tmp_path):
    fake, _ = upstream
    proxy = start()
    c = client(proxy)
    first = c.responses.create(model="gpt-4o", input="secret", store=False)
    with pytest.raises(openai.BadRequestError) as failed:
        c.responses.create(model="gpt-4o", input="more", previous_response_id=first.id)

    # Unknown to the proxy, forwarded; unknown upstream too (store: false), as with OpenAI.
    assert failed.value.code == "previous_response_not_found"
    assert fake.last["previous_response_id"] == first.id
    assert db(tmp_path, "SELECT COUNT(*) AS n FROM items")[0]["n"] == 0


def test_upstream_error_is_relayed_and_stores_no_chain(upstream, start, tmp_path):
    fake, _ = upstream
    fake.replies.append(RReply(http_status=500))
    proxy = start()
    raw = httpx.post(
        f"{proxy.url}/v1/responses",
        json={"model": "gpt-4o", "input": "x"},
        headers={"x-session-id": "s", "authorization": "Bearer k"},
    )

    assert raw.status_code == 500
    assert raw.json()["error"]["message"] == "scripted failure"
    assert raw.headers["x-session-id"] == "s"
    proxy.drain()
    assert db(tmp_path, "SELECT status, upstream_status FROM requests")[0]["upstream_status"] == 500
    assert db(tmp_path, "SELECT COUNT(*) AS n FROM responses")[0]["n"] == 0


def test_bad_requests_get_openai_error_shapes(upstream, start):
    proxy = start()
    for body, param in [
        ({"input": "x"}, "model"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": ["x"]}, "input[0]"),
    ]:
        response = httpx.post(f"{proxy.url}/v1/responses", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == param
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_old_tool_output_is_clipped_in_the_replayed_chain(upstream, start):
    fake, _ = upstream
    fake.replies += [
        RReply(text=None, calls=[Call("get_weather", "{}")]),
        RReply(text="ok"),
        RReply(text="ok"),
    ]
    proxy = start("clip")
    c = client(proxy)
    first = c.responses.create(model="gpt-4o", input="go", tools=[WEATHER])
    big = "weather data " * 400
    second = c.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": first.output[0].call_id, "output": big}],
    )
    # Newest turn: not clipped. Once older, it is.
    assert fake.last["input"][2]["output"] == big
    raw = c.responses.with_raw_response.create(
        model="gpt-4o", previous_response_id=second.id, input="next"
    )
    clipped = fake.last["input"][2]
    assert clipped["type"] == "function_call_output" and "ctxproxy clipped" in clipped["output"]
    assert raw.headers["x-context-tool-outputs-clipped"] == "1"


# -- retrieval -----------------------------------------------------------------------


def test_stored_response_is_retrieved_listed_and_deleted_from_the_store(upstream, start):
    fake, _ = upstream
    proxy = start()
    c = client(proxy, session="s")
    first = c.responses.create(model="gpt-4o", input="one", store=False)
    second = c.responses.create(
        model="gpt-4o", input="two", previous_response_id=first.id, store=False
    )
    before = len(fake.received)

    raw = c.responses.with_raw_response.retrieve(second.id)
    assert raw.parse() == second
    validate("Response", orjson.loads(raw.http_response.content))
    listing = httpx.get(
        f"{proxy.url}/v1/responses/{second.id}/input_items",
        headers={"authorization": "Bearer sk-a"},
    ).json()
    validate("ResponseItemList", listing)
    assert texts(listing["data"]) == ["user:two", "assistant:echo: one", "user:one"]  # newest first
    page = c.responses.input_items.list(second.id, order="asc", limit=2)
    assert [texts([i.model_dump()]) for i in page.data] == [["user:one"], ["assistant:echo: one"]]
    assert page.has_more
    after = c.responses.input_items.list(second.id, order="asc", after=page.data[-1].id)
    assert texts([i.model_dump() for i in after.data]) == ["user:two"]
    assert len(fake.received) == before  # none of that reached the upstream

    deleted = httpx.delete(
        f"{proxy.url}/v1/responses/{second.id}", headers={"authorization": "Bearer sk-a"}
    )
    assert deleted.json() == {"id": second.id, "object": "response", "deleted": True}
    # Forgotten here, so now passed through (and unknown there: store was false).
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(second.id)
    assert fake.received[-1].method == "GET"


def test_deleting_a_response_deletes_only_what_no_other_response_holds(upstream, start, tmp_path):
    fake, _ = upstream
    proxy = start()
    c = client(proxy, session="s")
    one = c.responses.create(model="gpt-4o", input="one", store=False)
    two = c.responses.create(model="gpt-4o", input="two", previous_response_id=one.id, store=False)
    three = c.responses.create(
        model="gpt-4o", input="three", previous_response_id=two.id, store=False
    )

    def stored_texts() -> list[str]:
        rows = db(tmp_path, "SELECT message_json FROM items ORDER BY id")
        return [t for r in rows for t in texts([orjson.loads(r["message_json"])])]

    # two: a later response chains through its items, so only its id goes.
    c.responses.delete(two.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(two.id)  # passed through now: the upstream never stored it
    assert len(stored_texts()) == 6
    c.responses.create(model="gpt-4o", input="four", previous_response_id=three.id, store=False)
    assert texts(fake.last["input"])[:6] == [
        "user:one", "assistant:echo: one", "user:two", "assistant:echo: two",
        "user:three", "assistant:echo: three",
    ]  # fmt: skip
    four = db(tmp_path, "SELECT id FROM responses WHERE previous_response_id = ?", three.id)
    c.responses.delete(four[0]["id"])

    # three: nothing else reaches its items nor two's any more; one's stay.
    c.responses.delete(three.id)
    assert stored_texts() == ["user:one", "assistant:echo: one"]
    assert [r["n"] for r in db(tmp_path, "SELECT count(*) AS n FROM items_fts")] == [2]
    responses = db(tmp_path, "SELECT id FROM responses")
    assert [r["id"] for r in responses] == [one.id]
    details = [
        orjson.loads(r["detail_json"]) for r in db(tmp_path, "SELECT detail_json FROM requests")
    ]
    assert [d["response_id"] for d in details] == [one.id]
    # one still chains, from its own items.
    c.responses.create(model="gpt-4o", input="five", previous_response_id=one.id, store=False)
    assert texts(fake.last["input"]) == ["user:one", "assistant:echo: one", "user:five"]


def test_responses_the_proxy_never_stored_are_passed_through(upstream, start):
    fake, server = upstream
    direct = httpx.post(
        f"{server.url}/v1/responses", json={"model": "gpt-4o", "input": "upstream only"}
    ).json()
    proxy = start()
    c = client(proxy)

    assert c.responses.retrieve(direct["id"]).output_text == "echo: upstream only"
    assert [i.id for i in c.responses.input_items.list(direct["id"])] == [f"in_{direct['id']}_0"]
    c.responses.delete(direct["id"])
    assert direct["id"] not in fake.responses


def test_another_tenant_can_neither_read_chain_nor_delete_a_response(upstream, start):
    fake, _ = upstream
    proxy = start()
    alice = client(proxy, key="sk-alice")
    mine = alice.responses.create(model="gpt-4o", input="alice's")
    bob = client(proxy, key="sk-bob")
    before = len(fake.received)

    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(mine.id)
    with pytest.raises(openai.BadRequestError) as chained:
        bob.responses.create(model="gpt-4o", input="x", previous_response_id=mine.id)
    assert chained.value.code == "previous_response_not_found"
    assert len(fake.received) == before  # refused here, never passed through
    assert alice.responses.retrieve(mine.id).id == mine.id


# -- the pieces, without HTTP ----------------------------------------------------------


def test_replay_keeps_client_items_and_encrypted_reasoning_as_they_are():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"}
    message = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "x"}],
    }
    client_reasoning = {"type": "reasoning", "id": "rs_9", "summary": []}
    done = replay([reasoning, message, client_reasoning], [True, True, False], {})

    assert done.items == [reasoning, message, client_reasoning]
    assert not done.changed


def test_replay_drops_id_only_reasoning_and_the_ids_that_depended_on_it():
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    items = [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        call,
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": None},
        search,
    ]
    done = replay(items, [True] * 4, {})

    # The call keeps its call_id; a hosted tool call keeps the id its schema requires.
    assert done.items == [{k: v for k, v in call.items() if k != "id"}, search]
    assert (done.reasoning_dropped, done.ids_stripped) == (2, 1)


def test_replay_resolves_references_to_items_of_the_conversation():
    stored = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c1",
        "name": "f",
        "arguments": "{}",
    }
    reference = {"type": "item_reference", "id": "fc_1"}
    unknown = {"type": "item_reference", "id": "fc_elsewhere"}
    done = replay([reference, unknown], [False, False], ids_of([stored]))

    assert done.items == [stored, unknown]
    assert done.references_resolved == 1


def test_item_identity_ignores_status_and_empty_fields_at_any_depth():
    sent = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "t", "annotations": [], "logprobs": None}],
    }
    resent = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "phase": None,
        "content": [{"text": "t", "type": "output_text"}],
    }

    assert item_hash(sent) == item_hash(resent)
    assert item_hash(sent) != item_hash(
        {**resent, "content": [{"type": "output_text", "text": "u"}]}
    )


def test_every_kind_of_item_costs_tokens_and_tools_count_as_fixed():
    counter = ItemCounter("gpt-4o")
    bare = counter.count({"role": "user", "content": ""})
    items = [
        {"role": "user", "content": "what is the weather like in Paris today?"},
        {
            "type": "function_call",
            "call_id": "c",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "c", "output": "sunny and warm all day"},
        {
            "type": "reasoning",
            "id": "r",
            "summary": [{"type": "summary_text", "text": "check the tool"}],
        },
        {"type": "future_item", "payload": "something new"},
    ]
    assert all(counter.count(item) > bare for item in items)
    assert counter.fixed({"tools": [WEATHER], "instructions": "be brief"}) > counter.fixed({})

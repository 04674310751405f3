"""Summarization through the proxy: the openai SDK, a fake upstream that also serves the summarizer."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from policies.transcript import PAIR_REQUEST, SUMMARY_HEADER
from tests.fakes.upstream import Reply
from tests.harness import query

ROUTE = [{"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "support"}]


def policy(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "strategy": "summarize",
        "trigger": {"turns": 4},
        "keep_last_turns": 2,
        "summarizer": {"timeout_s": 2, "max_tokens": 300},
    }
    spec.update(over)
    return {"support": spec}


def client(proxy: Any, session: str | None = "s-1") -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key="sk-t", max_retries=0, default_headers=headers
    )


SYSTEM = {"role": "system", "content": "You are a support agent."}


def history(turns: int) -> list[dict[str, Any]]:
    """A support conversation: the order number and a tool call are in the first turns."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for t in range(turns):
        if t == 0:
            messages.append({"role": "user", "content": "My order #88231 has not arrived."})
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "track", "arguments": '{"order": "88231"}'},
                        }
                    ],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": "call_1", "content": "in transit " * 400}
            )
            messages.append({"role": "assistant", "content": "It is in transit."})
        else:
            messages.append({"role": "user", "content": f"question {t}"})
            messages.append({"role": "assistant", "content": f"answer {t}"})
    return messages


def ask(c: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages, **kw)


def sent(upstream: Any) -> list[dict[str, Any]]:
    return upstream.chat_requests[-1].json["messages"]


def test_summary_and_kept_turns_reach_the_upstream_in_their_places(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(), routes=ROUTE)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    raw = ask(client(proxy), messages)
    assert raw.headers["x-context-summary"] == "created"
    assert "x-context-fallback" not in raw.headers
    # Six turns, four allowed: all but the last two are summarized.
    forwarded = sent(upstream)
    kept = messages[-3:]  # "question 4", its answer, and the new question
    assert forwarded[0] == SYSTEM
    assert forwarded[2:] == kept
    summary = forwarded[1]
    assert summary["role"] == "system"
    assert summary["content"].startswith(SUMMARY_HEADER)
    assert "fake summary 1" in summary["content"]
    # The fake's summary never mentions the order: the pinned facts carry it.
    assert "order #88231" in summary["content"]
    assert raw.headers["x-context-trim-reason"] == "summarized"
    assert int(raw.headers["x-context-turns-dropped"]) == 4

    (call,) = upstream.summarizer_requests
    body = call.json
    assert body["temperature"] == 0 and body["max_tokens"] <= 300 and body["stream"] is False
    assert "ctxproxy-summarizer" in body["messages"][0]["content"]
    task = body["messages"][1]["content"]
    # Roles are kept as labels: the tool call is the assistant's, not the user's.
    assert "[user]\nMy order #88231 has not arrived." in task
    assert "[assistant called tool track]" in task
    assert "[tool result call_1]" in task and "[...]" in task  # the tool output is clipped
    assert "question 4" not in task

    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    (row,) = query(db, "SELECT * FROM summaries")
    assert row["start_unit"] == 0 and row["previous_summary_id"] is None
    assert row["model"] == "gpt-4o" and row["prompt_hash"]
    assert {"kind": "id", "value": "order #88231"} in json.loads(row["facts_json"])
    assert json.loads(row["usage_json"])["completion_tokens"] == 5
    assert query(db, "SELECT id FROM items WHERE token_count IS NULL") == []
    covered = query(db, "SELECT message_json FROM items WHERE id = ?", row["covers_item_id"])
    assert json.loads(covered[0]["message_json"]) == messages[-4]  # "answer 3"
    (request,) = query(db, "SELECT * FROM requests")
    detail = json.loads(request["detail_json"])
    summary = detail["summary"]
    assert summary["status"] == "created" and summary["wait_ms"] >= 0
    assert summary["id"] == row["id"] and summary["units"] == 4 and summary["tokens"] > 0


def test_the_same_history_reuses_the_stored_summary_without_a_call(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(), routes=ROUTE)
    c = client(proxy)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    first = ask(c, messages)
    proxy.drain()
    reply = first.parse().choices[0].message.model_dump(exclude_none=True)
    again = ask(c, [*messages, reply, {"role": "user", "content": "And now?"}])
    proxy.drain()
    assert again.headers["x-context-summary"] == "reused"
    assert len(upstream.summarizer_requests) == 1
    # The prefix the upstream saw is unchanged: a provider's prompt cache still hits.
    assert sent(upstream)[:5] == upstream.chat_requests[0].json["messages"][:5]
    assert proxy.runtime.metrics.summaries.value(("reused",)) == 1


def test_a_later_summary_folds_in_only_the_new_turns(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(prefetch=False), routes=ROUTE)
    c = client(proxy)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    ask(c, messages)
    proxy.drain()
    for t in range(3):  # three more turns: six verbatim again, over the trigger
        messages += [{"role": "assistant", "content": f"later {t}"}]
        messages += [{"role": "user", "content": f"follow-up {t}"}]
    raw = ask(c, messages)
    assert raw.headers["x-context-summary"] == "created"
    _, second = upstream.summarizer_requests
    task = second.json["messages"][1]["content"]
    assert "The summary so far" in task and "fake summary 1" in task
    assert "question 4" in task and "follow-up 0" in task
    # Cost is what is new: nothing already summarized is sent again.
    assert "My order #88231" not in task and "question 1" not in task
    assert "follow-up 1" not in task  # the last two turns stay verbatim
    forwarded = sent(upstream)
    assert "fake summary 2" in forwarded[1]["content"]
    assert "order #88231" in forwarded[1]["content"]  # pinned facts carry over
    assert forwarded[2:] == messages[-3:]
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT id, previous_summary_id FROM summaries")
    assert [r["previous_summary_id"] for r in rows] == [None, rows[0]["id"]]


def test_the_next_summary_is_prepared_in_the_background_after_the_answer(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(), routes=ROUTE)
    c = client(proxy)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    for t in range(3):
        raw = ask(c, messages)
        proxy.drain()
        reply = raw.parse().choices[0].message.model_dump(exclude_none=True)
        messages += [reply, {"role": "user", "content": f"follow-up {t}"}]
    # Request 1 made the first summary; after request 3 the next request would
    # pass the trigger, so its summary was made once request 3 was answered.
    assert len(upstream.summarizer_requests) == 2
    raw = ask(c, messages)
    assert raw.headers["x-context-summary"] == "reused"
    assert len(upstream.summarizer_requests) == 2
    assert "fake summary 2" in sent(upstream)[1]["content"]


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(status=500), "summarizer_error"),
        (Reply(content="   "), "summarizer_empty"),
        (Reply(content="late", delay=1.5), "summarizer_timeout"),
        # Stopped at the summarizer's max_tokens: a summary cut off mid-way.
        (
            Reply(content="## Goal and context\n- order 88231 is", finish_reason="length"),
            "summarizer_cut_off",
        ),
        # A model that never saw its instructions repeats the conversation.
        (
            Reply(
                content='My order #88231 has not arrived.\n{"order": "88231"}\n'
                + "in transit " * 20
            ),
            "summarizer_echo",
        ),
    ],
)
def test_a_failing_summarizer_falls_back_to_trimming_and_loses_nothing(
    fake, start_proxy, tmp_path, reply, reason
):
    upstream, _ = fake
    upstream.summary_replies.append(reply)
    proxy = start_proxy(
        policies=policy(summarizer={"timeout_s": 0.5}, prefetch=False), routes=ROUTE
    )
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    raw = ask(client(proxy), messages)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-context-summary"] == "fallback"
    assert raw.headers["x-context-fallback"] == reason
    # Trimming to the trigger's four turns, no summary message.
    forwarded = sent(upstream)
    assert forwarded == [SYSTEM, *messages[-7:]]
    assert raw.headers["x-context-trim-reason"] == "max_turns"
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    assert query(db, "SELECT * FROM summaries") == []
    stored = [json.loads(r["message_json"]) for r in query(db, "SELECT * FROM items ORDER BY id")]
    assert stored[: len(messages)] == messages
    (request,) = query(db, "SELECT detail_json FROM requests")
    assert json.loads(request["detail_json"])["fallback"] == reason
    metrics = proxy.runtime.metrics
    assert metrics.fallbacks.value(("support", reason)) == 1
    proxy.loop.run(proxy.runtime.background.drain())
    assert metrics.summaries.value(("failed",)) == 1


def test_two_concurrent_requests_cause_one_summarizer_call(fake, start_proxy, tmp_path):
    upstream, _ = fake
    upstream.summary_replies.append(Reply(content="the one summary", delay=0.4))
    proxy = start_proxy(policies=policy(summarizer={"timeout_s": 5}), routes=ROUTE)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    c = client(proxy)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: ask(c, messages), range(2)))
    assert sorted(r.headers["x-context-summary"] for r in results) == ["created", "waited"]
    assert len(upstream.summarizer_requests) == 1
    for request in upstream.chat_requests:
        assert "the one summary" in request.json["messages"][1]["content"]
    proxy.drain()
    assert len(query(tmp_path / "ctxproxy.db", "SELECT * FROM summaries")) == 1


def test_pair_placement_sends_a_question_and_the_summary_as_its_answer(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(placement="pair"), routes=ROUTE)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    ask(client(proxy), messages)
    forwarded = sent(upstream)
    assert forwarded[0] == SYSTEM
    assert forwarded[1] == {"role": "user", "content": PAIR_REQUEST}
    assert forwarded[2]["role"] == "assistant"
    assert forwarded[2]["content"].startswith(SUMMARY_HEADER)
    assert forwarded[3:] == messages[-3:]


def test_a_streamed_request_is_summarized_too(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(), routes=ROUTE)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    with client(proxy).chat.completions.with_streaming_response.create(
        model="gpt-4o", messages=messages, stream=True
    ) as response:
        assert response.headers["x-context-summary"] == "created"
        text = "".join(
            chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices
        )
    assert text == "echo: Any news?"
    assert sent(upstream)[2:] == messages[-3:]


def test_without_a_session_a_needed_summary_falls_back_to_trimming(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(), routes=ROUTE)
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    raw = ask(client(proxy, session=None), messages)
    assert raw.headers["x-context-fallback"] == "no_session"
    assert upstream.summarizer_requests == []
    assert sent(upstream) == [SYSTEM, *messages[-7:]]


def test_a_short_history_is_forwarded_as_it_came(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(), routes=ROUTE)
    messages = [*history(2), {"role": "user", "content": "Any news?"}]
    raw = ask(client(proxy), messages)
    assert raw.headers["x-context-summary"] == "none"
    assert sent(upstream) == messages
    assert upstream.summarizer_requests == []


def test_server_history_routes_summarize_the_stored_history(fake, start_proxy):
    upstream, _ = fake
    routes = [{**ROUTE[0], "history": "server"}]
    proxy = start_proxy(policies=policy(), routes=routes)
    c = client(proxy, "server-1")
    ask(c, [SYSTEM, {"role": "user", "content": "My order #5512 is late."}])
    for t in range(5):
        proxy.drain()
        raw = ask(c, [{"role": "user", "content": f"question {t}"}])
    assert raw.headers["x-context-summary"] in ("created", "reused", "waited")
    forwarded = sent(upstream)
    assert forwarded[0] == SYSTEM
    assert "order #5512" in forwarded[1]["content"]
    assert forwarded[-1] == {"role": "user", "content": "question 4"}


@pytest.mark.parametrize(
    ("system_messages", "instructions_as"), [("first", "system"), ("none", "user")]
)
def test_a_template_without_later_system_messages_gets_the_summary_as_a_pair(
    fake, start_proxy, tmp_path, system_messages, instructions_as
):
    """llama-cpp-python's formats keep only a leading system message (or none): the
    summary goes as a user/assistant pair, and with none shown at all the summarizer's
    instructions go in its user message."""
    upstream, server = fake
    from tests.harness import make_config

    config = make_config(server.url, tmp_path, policies=policy(), routes=ROUTE)
    import dataclasses

    local = dataclasses.replace(config.upstreams["default"], system_messages=system_messages)
    proxy = start_proxy(config=dataclasses.replace(config, upstreams={"default": local}))
    messages = [*history(5), {"role": "user", "content": "Any news?"}]
    raw = ask(client(proxy), messages)
    assert raw.headers["x-context-summary"] == "created"
    forwarded = sent(upstream)
    assert forwarded[:2] == [SYSTEM, {"role": "user", "content": PAIR_REQUEST}]
    assert forwarded[2]["role"] == "assistant"
    assert forwarded[2]["content"].startswith(SUMMARY_HEADER)
    [call] = upstream.summarizer_requests
    roles = [m["role"] for m in call.json["messages"]]
    if instructions_as == "system":
        assert roles == ["system", "user"]
    else:
        assert roles == ["user"]
        assert call.json["messages"][0]["content"].startswith("You are ctxproxy-summarizer.")
        assert "My order #88231" in call.json["messages"][0]["content"]

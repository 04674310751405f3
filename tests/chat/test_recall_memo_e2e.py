"""A request resent over a session whose stored items did not change recalls from the memo."""

from __future__ import annotations

import json
from typing import Any

from policies.summarize import plan
from proxy.context import summaries
from tests.chat.test_recall_e2e import POLICY, QUESTION, ROUTE, block_index, user_turn
from tests.chat.test_trim_e2e import client
from tests.harness import query

RECALL_HEADERS = ("x-context-recall", "x-context-recalled", "x-context-recall-tokens")


def recall_detail(tmp_path: Any, request_id: str) -> dict[str, Any]:
    (row,) = query(
        tmp_path / "ctxproxy.db", "SELECT detail_json FROM requests WHERE id = ?", request_id
    )
    detail: dict[str, Any] = json.loads(row["detail_json"])["recall"]
    detail.pop("ms")
    return detail


def test_a_resent_request_is_recalled_without_a_search_until_the_session_changes(
    fake, start_proxy, tmp_path
):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICY, routes=ROUTE)
    c = client(proxy, "memo")
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a shop assistant."}]
    for t in range(1, 40):
        history.append({"role": "user", "content": user_turn(t)})
        reply = c.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    proxy.drain()
    index = proxy.runtime.recall._index
    search = index.search
    searches: list[Any] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        searches.append(args)
        return await search(*args, **kwargs)

    index.search = counted
    asked = [*history, {"role": "user", "content": QUESTION}]

    def send() -> Any:
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=asked)
        proxy.drain()
        return raw

    send()  # stores the question and its answer: the session's items change
    second = send()
    assert len(searches) == 2
    third = send()
    # Nothing stored since the second: the same recall, without searching again.
    assert len(searches) == 2
    assert third.headers["x-context-recall"] == "recalled"
    for name in RECALL_HEADERS:
        assert third.headers[name] == second.headers[name]
    sent = [r for r in upstream.received if r.path.endswith("/chat/completions")]
    assert sent[-1].raw == sent[-2].raw
    assert block_index(sent[-1].json["messages"]) is not None
    first_row = recall_detail(tmp_path, second.headers["x-ctxproxy-request-id"])
    assert recall_detail(tmp_path, third.headers["x-ctxproxy-request-id"]) == first_row
    # A new turn: another query over other items, searched.
    answer = third.parse().choices[0].message.content
    asked += [{"role": "assistant", "content": answer}, {"role": "user", "content": QUESTION}]
    send()
    assert len(searches) == 3


def test_a_resent_balanced_request_forwards_what_the_last_one_did_from_the_memos(
    fake, start_proxy, tmp_path, monkeypatch
):
    upstream, _ = fake
    route = {"match": {"path": "/v1/chat/completions"}, "upstream": "default"}
    proxy = start_proxy(routes=[{**route, "policy": "balanced"}])
    c = client(proxy, "memo-balanced")
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a shop assistant."}]
    history += [{"role": "user", "content": user_turn(t)} for t in range(1, 15)]
    history.append({"role": "user", "content": QUESTION})
    plans, searches = [], []
    index = proxy.runtime.recall._index
    search = index.search

    def counted_plan(*args: Any, **kwargs: Any) -> Any:
        plans.append(args)
        return plan(*args, **kwargs)

    async def counted_search(*args: Any, **kwargs: Any) -> Any:
        searches.append(args)
        return await search(*args, **kwargs)

    monkeypatch.setattr(summaries, "plan", counted_plan)
    index.search = counted_search
    raws = []
    for _ in range(4):
        raws.append(c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history))
        proxy.drain()
    # The first made the summary and stored the history: the second planned and
    # searched over what is stored now, the last two took what it found.
    assert [r.headers["x-context-summary"] for r in raws] == ["created", *["reused"] * 3]
    assert (len(plans), len(searches)) == (2, 2)
    assert raws[-1].headers["x-context-recall"] == "recalled"
    chats = [r for r in upstream.received if r.json.get("messages", [{}])[-1] == history[-1]]
    assert chats[-1].raw == chats[-2].raw == chats[-3].raw
    assert recall_detail(tmp_path, raws[-1].headers["x-ctxproxy-request-id"]) == recall_detail(
        tmp_path, raws[-2].headers["x-ctxproxy-request-id"]
    )

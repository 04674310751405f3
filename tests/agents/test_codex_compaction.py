"""Codex's remote compaction answered by the proxy, for an upstream that has never heard of it.

The real Codex CLI reads notes files one shell command at a time with an
auto-compaction limit low enough to compact twice; the proxy answers each
``compaction_trigger`` with its one ``compaction`` item (the summary written by
the route's upstream, here the fake's chat endpoint) and expands that item
into the summary on every later request. Then the standalone endpoints are
driven with the compaction requests Codex itself sent
(tests/data/codex-session.json, recorded through the proxy).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.transcript import SUMMARY_HEADER
from tests.agents.codex import run_codex
from tests.agents.session import AUTO_COMPACT, FACTS, PROMPT, command, load, unpack
from tests.fakes.coding_task import CodingTask
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query

ADMIN_KEY = "adm-codex-0123456789"
FOREIGN = ("compaction", "compaction_trigger")
# What the summarizer answers: the task, none of the values the notes held.
SUMMARIES = [
    "## Goal\n- read the notes files one at a time\n## Done\n- the first three (SUMMARY-ONE)",
    "## Goal\n- read the notes files one at a time\n## Done\n- the first six (SUMMARY-TWO)",
]


@pytest.fixture
def task(loop_thread: LoopThread) -> Iterator[tuple[CodingTask, AiohttpServer]]:
    fake = CodingTask(commands=[command(f) for f in FACTS[:7]])
    for text in SUMMARIES:
        fake.summary(text)
    server = AiohttpServer(loop_thread, fake.app())
    yield fake, server
    server.stop()


@pytest.fixture
def proxy(
    loop_thread: LoopThread,
    task: tuple[CodingTask, AiohttpServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ProxyServer]:
    monkeypatch.setenv("CTX_ADMIN_KEY", ADMIN_KEY)
    # No compaction setting: for an upstream that is not OpenAI's the proxy answers it.
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default"}]
    admin = {"admin": {"api_key": "os.environ/CTX_ADMIN_KEY"}}
    config = make_config(task[1].url, tmp_path, routes=routes, extra=admin)
    server = ProxyServer(loop_thread, config)
    yield server
    server.stop()


def texts(body: dict[str, Any]) -> list[str]:
    """The text of every input item (a message's parts, a tool output)."""
    out = []
    for item in body["input"]:
        content = item.get("content")
        if isinstance(content, list):
            out.append("".join(p.get("text", "") for p in content if isinstance(p, dict)))
        else:
            out.append(str(content if content is not None else item.get("output", "")))
    return out


def detail(row: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(row["detail_json"]).get("compaction", {})
    return found


def test_codex_compacts_twice_through_the_proxy_and_finishes(
    task: tuple[CodingTask, AiohttpServer], proxy: ProxyServer, tmp_path: Path
) -> None:
    fake, _ = task
    run = run_codex(tmp_path, proxy.url, PROMPT, auto_compact_tokens=AUTO_COMPACT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "remote compaction" not in run.stderr
    assert run.stdout.startswith("Done. The last command printed:")
    assert FACTS[6].line in run.stdout

    # Nothing the upstream cannot read reached it: no trigger, no compaction item.
    turns = fake.turns
    assert len(turns) == 8  # seven commands, then the final message
    assert not [i for t in turns for i in t["input"] if i.get("type") in FOREIGN]

    # The proxy answered each of Codex's compactions itself, from the summarizer's text.
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    thread = fake.received[0].headers["thread-id"]
    rows = query(db, "SELECT * FROM requests ORDER BY created_at")
    asked = [r for r in rows if detail(r).get("asked") == "trigger"]
    assert len(asked) == 2
    assert all(detail(r)["mode"] == "proxy" and r["status"] == 200 for r in asked)
    assert [detail(r)["item_id"][:4] for r in asked] == ["cmp_", "cmp_"]
    assert len(fake.chat.summarizer_requests) == 2
    # The second compaction extends the first summary with only the turns after what
    # the first covered: the restored turns, Codex's retained messages and the expanded
    # summary are not summarized again (the summary is never a turn of its own).
    first, second = (detail(r) for r in asked)
    assert (first["incremental"], second["incremental"]) == (False, True)
    assert second["covered_items"] > first["covered_items"]
    calls = [r.json["messages"][-1]["content"] for r in fake.chat.summarizer_requests]
    assert "The summary so far:" not in calls[0]
    summary, _, newer = calls[1].partition("New turns since then:")
    assert "SUMMARY-ONE" in summary and "SUMMARY-ONE" not in newer
    assert SUMMARY_HEADER not in calls[1] and PROMPT not in newer
    assert [f.file for f in FACTS[:6] if f"notes/{f.file}" in newer] == [f.file for f in FACTS[3:6]]
    assert second["new_items"] == newer.count("[assistant called tool") * 2

    # Every request after a compaction carries its summary, expanded, in place of
    # the folded turns; Codex's developer and user messages stay as they came.
    summaries = [[t for t in texts(turn) if SUMMARY_HEADER in t] for turn in turns]
    assert [len(s) for s in summaries] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert all("SUMMARY-ONE" in s[0] for s in summaries[3:6])
    assert all("SUMMARY-TWO" in s[0] for s in summaries[6:])
    for n, turn in enumerate(turns):
        folded = FACTS[: 3 * ((n >= 3) + (n >= 6))]
        verbatim = "\n".join(t for t in texts(turn) if SUMMARY_HEADER not in t)
        assert not [f.line for f in folded if f.line in verbatim], n
        assert PROMPT in verbatim

    # One session for Codex's thread across its compaction windows; every turn
    # the compactions folded away is still stored.
    assert [s["key"] for s in query(db, "SELECT key FROM sessions")] == [thread]
    assert {r["session_key"] for r in rows} == {thread}
    assert len(rows) == len(turns) + 2
    outputs = query(db, "SELECT message_json FROM items WHERE role = 'function_call_output'")
    stored = "\n".join(r["message_json"] for r in outputs)
    assert all(f.line in stored for f in FACTS[:7])
    # Every request after the first compaction, the second compaction too, had its
    # compaction item expanded.
    ids = [r["id"] for r in rows]
    expanded = [r["id"] for r in rows if detail(r).get("expanded")]
    assert expanded == ids[ids.index(asked[0]["id"]) + 1 :]

    # The admin API shows each compaction on its request.
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for row in asked:
        shown = httpx.get(f"{proxy.url}/admin/requests/{row['id']}", headers=auth)
        assert shown.status_code == 200
        assert "compaction" in json.dumps(shown.json())


def compaction_requests() -> list[dict[str, Any]]:
    return [body for kind, body in unpack(load()) if kind == "compaction"]


def sse(text: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return events


def test_the_compaction_requests_codex_sent_get_one_compaction_item_each(
    task: tuple[CodingTask, AiohttpServer], proxy: ProxyServer
) -> None:
    fake, _ = task
    recorded = compaction_requests()
    assert len(recorded) == 4
    headers = {"session-id": "recorded-1", "Authorization": "Bearer sk-codex-test"}
    for n, body in enumerate(recorded):
        # As Codex sent it: streamed, the trigger last (and, after the first, the
        # item OpenAI answered the previous compaction with in the input).
        assert body["stream"] is True and body["input"][-1] == {"type": "compaction_trigger"}
        answer = httpx.post(f"{proxy.url}/v1/responses", json=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        # The headers say what happened: a summary made (or reused) for the
        # session Codex's own header named.
        assert answer.headers["x-context-compaction"] in ("created", "waited", "reused")
        assert answer.headers["x-context-session-source"] == "codex:session-id"
        events = sse(answer.text)
        kinds = [e["type"] for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [i["type"] for i in done] == ["compaction"], n
        assert events[-1]["response"]["output"] == done
        assert events[-1]["response"]["usage"]["input_tokens"] > 0
    assert fake.received == []


def user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_with_compaction_off_codex_is_told_so_and_nothing_reaches_the_upstream(
    loop_thread: LoopThread, task: tuple[CodingTask, AiohttpServer], tmp_path: Path
) -> None:
    fake, server = task
    route = {"match": {"path": "/v1/responses"}, "upstream": "default", "compaction": "off"}
    proxy = ProxyServer(loop_thread, make_config(server.url, tmp_path, routes=[route]))
    try:
        run = run_codex(tmp_path, proxy.url, PROMPT, auto_compact_tokens=AUTO_COMPACT)
        proxy.drain()
    finally:
        proxy.stop()
    # Codex stops at its first compaction, with the proxy's error, not an upstream's.
    assert run.returncode != 0
    assert "compaction_not_supported" in run.stderr, run.stderr[-2000:]
    assert not [i for t in fake.turns for i in t["input"] if i.get("type") in FOREIGN]
    rows = query(tmp_path / "ctxproxy.db", "SELECT status, error FROM requests")
    refused = [r for r in rows if r["status"] == 400]
    assert refused and all("compaction_not_supported" in (r["error"] or "") for r in refused)


@pytest.mark.parametrize("n", range(4))
def test_the_standalone_compact_endpoint_with_each_history_codex_compacted(
    task: tuple[CodingTask, AiohttpServer], proxy: ProxyServer, n: int
) -> None:
    fake, _ = task
    body = compaction_requests()[n]
    # What Codex had when it compacted, its trigger left out (and, after the first,
    # the item OpenAI answered the previous compaction with: foreign here).
    history = body["input"][:-1]
    headers = {"session-id": f"recorded-compact-{n}", "Authorization": "Bearer sk-codex-test"}
    compact = {k: body[k] for k in ("model", "tools", "parallel_tool_calls", "reasoning")}
    answer = httpx.post(
        f"{proxy.url}/v1/responses/compact",
        json={**compact, "input": history},
        headers=headers,
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["object"] == "response.compaction"
    # Codex's own messages retained, then exactly one compaction item, last.
    assert [i["type"] for i in data["output"]][-1] == "compaction"
    assert sum(i["type"] == "compaction" for i in data["output"]) == 1
    assert any(PROMPT in t for t in texts({"input": data["output"][:-1]}))
    assert fake.received == []

    # Codex's next turn over the compacted window: the upstream reads the summary
    # the summarizer wrote, and nothing it cannot read.
    follow = {**body, "input": [*data["output"], user_message("Which port did db.env set?")]}
    follow["stream"] = False
    turn = httpx.post(f"{proxy.url}/v1/responses", json=follow, headers=headers, timeout=30)
    assert turn.status_code == 200, turn.text
    assert turn.headers["x-context-compaction"] == "expanded"
    (sent,) = fake.turns
    assert not [i for i in sent["input"] if i.get("type") in FOREIGN]
    (summary,) = [t for t in texts(sent) if SUMMARY_HEADER in t]
    assert "SUMMARY-ONE" in summary


def test_with_compaction_upstream_codex_compacts_with_an_upstream_that_reads_it(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    # An upstream that answers compaction itself, as OpenAI's API does.
    fake = CodingTask(commands=[command(f) for f in FACTS[:7]], compaction=True)
    server = AiohttpServer(loop_thread, fake.app())
    route = {"match": {"path": "/v1/responses"}, "upstream": "default", "compaction": "upstream"}
    proxy = ProxyServer(loop_thread, make_config(server.url, tmp_path, routes=[route]))
    try:
        run = run_codex(tmp_path, proxy.url, PROMPT, auto_compact_tokens=AUTO_COMPACT)
        proxy.drain()
    finally:
        proxy.stop()
        server.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    # The triggers and the upstream's own items went through as they came.
    triggers = [t for t in fake.turns if t["input"][-1] == {"type": "compaction_trigger"}]
    assert len(triggers) == fake.compactions == 2
    assert not fake.chat.summarizer_requests
    carried = [i for t in fake.turns for i in t["input"] if i.get("type") == "compaction"]
    assert carried and all(i["encrypted_content"].startswith("opaque-") for i in carried)


def test_a_resumed_codex_question_gets_a_turn_two_compactions_folded_away_back_by_recall(
    loop_thread: LoopThread, task: tuple[CodingTask, AiohttpServer], tmp_path: Path
) -> None:
    fake, server = task
    # Everything the client sends is kept; recall may add up to 1,000 tokens.
    policies = {
        "agent": {"strategy": "trim", "max_tokens": 100_000, "recall": {"max_tokens": 1000}}
    }
    route = {"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "agent"}
    config = make_config(server.url, tmp_path, routes=[route], policies=policies)
    proxy = ProxyServer(loop_thread, config)
    try:
        first = run_codex(tmp_path, proxy.url, PROMPT, auto_compact_tokens=AUTO_COMPACT)
        assert first.returncode == 0, first.stderr[-3000:]
        question = "Which port did db.env give the billing database?"
        again = run_codex(
            tmp_path, proxy.url, question, auto_compact_tokens=AUTO_COMPACT, resume=True
        )
        assert again.returncode == 0, again.stderr[-3000:]
        proxy.drain()
    finally:
        proxy.stop()
    # Codex resent only its compacted window; db.env's turn was folded into the
    # summaries, which do not hold the port. The proxy's stored history still
    # does: recall quoted the turn, verbatim, to the upstream.
    asked = fake.turns[-1]
    assert any(question in t for t in texts(asked))
    assert not [i for i in asked["input"] if i.get("type") in FOREIGN]
    verbatim = [t for t in texts(asked) if not t.startswith(SUMMARY_HEADER)]
    summary = [t for t in texts(asked) if t.startswith(SUMMARY_HEADER)]
    assert summary and "7311" not in summary[0]
    assert any(FACTS[0].line in t and t.startswith("[ctxproxy recall]") for t in verbatim)
    # Still one session: Codex's thread across both runs and every compaction window.
    thread = fake.received[0].headers["thread-id"]
    assert fake.received[-1].headers["thread-id"] == thread
    assert [s["key"] for s in query(tmp_path / "ctxproxy.db", "SELECT key FROM sessions")] == [
        thread
    ]

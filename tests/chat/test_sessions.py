"""Sessions: tenant scoping, server-side history, concurrency, disconnects, the log line."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import openai
import structlog

from tests.fakes.upstream import Reply
from tests.harness import query, wait_until

SERVER_HISTORY = [
    {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "history": "server"}
]


def client(proxy: Any, session: str | None, key: str = "sk-a") -> openai.OpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1", api_key=key, default_headers=headers, max_retries=0
    )


def ask(c: openai.OpenAI, text: str) -> str:
    out = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": text}])
    return out.choices[0].message.content or ""


def test_server_history_is_prepended_in_order(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(routes=SERVER_HISTORY)
    c = client(proxy, "conv")
    ask(c, "first")
    proxy.drain()
    ask(c, "second")
    sent = upstream.received[-1].json["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "first"),
        ("assistant", "echo: first"),
        ("user", "second"),
    ]


def test_same_session_id_under_two_keys_is_two_sessions(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(routes=SERVER_HISTORY)
    alice, mallory = (
        client(proxy, "shared-id", "sk-alice"),
        client(proxy, "shared-id", "sk-mallory"),
    )
    ask(alice, "alice secret")
    proxy.drain()
    ask(mallory, "hello")
    assert [m["content"] for m in upstream.received[-1].json["messages"]] == ["hello"]
    proxy.drain()
    tenants = query(tmp_path / "ctxproxy.db", "SELECT tenant, key FROM sessions ORDER BY id")
    assert len(tenants) == 2 and tenants[0]["tenant"] != tenants[1]["tenant"]
    assert all("sk-" not in r["tenant"] for r in tenants)


def test_request_without_session_is_proxied_but_not_stored(fake, start_proxy, tmp_path):
    proxy = start_proxy()
    assert ask(client(proxy, None), "anon") == "echo: anon"
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    assert query(db, "SELECT count(*) AS n FROM items")[0]["n"] == 0
    assert query(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 0


def test_session_id_fallback_from_body_metadata(fake, start_proxy, tmp_path):
    proxy = start_proxy(extra={"session": {"fallbacks": ["body.metadata.session_id", "body.user"]}})
    c = client(proxy, None)
    raw = c.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "x"}],
        metadata={"session_id": "from-meta"},
        user="from-user",
    )
    assert raw.headers["x-session-id"] == "from-meta"
    raw = c.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], user="from-user"
    )
    assert raw.headers["x-session-id"] == "from-user"


def test_edited_history_creates_a_branch_and_keeps_the_old_one(fake, start_proxy, tmp_path):
    proxy = start_proxy()
    c = client(proxy, "edit")
    base = [{"role": "system", "content": "sys"}, {"role": "user", "content": "v1"}]
    c.chat.completions.create(model="gpt-4o", messages=base)
    c.chat.completions.create(
        model="gpt-4o", messages=[base[0], {"role": "user", "content": "v2 edited"}]
    )
    proxy.drain()
    items = query(tmp_path / "ctxproxy.db", "SELECT id, parent_id, role, message_json FROM items")
    contents = [json.loads(r["message_json"])["content"] for r in items]
    assert contents.count("sys") == 1
    assert {"v1", "v2 edited", "echo: v1", "echo: v2 edited"} <= set(contents)


def test_concurrent_requests_on_one_session_are_all_stored(fake, start_proxy, tmp_path):
    proxy = start_proxy()
    prefix = [{"role": "system", "content": "shared"}, {"role": "user", "content": "q0"}]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            client(proxy, "busy").chat.completions.create(
                model="gpt-4o",
                messages=[
                    *prefix,
                    {"role": "assistant", "content": "a0"},
                    {"role": "user", "content": f"q{i}"},
                ],
            )
        except BaseException as exc:  # collected and re-raised by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(1, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    rows = query(db, "SELECT message_json FROM items")
    contents = [json.loads(r["message_json"])["content"] for r in rows]
    assert contents.count("shared") == 1 and contents.count("q0") == 1 and contents.count("a0") == 1
    assert sorted(c for c in contents if c.startswith("q") and c != "q0") == sorted(
        f"q{i}" for i in range(1, 11)
    )
    assert query(db, "SELECT count(*) AS n FROM requests")[0]["n"] == 10


def test_concurrent_server_history_requests_are_serialised(fake, start_proxy):
    upstream, _ = fake
    upstream.replies += [Reply(content=f"r{i}", delay=0.05) for i in range(5)]
    proxy = start_proxy(routes=SERVER_HISTORY)
    threads = [
        threading.Thread(target=ask, args=(client(proxy, "serial"), f"m{i}")) for i in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = upstream.received[-1].json["messages"]
    # The fifth request saw the four earlier exchanges, each with its reply.
    assert len(last) == 9
    assert [m["role"] for m in last] == ["user", "assistant"] * 4 + ["user"]


def test_client_disconnect_mid_stream_stores_partial_reply_as_incomplete(
    fake, start_proxy, tmp_path
):
    upstream, _ = fake
    upstream.replies.append(Reply(content="x" * 400, chunk_delay=0.02))
    proxy = start_proxy()
    with httpx.stream(
        "POST",
        proxy.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]},
        headers={"x-session-id": "gone", "authorization": "Bearer k"},
    ) as response:
        for n, _ in enumerate(response.iter_raw()):
            if n == 3:
                break
    db = tmp_path / "ctxproxy.db"
    wait_until(lambda: bool(query(db, "SELECT 1 FROM requests")), timeout=10)
    proxy.drain()
    req = query(db, "SELECT incomplete FROM requests")[0]
    assert req["incomplete"] == 1
    reply = query(db, "SELECT message_json, status FROM items WHERE role='assistant'")[0]
    assert reply["status"] == "incomplete"
    assert 0 < len(json.loads(reply["message_json"])["content"]) < 400
    # The upstream stream was closed too: it did not send all of its 100+ chunks.
    wait_until(lambda: upstream.stream_chunks < 100, timeout=5)
    assert upstream.stream_chunks < 100


def test_upstream_dropping_the_stream_is_stored_incomplete(fake, start_proxy, tmp_path):
    upstream, _ = fake
    upstream.replies.append(Reply(content="y" * 100, break_after_chunks=5))
    proxy = start_proxy()
    with httpx.stream(
        "POST",
        proxy.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]},
        headers={"x-session-id": "dropped", "authorization": "Bearer sk-a"},
    ) as response:
        body = b"".join(response.iter_raw())
    assert b"[DONE]" not in body
    proxy.drain()
    assert query(tmp_path / "ctxproxy.db", "SELECT incomplete FROM requests")[0]["incomplete"] == 1


def test_one_request_completed_line_without_content_or_key(fake, start_proxy):
    proxy = start_proxy()
    with structlog.testing.capture_logs() as logs:
        client(proxy, "logged", key="sk-super-secret").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "very private words"}]
        )
        proxy.drain()
    done = [e for e in logs if e["event"] == "request_completed"]
    assert len(done) == 1
    line = done[0]
    for field in (
        "request_id", "session", "tenant", "route", "policy", "model", "stream", "status",
        "tokens_before", "tokens_after", "messages_dropped", "upstream_ms", "total_ms",
    ):  # fmt: skip
        assert field in line, field
    assert line["session"] == "logged" and line["status"] == 200
    text = repr(logs)
    assert "very private words" not in text
    assert "sk-super-secret" not in text


def test_a_streamed_exchange_is_written_as_a_whole_ones_sharing_commits(
    fake, start_proxy, tmp_path, monkeypatch
):
    # Client-held history: nobody waits for a stream's row, so it may wait for
    # company as a whole answer's does (a commit shared, off the next request's path).
    from proxy.store import writer

    monkeypatch.setattr(writer, "_BUSY_S", 60.0)  # every batch counts as "moments ago"
    proxy = start_proxy()
    c = client(proxy, "streams")
    for text in ("first", "second", "third"):
        chunks = c.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}], stream=True
        )
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        proxy.drain()
    assert len(query(tmp_path / "ctxproxy.db", "SELECT id FROM requests")) == 3
    assert proxy.runtime.store._writer.lingers == 2

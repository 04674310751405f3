"""The hot path's caches change nothing: what is forwarded, answered and stored is the same.

One scripted session (a growing history, a resend, an edit Python calls equal,
a fork, another model, a trimming budget) goes through a proxy with its caches
and through one whose caches never remember anything.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.context.message_cache import MessageCache
from proxy.store.chains import ChainCache
from tests.harness import make_config

# Counted differently by gpt-4o's and gpt-4's tokenizers.
SYSTEM = {"role": "system", "content": "You are terse. 日本語で答えて。"}


def turn(n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {n} " + "words " * 20},
        {"role": "assistant", "content": f"echo: question {n} " + "words " * 20},
    ]


def script() -> list[tuple[str, list[dict[str, Any]]]]:
    """(model, messages) per request, as a client would send them."""
    history = [SYSTEM, *turn(1), *turn(2)]
    tagged = {"role": "user", "content": [{"type": "text", "text": "n?", "n": 1}]}
    retyped = {"role": "user", "content": [{"type": "text", "text": "n?", "n": 1.0}]}
    forked = [SYSTEM, *turn(1), {"role": "user", "content": "something else"}]
    return [
        ("gpt-4o", [SYSTEM, {"role": "user", "content": "hello"}]),
        ("gpt-4o", [*history, {"role": "user", "content": "go on"}]),
        ("gpt-4o", [*history, {"role": "user", "content": "go on"}]),  # resent as it was
        ("gpt-4o", [*history, tagged]),
        ("gpt-4o", [*history, retyped]),  # == to the last one in Python, not in JSON
        ("gpt-4o", forked),
        ("gpt-4", [*history, *turn(3), {"role": "user", "content": "again"}]),  # another tokenizer
        ("gpt-4o", [*history, *turn(3), *turn(4), {"role": "user", "content": "fit me"}]),
    ]


def run(fake: Any, start_proxy: Any, directory: Path, *, cached: bool) -> dict[str, Any]:
    upstream, server = fake
    config = make_config(
        server.url,
        directory,
        policies={"fit": {"strategy": "trim", "max_tokens": 200, "low_water": 0.7}},
        routes=[
            {"match": {"path": "/v1/chat/completions", "model": "gpt-4"}, "upstream": "default"},
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fit"},
        ],
    )
    proxy = start_proxy(config=config)
    if not cached:
        proxy.runtime.messages = MessageCache(max_sessions=0)
        proxy.runtime.store._chains = ChainCache(max_sessions=0)
    first = len(upstream.received)
    answers = []
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        for model, messages in script():
            response = client.post(
                "/v1/chat/completions",
                content=orjson.dumps({"model": model, "messages": messages}),
                headers={"Authorization": "Bearer sk-test", "X-Session-Id": "same"},
            )
            proxy.drain()  # each request sees the previous one stored
            headers = {
                k: v
                for k, v in response.headers.items()
                if k.startswith("x-context-") or k == "x-session-id"
            }
            body = response.json()  # the fake's id and timestamp differ from run to run
            answers.append((response.status_code, headers, body["choices"], body["usage"]))
    with sqlite3.connect(directory / "ctxproxy.db") as conn:
        stored = {
            "items": conn.execute(
                "SELECT id, parent_id, path_hash, content_hash, role, token_count, status,"
                " message_json FROM items ORDER BY id"
            ).fetchall(),
            "sessions": conn.execute("SELECT id, key, head_item_id FROM sessions").fetchall(),
            "requests": conn.execute(
                "SELECT model, messages_before, messages_after, tokens_before, tokens_after,"
                " dropped_indexes, dropped_item_ids, reason, first_item_id, last_item_id,"
                " reply_item_id FROM requests ORDER BY rowid"
            ).fetchall(),
        }
    return {
        "forwarded": [r.raw for r in upstream.received[first:]],
        "answers": answers,
        "stored": stored,
    }


def test_caches_change_nothing_forwarded_answered_or_stored(fake, start_proxy, tmp_path):
    with_caches = run(fake, start_proxy, tmp_path / "cached", cached=True)
    without = run(fake, start_proxy, tmp_path / "uncached", cached=False)

    assert with_caches["forwarded"] == without["forwarded"]
    assert with_caches["answers"] == without["answers"]
    assert with_caches["stored"] == without["stored"]
    # The script did exercise what it is about.
    reasons = [row[7] for row in with_caches["stored"]["requests"]]
    assert "max_tokens" in reasons
    tokens = [a[1]["x-context-tokens-before"] for a in with_caches["answers"]]
    assert len(set(tokens)) > 3

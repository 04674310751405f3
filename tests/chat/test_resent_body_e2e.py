"""A long resent history parsed from where its last body's messages ended changes nothing.

One scripted session of bodies over 64 KiB (proxy/http/resent_body.py) goes
through a proxy that keeps each body's prefix and through one whose message
cache remembers nothing: what is forwarded, answered and stored is the same,
hostile continuations of a kept prefix included.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.context.message_cache import MessageCache
from proxy.http.resent_body import MIN_BYTES
from tests.harness import make_config

LONG = "words " * 120


def turns(start: int, n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} {LONG}"}
        for i in range(start, start + n)
    ]


def dumps(fields: dict[str, Any]) -> bytes:
    return orjson.dumps(fields)


def script() -> list[bytes]:
    """Request bodies, as a client would send them (some of them hostile)."""
    base = turns(0, 99)
    grown = [*base, *turns(99, 2)]
    more = [*grown, *turns(101, 2)]
    bodies = [
        dumps({"model": "gpt-4o", "messages": base}),
        dumps({"model": "gpt-4o", "messages": grown}),  # the prefix is found here
        dumps({"model": "gpt-4o", "messages": more, "temperature": 0}),  # continued
        dumps({"model": "gpt-4o", "messages": more, "temperature": 0}),  # resent as it was
    ]
    # Continuations of the last body's prefix that must not parse as its messages:
    last = bodies[-1]
    prefix = last[: last.rindex(b"]")]
    bodies += [
        prefix + b',{"role":"user","content":"x"}',  # cut short: invalid JSON
        prefix + b',{"role":"user","content":"deep","x":' + b"[" * 200 + b"]" * 200 + b"}]}",
        prefix + b',{"role":"user","content":"fine"}],"model":"gpt-4o","stream":false}',
    ]
    last = bodies[-1]
    prefix = last[: last.rindex(b"]", 0, last.rindex(b'"model"'))]
    bodies.append(prefix + b'],"messages":[{"role":"user","content":"only me"}]}')  # last wins
    edited = [*more[:50], {"role": "user", "content": "an edit"}, *more[51:]]
    bodies += [
        dumps({"model": "gpt-4o", "messages": edited}),
        dumps({"model": "gpt-4o", "messages": [*edited, *turns(103, 2)]}),
    ]
    assert all(len(b) >= MIN_BYTES for b in bodies)
    return bodies


CONFIGURED = {"X-Session-Id": "long"}


def run(
    fake: Any,
    start_proxy: Any,
    directory: Path,
    *,
    cached: bool,
    session: dict[str, str] = CONFIGURED,
    bodies: list[bytes] | None = None,
) -> dict[str, Any]:
    upstream, server = fake
    config = make_config(
        server.url,
        directory,
        policies={"fit": {"strategy": "trim", "max_tokens": 4000, "low_water": 0.7}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fit"}
        ],
    )
    proxy = start_proxy(config=config)
    cache = proxy.runtime.messages
    if not cached:
        cache = proxy.runtime.messages = MessageCache(max_sessions=0)
    continued = []
    plain = cache.resent_body

    def counted(ref: Any, raw: bytes) -> Any:
        body = plain(ref, raw)
        continued.append(body is not None)
        return body

    cache.resent_body = counted  # type: ignore[method-assign]
    first = len(upstream.received)
    answers = []
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        for raw in script() if bodies is None else bodies:
            response = client.post(
                "/v1/chat/completions",
                content=raw,
                headers={"Authorization": "Bearer sk-test", **session},
            )
            proxy.drain()
            body = response.json()
            answers.append(
                (response.status_code, body.get("error") or (body["choices"], body["usage"]))
            )
    with sqlite3.connect(directory / "ctxproxy.db") as conn:
        stored = conn.execute(
            "SELECT id, parent_id, path_hash, content_hash, role, token_count, message_json"
            " FROM items ORDER BY id"
        ).fetchall()
        sessions = conn.execute("SELECT key FROM sessions").fetchall()
    return {
        "sessions": sessions,
        "forwarded": [r.raw for r in upstream.received[first:]],
        "answers": answers,
        "stored": stored,
        "continued": continued,
    }


def test_a_continued_body_forwards_answers_and_stores_what_a_full_parse_does(
    fake, start_proxy, tmp_path
):
    kept = run(fake, start_proxy, tmp_path / "kept", cached=True)
    parsed = run(fake, start_proxy, tmp_path / "parsed", cached=False)

    assert kept["forwarded"] == parsed["forwarded"]
    assert kept["answers"] == parsed["answers"]
    assert kept["stored"] == parsed["stored"]
    # The script did exercise what it is about: bodies continued from a kept prefix
    # (the third, the resend, a well-formed one after two hostile ones, and a repeated
    # "messages" field, refused there and parsed whole), and the errors.
    assert kept["continued"][2:4] == [True, True]
    assert kept["continued"][6:8] == [True, False]
    assert not any(parsed["continued"])
    statuses = [status for status, _ in kept["answers"]]
    assert statuses[4:8] == [400, 400, 200, 200]
    assert kept["forwarded"][-3].count(b"only me") == 1  # the history was that field's


@pytest.mark.parametrize(
    "session",
    [
        {"session-id": "long"},  # Codex CLI
        {"X-Claude-Code-Session-Id": "long", "X-Claude-Code-Agent-Id": "a1"},  # a sub-agent
    ],
    ids=["codex", "claude-code-agent"],
)
def test_a_session_an_agent_header_names_gets_the_resent_body_path_and_the_same_result(
    fake, start_proxy, tmp_path, session
):
    kept = run(fake, start_proxy, tmp_path / "kept", cached=True, session=session)
    parsed = run(fake, start_proxy, tmp_path / "parsed", cached=False, session=session)
    assert kept["forwarded"] == parsed["forwarded"]
    assert kept["answers"] == parsed["answers"]
    assert kept["stored"] == parsed["stored"]
    assert kept["sessions"] == parsed["sessions"] and len(kept["sessions"]) == 1
    assert kept["continued"][2:4] == [True, True]
    assert kept["continued"][6:8] == [True, False]


def test_a_session_named_by_prompt_cache_key_gets_the_resent_body_path_and_the_same_result(
    fake, start_proxy, tmp_path
):
    base = turns(0, 99)
    grown = [*base, *turns(99, 2)]
    more = [*grown, *turns(101, 2)]
    bodies = [
        dumps({"model": "gpt-4o", "messages": history, "prompt_cache_key": "pck-long"})
        for history in (base, grown, more, more)
    ]
    # Another conversation's key, on a body continuing the same bytes: its own session.
    other = dumps({"model": "gpt-4o", "messages": more, "prompt_cache_key": "pck-other"})
    bodies.append(other)
    kept = run(fake, start_proxy, tmp_path / "kept", cached=True, session={}, bodies=bodies)
    parsed = run(fake, start_proxy, tmp_path / "parsed", cached=False, session={}, bodies=bodies)
    assert kept["forwarded"] == parsed["forwarded"]
    assert kept["answers"] == parsed["answers"]
    assert kept["stored"] == parsed["stored"]
    assert sorted(kept["sessions"]) == [("pck-long",), ("pck-other",)]
    assert kept["continued"] == [False, False, True, True, False]

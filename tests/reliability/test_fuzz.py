"""Generated hostile bodies on every endpoint that reads one (chat, Responses, and
``/v1/responses/compact``): no 5xx of the proxy's own, OpenAI's shape on every 4xx, and
what was stored before is byte-identical afterwards (a compaction stores summaries and
items of its own: those are added, nothing stored before changes)."""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import brotli
import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import ProxyServer, query
from tests.reliability import bodies
from tests.reliability.conftest import Both
from tests.reliability.fuzz import BODIES_PER_ENDPOINT, Tally
from tests.reliability.report import figure

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

APPS = st.sampled_from([None, "trim", "server"])
# Content-Encoding: mostly none; each coding the proxy decodes, a stack, one it does not
# know, and bodies that lie about theirs (sent plain, or cut short).
CODINGS = st.sampled_from(
    [None, None, None, "gzip", "zstd", "br", "deflate", "gzip, br", "lzw", "zstd:plain", "br:cut"]
)
_PACK: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "zstd": zstd.compress,
    "br": brotli.compress,
    "deflate": zlib.compress,
}


def _encoded(raw: bytes, coding: str) -> tuple[bytes, str]:
    """``raw`` as a client would send it with ``coding`` (``name:plain``, ``name:cut``: a
    body that is not what its header says)."""
    name, _, lie = coding.partition(":")
    if lie == "plain" or (name not in _PACK and "," not in name):
        return raw, name
    for part in name.split(", "):
        raw = _PACK[part](raw)
    return (raw[: len(raw) // 2] if lie == "cut" else raw), name


SESSIONS = st.sampled_from([None, "seeded-chat", "seeded-server", "seeded-compact", "fuzz-1", "ユ"])
# A compaction of the seeded session: compacted before the fuzz, and again after it.
SEEDED_COMPACTION = {
    "model": "gpt-4o",
    "input": [
        {"role": "user", "content": "Find the port."},
        {"type": "function_call", "call_id": "c1", "name": "grep", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "PORT = 8731"},
        {"role": "assistant", "content": "It is 8731."},
    ],
}
TABLES = ("sessions", "items", "responses", "summaries")


def _seed(client: httpx.Client, proxy: ProxyServer) -> None:
    """Sessions stored before the fuzz, through each kind of route."""
    for app, session in (("server", "seeded-server"), ("trim", "seeded-chat")):
        for n in range(3):
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": f"seed {n}"}]}
            r = client.post(
                f"{proxy.url}/v1/chat/completions",
                content=orjson.dumps(body),
                headers={"x-app": app, "x-session-id": session},
            )
            assert r.status_code == 200, r.text
    r = client.post(
        f"{proxy.url}/v1/responses",
        content=orjson.dumps({"model": "gpt-4o", "input": "seed"}),
        headers={"x-session-id": "seeded-responses"},
    )
    assert r.status_code == 200, r.text
    r = _compact_seeded(client, proxy)
    assert r.headers["x-context-compaction"] == "created", r.text
    proxy.drain()


def _compact_seeded(client: httpx.Client, proxy: ProxyServer) -> httpx.Response:
    r = client.post(
        f"{proxy.url}/v1/responses/compact",
        content=orjson.dumps(SEEDED_COMPACTION),
        headers={"x-session-id": "seeded-compact"},
    )
    assert r.status_code == 200, r.text
    return r


def _snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {
        table: [tuple(row) for row in query(db, f"SELECT * FROM {table} ORDER BY rowid")]
        for table in TABLES
    }


def _unchanged(
    before: dict[str, list[tuple[Any, ...]]], after: dict[str, list[tuple[Any, ...]]]
) -> None:
    # Items, responses and summaries are append-only: every row stored before is still there,
    # byte for byte. A session row's head and version move when a fuzzed body is a valid
    # request.
    for table in TABLES[1:]:
        assert after[table][: len(before[table])] == before[table], table
    keys_before = {row[:3] for row in before["sessions"]}
    assert keys_before <= {row[:3] for row in after["sessions"]}


def _fuzz(proxy: ProxyServer, both: Both, strategy: Any, path: str, tally: Tally) -> None:
    client = httpx.Client(
        timeout=30, headers={"content-type": "application/json", "authorization": "Bearer sk-fuzz"}
    )
    # A compaction calls its summarizer on the chat endpoint; the others their own.
    upstream = both.responses.received if path.startswith("/v1/responses") else both.chat.received
    summarizer = both.chat.received if path.endswith("/compact") else []

    @settings(
        max_examples=BODIES_PER_ENDPOINT,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=strategy, app=APPS, session=SESSIONS, coding=CODINGS)
    def one(body: Any, app: str | None, session: str | None, coding: str | None) -> None:
        raw = body if isinstance(body, bytes) else bodies.encode(body)
        headers: dict[str, Any] = {}
        if coding:
            raw, headers["content-encoding"] = _encoded(raw, coding)
        if app:
            headers["x-app"] = app
        if session:
            headers["x-session-id"] = session.encode()  # type: ignore[assignment]
        calls = len(upstream) + len(summarizer)
        response = client.post(proxy.url + path, content=raw, headers=headers)
        after = len(upstream) + len(summarizer)
        tally.check(response, calls, after, f"{path} {headers} {raw[:300]!r}")

    try:
        one()
    finally:
        client.close()


def test_fuzzed_bodies_on_every_endpoint_get_no_500_and_leave_the_store_intact(
    reliable_proxy, both, tmp_path
):
    proxy = reliable_proxy()
    db = tmp_path / "ctxproxy.db"
    with httpx.Client(timeout=10, headers={"authorization": "Bearer sk-fuzz"}) as client:
        _seed(client, proxy)
    before = _snapshot(db)
    tally = Tally()
    _fuzz(proxy, both, bodies.chat_bodies | bodies.raw_garbage, "/v1/chat/completions", tally)
    _fuzz(proxy, both, bodies.responses_bodies | bodies.raw_garbage, "/v1/responses", tally)
    compact = bodies.responses_bodies | bodies.raw_garbage
    _fuzz(proxy, both, compact, "/v1/responses/compact", tally)
    proxy.drain()
    print(
        f"fuzz: {tally.bodies} bodies, statuses {sorted(tally.by_status.items())}, "
        f"relayed upstream 5xx {tally.relayed_5xx}"
    )
    own_5xx = sum(1 for f in tally.failures if f.startswith("5"))
    figure("bodies fuzzed (chat, responses, compact)", tally.bodies)
    figure("proxy 5xx on fuzzed bodies", own_5xx)
    figure("4xx not in OpenAI's shape", len(tally.failures) - own_5xx)
    assert tally.failures == [], "\n".join(tally.failures[:20])
    assert tally.bodies >= 3 * BODIES_PER_ENDPOINT
    after = _snapshot(db)
    _unchanged(before, after)
    with httpx.Client(timeout=10, headers={"authorization": "Bearer sk-fuzz"}) as client:
        # The seeded compaction, asked again of the same conversation: its stored summary,
        # read back whole, answers (no summarizer call, nothing new made).
        again = _compact_seeded(client, proxy)
    assert again.headers["x-context-compaction"] == "reused", again.text
    # The proxy still answers, and the seeded server-held session still replays.
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "after"}]},
        headers={
            "x-app": "server",
            "x-session-id": "seeded-server",
            "authorization": "Bearer sk-fuzz",
        },
        timeout=10,
    )
    assert r.status_code in (200, 400), r.text

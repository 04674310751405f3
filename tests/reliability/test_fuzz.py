"""Generated hostile requests on every endpoint (tests/reliability/endpoints.py): no 5xx
of the proxy's own, OpenAI's shape on every 4xx, and what was stored before is
byte-identical afterwards."""

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
from tests.reliability.endpoints import ENDPOINTS, Endpoint
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
    # Items and responses are append-only: every row stored before is still there, byte for
    # byte. A session row's head and version move when a fuzzed body is a valid request.
    # Summaries too: a fuzzed compaction adds its own, never changes one stored before.
    for table in TABLES[1:]:
        assert after[table][: len(before[table])] == before[table], table
    keys_before = {row[:3] for row in before["sessions"]}
    assert keys_before <= {row[:3] for row in after["sessions"]}


def _fuzz(proxy: ProxyServer, both: Both, endpoint: Endpoint, tally: Tally) -> None:
    client = httpx.Client(
        timeout=30, headers={"content-type": "application/json", "authorization": "Bearer sk-fuzz"}
    )
    no_body = st.none()

    @settings(
        max_examples=max(1, int(BODIES_PER_ENDPOINT * endpoint.share)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        body=no_body if endpoint.bodies is None else endpoint.bodies,
        id_=no_body if endpoint.ids is None else endpoint.ids,
        app=APPS,
        session=SESSIONS,
        coding=CODINGS,
    )
    def one(
        body: Any, id_: str | None, app: str | None, session: str | None, coding: str | None
    ) -> None:
        raw = None if body is None else body if isinstance(body, bytes) else bodies.encode(body)
        headers: dict[str, Any] = {}
        if coding and raw is not None:
            raw, headers["content-encoding"] = _encoded(raw, coding)
        if app:
            headers["x-app"] = app
        if session:
            headers["x-session-id"] = session.encode()  # type: ignore[assignment]
        calls = both.calls()
        url = endpoint.url(proxy.url, id_)
        response = client.request(endpoint.method, url, content=raw, headers=headers)
        what = f"{endpoint.method} {url} {headers} {(raw or b'')[:300]!r}"
        tally.check(response, calls, both.calls(), what, endpoint.door)

    try:
        one()
    finally:
        client.close()


def test_fuzzed_requests_on_every_endpoint_get_no_500_and_leave_the_store_intact(
    reliable_proxy, both, tmp_path
):
    proxy = reliable_proxy()
    db = tmp_path / "ctxproxy.db"
    with httpx.Client(timeout=10, headers={"authorization": "Bearer sk-fuzz"}) as client:
        _seed(client, proxy)
    before = _snapshot(db)
    tallies = {endpoint.name: Tally() for endpoint in ENDPOINTS}
    for endpoint in ENDPOINTS:
        _fuzz(proxy, both, endpoint, tallies[endpoint.name])
    proxy.drain()
    failures = []
    for endpoint in ENDPOINTS:
        tally = tallies[endpoint.name]
        own_5xx = sum(1 for f in tally.failures if f.startswith("5"))
        print(
            f"fuzz {endpoint.name}: {tally.bodies} requests, statuses "
            f"{sorted(tally.by_status.items())}, relayed upstream 5xx {tally.relayed_5xx}"
        )
        figure(f"requests fuzzed: {endpoint.method} {endpoint.path}", tally.bodies)
        figure(f"proxy 5xx: {endpoint.method} {endpoint.path}", own_5xx)
        figure(
            f"4xx not in OpenAI's shape: {endpoint.method} {endpoint.path}",
            len(tally.failures) - own_5xx,
        )
        failures += tally.failures
        assert tally.bodies >= int(BODIES_PER_ENDPOINT * endpoint.share), endpoint.name
    figure("requests fuzzed (every endpoint)", sum(t.bodies for t in tallies.values()))
    assert failures == [], "\n".join(failures[:20])
    _unchanged(before, _snapshot(db))
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

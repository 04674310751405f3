"""Each upstream fault, plain and streamed: what the client got, what was stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query
from tests.reliability.faults import HUGE_CHARS, FaultUpstream
from tests.reliability.report import figure

# What each fault must come to. client: the status the client sees (a stream's
# status is 200 once headers went out); error: the code in the request row;
# stored: "answered" (user + reply, complete), "incomplete" (user + reply marked),
# "nothing" (the request row only).
EXPECTED: dict[tuple[str, bool], tuple[int, str | None, str]] = {
    ("ok", False): (200, None, "answered"),
    ("ok", True): (200, None, "answered"),
    ("status_500", False): (500, None, "nothing"),
    ("status_500", True): (500, None, "nothing"),
    ("status_429", False): (429, None, "nothing"),
    ("status_429", True): (429, None, "nothing"),
    ("hang", False): (504, "upstream_timeout", "nothing"),
    ("hang", True): (504, "upstream_timeout", "nothing"),
    ("stall_after_headers", False): (504, "upstream_timeout", "nothing"),
    ("stall_after_headers", True): (200, "upstream_timeout", "incomplete"),
    ("cut_mid_stream", False): (502, "upstream_unavailable", "nothing"),
    ("cut_mid_stream", True): (200, "upstream_unavailable", "incomplete"),
    ("invalid_json", False): (200, "upstream_invalid_response", "nothing"),
    ("invalid_json", True): (200, "upstream_malformed_stream", "nothing"),
    ("malformed_sse", False): (502, "upstream_unavailable", "nothing"),
    ("malformed_sse", True): (200, "upstream_malformed_stream", "nothing"),
    ("no_done", False): (502, "upstream_unavailable", "nothing"),
    ("no_done", True): (200, "upstream_stream_incomplete", "incomplete"),
    ("error_event", False): (200, "upstream_invalid_response", "nothing"),
    ("error_event", True): (200, "upstream_stream_error", "nothing"),
    ("null_content", False): (200, None, "answered"),
    ("null_content", True): (200, None, "answered"),
    ("huge", False): (200, None, "answered"),
    ("huge", True): (200, None, "answered"),
}
UPSTREAM_TIMEOUT_S = 1.0


@pytest.fixture
def faulty(loop_thread: LoopThread, tmp_path: Path) -> Iterator[tuple[FaultUpstream, ProxyServer]]:
    yield from _faulty(loop_thread, tmp_path, "server")


@pytest.fixture
def faulty_client_held(
    loop_thread: LoopThread, tmp_path: Path
) -> Iterator[tuple[FaultUpstream, ProxyServer]]:
    yield from _faulty(loop_thread, tmp_path, "client")


def _faulty(
    loop_thread: LoopThread, tmp_path: Path, history: str
) -> Iterator[tuple[FaultUpstream, ProxyServer]]:
    upstream = FaultUpstream()
    server = AiohttpServer(loop_thread, upstream.app())
    config = make_config(
        server.url,
        tmp_path,
        policies={"last2": {"strategy": "trim", "max_turns": 2}},
        routes=[
            {
                "match": {"path": "/v1/chat/completions"},
                "upstream": "default",
                "policy": "last2",
                "history": history,
            }
        ],
        extra={
            "upstreams": {
                "default": {"base_url": f"{server.url}/v1", "timeout_s": UPSTREAM_TIMEOUT_S}
            }
        },
    )
    proxy = ProxyServer(loop_thread, config)
    yield upstream, proxy
    loop_thread.run(upstream.unblock())
    proxy.stop()
    server.stop()


def ask(proxy: ProxyServer, session: str, text: str, stream: bool) -> httpx.Response:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
    if stream:
        body["stream"] = True
    return httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=orjson.dumps(body),
        headers={
            "x-session-id": session,
            "content-type": "application/json",
            "authorization": "Bearer sk-a",
        },
        timeout=30,
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("fault", sorted({f for f, _ in EXPECTED}))
def test_upstream_fault_reaches_the_client_as_expected_and_stores_what_it_should(
    faulty, tmp_path, fault, stream
):
    upstream, proxy = faulty
    status, error_code, stored = EXPECTED[(fault, stream)]
    upstream.fault = fault
    session = f"{fault}-{stream}"
    response = ask(proxy, session, "question", stream)
    assert response.status_code == status, response.text[:300]
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if error_code:
            assert error["code"] == error_code
    if stream and status == 200 and error_code:
        # The stream did not end whole: the client is told in-stream, never left
        # guessing, and never gets the end marker after it (its SDK would stop there).
        events = response.content.rstrip().split(b"\n\n")
        last = orjson.loads(events[-1][len(b"data: ") :])
        assert set(last["error"]) == {"message", "type", "param", "code"}
        # The upstream's own error event reaches the client as sent, and no second one.
        assert last["error"]["code"] == ("overloaded" if fault == "error_event" else error_code)
        assert b"data: [DONE]" not in events
        metrics = httpx.get(f"{proxy.url}/metrics").text
        assert f'code="{error_code}"' in metrics
    if fault == "huge":
        assert len(response.content) > HUGE_CHARS
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    rows = query(db, "SELECT status, error, incomplete FROM requests")
    assert len(rows) == 1
    assert rows[0]["status"] == status
    if error_code:
        assert rows[0]["error"] and rows[0]["error"].startswith(error_code), rows[0]["error"]
    elif status >= 500:
        # The upstream's 5xx, relayed as it came: the row names its error all the same.
        assert rows[0]["error"] == "server_error: The upstream answered 500: upstream says no"
    else:
        assert rows[0]["error"] is None
    items = query(db, "SELECT role, status FROM items ORDER BY id")
    if stored == "nothing":
        assert items == []
    elif stored == "answered":
        assert [(i["role"], i["status"]) for i in items] == [
            ("user", "complete"),
            ("assistant", "complete"),
        ]
    else:
        assert [(i["role"], i["status"]) for i in items] == [
            ("user", "complete"),
            ("assistant", "incomplete"),
        ]

    # The next request on the session replays only whole answers.
    upstream.fault = "ok"
    assert ask(proxy, session, "next", False).status_code == 200
    forwarded = upstream.received[-1]["messages"]
    replayed = [m for m in forwarded[:-1] if m["role"] == "assistant"]
    if stored == "answered" and fault != "null_content":
        assert len(replayed) == 1
    else:
        assert replayed == []
    assert forwarded[-1] == {"role": "user", "content": "next"}
    figure("upstream fault survived", f"{fault} ({'streamed' if stream else 'plain'})")


@pytest.mark.parametrize("fault", ["no_done", "malformed_sse"])
def test_a_client_held_stream_that_does_not_end_whole_raises_in_the_openai_sdk(
    faulty_client_held, tmp_path, fault
):
    upstream, proxy = faulty_client_held
    upstream.fault = fault
    client = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-a",
        max_retries=0,
        default_headers={"X-Session-Id": f"held-{fault}"},
    )
    chunks = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "question"}], stream=True
        ):
            chunks.append(chunk)
    assert chunks  # what came before the end was relayed
    code = "upstream_stream_incomplete" if fault == "no_done" else "upstream_malformed_stream"
    assert raised.value.code == code
    proxy.drain()
    row = query(tmp_path / "ctxproxy.db", "SELECT error, incomplete FROM requests")[0]
    assert row["error"].startswith(code) and row["incomplete"] == 1
    items = query(tmp_path / "ctxproxy.db", "SELECT role, status FROM items ORDER BY id")
    # Cut short: kept, marked, never replayed whole; malformed: left out, as the client failed.
    expected = [("user", "complete"), ("assistant", "incomplete")] if fault == "no_done" else []
    assert [(i["role"], i["status"]) for i in items] == expected

"""A Messages stream the upstream ends without ``message_stop`` is told, stored and counted.

An SDK reading a stream that simply stops takes what it read as the whole answer;
the proxy, reading the stream on the side, knows it never ended, so the client gets
an in-stream Anthropic ``error`` event after what the upstream sent (the ``anthropic``
SDK raises it), the stored exchange is marked incomplete, and
``ctxproxy_unfinished_streams_total`` counts it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropic, Reply
from tests.harness import ProxyServer, query
from tests.messages.sdk import sdk_client

MODEL = "claude-fake-1"
BODY = {
    "model": MODEL,
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "Tell me a long story."}],
}
CUT_SHORT = (
    "The upstream's stream ended without its end event (message_stop): the answer may be cut short."
)


def sse(raw: bytes) -> list[tuple[str, dict[str, object]]]:
    """(event name, data) of each event in a stream's bytes."""
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            name, data = block.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_stream_ended_without_message_stop_is_an_error_event_stored_incomplete(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    claude.script(Reply(text="Once upon a time", cut_short=True))

    # The SDK raises the error event instead of returning the half answer as whole.
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        sdk_client(proxy, session="cut").messages.stream(
            model=MODEL,
            max_tokens=64,
            messages=BODY["messages"],  # type: ignore[arg-type]
        ) as stream,
    ):
        stream.get_final_message()

    # The bytes: everything the upstream sent, as it sent it, then one error event.
    claude.script(Reply(text="Once upon a time", cut_short=True))
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/messages",
        json=BODY,
        headers={"x-api-key": "k", "X-Session-Id": "cut-raw"},
    ) as response:
        raw = response.read()
    assert raw.startswith(bytes(claude.last_stream))
    events = sse(raw)
    assert "message_stop" not in [name for name, _ in events]
    name, error = events[-1]
    assert name == "error" and error["type"] == "error"
    assert error["error"] == {"type": "api_error", "message": CUT_SHORT}
    assert str(caught.value).startswith(CUT_SHORT)

    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert (
        'ctxproxy_unfinished_streams_total{route="routes[0]",code="upstream_stream_incomplete"} 2'
        in metrics
    )
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    rows = query(db, "SELECT session_key, incomplete, error FROM requests ORDER BY created_at")
    assert [r["incomplete"] for r in rows] == [1, 1]
    assert all(r["error"].startswith("upstream_stream_incomplete") for r in rows)
    # The answer's text so far is kept, marked incomplete; the question as it came.
    items = query(
        db,
        "SELECT role, incomplete, message_json FROM items WHERE session_id = "
        "(SELECT id FROM sessions WHERE key = 'cut') ORDER BY id",
    )
    assert [(i["role"], i["incomplete"]) for i in items] == [("user", 0), ("assistant", 1)]
    assert "Once upon a time" in items[1]["message_json"]

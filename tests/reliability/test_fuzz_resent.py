"""Generated continuations of a kept body prefix (proxy/http/resent_body.py): no 5xx of the
proxy's own, OpenAI's shape on every 4xx, and the same answer a proxy without the message
cache gives the same bytes."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.context.message_cache import MessageCache
from proxy.http.resent_body import MIN_BYTES
from tests.harness import ProxyServer
from tests.reliability import bodies
from tests.reliability.fuzz import BODIES_PER_ENDPOINT, Tally
from tests.reliability.report import figure

LONG = "words " * 120
BASE = [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} {LONG}"}
    for i in range(99)
]
BODY = orjson.dumps({"model": "gpt-4o", "messages": BASE})
# The bytes a continuation starts from: the body up to its last message.
PREFIX = BODY[: BODY.rindex(b"]")]
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-fuzz"}

# What follows the last message: more messages, then the fields after them, or anything.
_fields = st.dictionaries(
    st.sampled_from(["model", "stream", "messages", "temperature", "x"]),
    bodies.json_values,
    max_size=3,
)
_structured = st.builds(
    lambda new, fields, close: (
        b"".join(b"," + bodies.encode(m) for m in new)
        + b"]"
        + b"".join(b"," + bodies.encode(k) + b":" + bodies.encode(v) for k, v in fields.items())
        + close
    ),
    st.lists(bodies.messages, max_size=2),
    _fields,
    st.sampled_from([b"}", b"", b"}}", b"]}", b"} "]),
)
TAILS = _structured | bodies.raw_garbage


def _keep_prefix(client: httpx.Client, proxy: ProxyServer, session: str) -> None:
    """Send the base body twice: the second finds its prefix, kept for the next."""
    for _ in range(2):
        r = client.post(
            f"{proxy.url}/v1/chat/completions",
            content=BODY,
            headers={"x-app": "trim", "x-session-id": session},
        )
        assert r.status_code == 200, r.text


def test_fuzzed_continuations_of_a_kept_prefix_answer_as_a_full_parse_does(
    reliable_proxy, both, tmp_path
):
    assert len(BODY) >= MIN_BYTES
    kept = reliable_proxy()
    plain = reliable_proxy(store={"path": str(tmp_path / "plain.db")})
    plain.runtime.messages = MessageCache(max_sessions=0)
    tally = Tally()
    continued = []
    resent_body = kept.runtime.messages.resent_body

    def counted(ref: Any, raw: bytes) -> Any:
        body = resent_body(ref, raw)
        continued.append(body is not None)
        return body

    kept.runtime.messages.resent_body = counted  # type: ignore[method-assign]
    client = httpx.Client(timeout=30, headers=HEADERS)
    sessions = iter(range(10**6))
    # Per fuzzed body: whether the kept proxy read it from the prefix.
    fuzzed: list[bool] = []

    @settings(
        max_examples=max(150, BODIES_PER_ENDPOINT // 10),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(tail=TAILS)
    def one(tail: bytes) -> None:
        # A new session each time, with the same history on both proxies (trim's
        # hysteresis reads the session's last decision).
        session = f"resent-{next(sessions)}"
        _keep_prefix(client, kept, session)
        _keep_prefix(client, plain, session)
        raw = PREFIX + tail
        answers = []
        for proxy in (kept, plain):
            calls = len(both.chat.received)
            r = client.post(
                f"{proxy.url}/v1/chat/completions",
                content=raw,
                headers={"x-app": "trim", "x-session-id": session},
            )
            tally.check(r, calls, len(both.chat.received), f"{raw[-300:]!r}")
            if proxy is kept:
                fuzzed.append(continued[-1])
            body = (
                r.json()
                if r.headers.get("content-type", "").startswith("application/json")
                else None
            )
            # The fake's ids and timestamps differ: the status and the error.
            answers.append((r.status_code, body.get("error") if isinstance(body, dict) else None))
        assert answers[0][0] == answers[1][0], (raw[-300:], answers)
        if answers[0][0] != 200:
            assert answers[0][1] == answers[1][1], (raw[-300:], answers)
        else:
            # What reached the upstream from each is the same messages (its chat requests:
            # calibration may ask the fake's /v1/models on the side, once names differ).
            chats = [r for r in both.chat.received if r.path == "/v1/chat/completions"]
            a, b = chats[-2:]
            assert orjson.loads(a.raw)["messages"] == orjson.loads(b.raw)["messages"]

    try:
        one()
    finally:
        client.close()
    figure("continuations of a kept body prefix fuzzed", len(fuzzed))
    assert tally.failures == [], "\n".join(tally.failures[:20])
    # Fuzzed bodies were read from the kept prefix, and others parsed whole (refused).
    assert any(fuzzed) and not all(fuzzed)

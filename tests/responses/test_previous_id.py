"""previous_response_id put back: the one field rewritten in a continued chain's answer and events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.responses.previous_id import PutBackStream, put_back
from tests.fakes.responses import FakeResponses
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config

FIELD = b'"previous_response_id":'


def test_only_the_null_field_is_replaced():
    body = b'{"id": "resp_2", "previous_response_id" : null, "text": "say \\"previous_response_id\\": null"}'
    assert put_back(body, "resp_1") == (
        b'{"id": "resp_2", "previous_response_id" : "resp_1", "text": "say \\"previous_response_id\\": null"}'
    )
    already = b'{"previous_response_id":"resp_0"}'
    assert put_back(already, "resp_1") == already  # an upstream that says which: left alone


EVENTS = b"".join(
    b"event: "
    + kind
    + b"\ndata: "
    + orjson.dumps(
        {"type": kind.decode(), "response": {"id": "r2", "previous_response_id": None, "n": i}}
    )
    + b"\n\n"
    for i, kind in enumerate([b"response.created", b"response.in_progress", b"response.completed"])
)


@given(st.lists(st.integers(min_value=0, max_value=len(EVENTS)), max_size=12))
def test_a_stream_split_anywhere_is_rewritten_as_a_whole(cuts):
    points = sorted(set(cuts))
    pieces = [EVENTS[a:b] for a, b in zip([0, *points], [*points, len(EVENTS)], strict=True)]
    stream = PutBackStream("r1")
    out = b"".join(stream.feed(p) for p in pieces) + stream.flush()
    assert out == put_back(EVENTS, "r1")
    assert out.count(FIELD + b'"r1"') == 3


@pytest.fixture
def proxy(
    loop_thread: LoopThread, responses_upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path
) -> Iterator[ProxyServer]:
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default"}]
    server = ProxyServer(
        loop_thread, make_config(responses_upstream[1].url, tmp_path, routes=routes)
    )
    yield server
    server.stop()


def test_streamed_continuation_names_the_response_it_continued(proxy, responses_upstream):
    fake, _ = responses_upstream
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    first = client.responses.create(model="gpt-4o", input="one")
    assert first.previous_response_id is None
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/responses",
        json={"model": "gpt-4o", "input": "two", "previous_response_id": first.id, "stream": True},
        headers={"Authorization": "Bearer k"},
    ) as r:
        body = b"".join(r.iter_raw())
    assert "previous_response_id" not in fake.last  # the chain went upstream as input
    expected = fake.last_response.replace(FIELD + b"null", FIELD + f'"{first.id}"'.encode())
    assert body == expected  # every other byte is the upstream's
    assert body.count(FIELD + f'"{first.id}"'.encode()) >= 2  # created ... completed
    # The SDK's typed events carry it too, and so does the stored response.
    second_stream = client.responses.create(
        model="gpt-4o", input="three", previous_response_id=first.id, stream=True
    )
    events = list(second_stream)
    assert {e.response.previous_response_id for e in events if hasattr(e, "response")} == {first.id}
    completed = next(e for e in events if e.type == "response.completed")
    assert client.responses.retrieve(completed.response.id).previous_response_id == first.id


def test_an_unknown_previous_id_is_forwarded_and_its_answer_untouched(proxy, responses_upstream):
    fake, _ = responses_upstream
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    direct = httpx.post(
        f"{fake_url(responses_upstream)}/v1/responses", json={"model": "gpt-4o", "input": "hi"}
    ).json()
    raw = client.responses.with_raw_response.create(
        model="gpt-4o", input="more", previous_response_id=direct["id"]
    )
    assert fake.last["previous_response_id"] == direct["id"]
    assert raw.http_response.content == fake.last_response


def fake_url(upstream: tuple[FakeResponses, AiohttpServer]) -> str:
    return upstream[1].url

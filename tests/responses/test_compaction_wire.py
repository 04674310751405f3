"""The compaction item put first in an upstream's stream, and what a body asks for."""

from __future__ import annotations

import orjson
import pytest

from proxy.config.model import RouteConfig, RouteMatch, UpstreamConfig
from proxy.errors import InvalidRequest
from proxy.responses.compaction_wire import CompactionFirst, asked, compaction_mode, stream_events

ITEM = {"id": "cmp_1", "type": "compaction", "encrypted_content": "x"}


def upstream_stream() -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    response = {"id": "resp_1", "status": "completed", "output": [message], "usage": {}}
    opening = {**response, "status": "in_progress", "output": []}
    events = [
        {"type": "response.created", "sequence_number": 0, "response": opening},
        {"type": "response.in_progress", "sequence_number": 1, "response": opening},
        {
            "type": "response.output_item.added",
            "sequence_number": 2,
            "output_index": 0,
            "item": message,
        },
        {
            "type": "response.output_item.done",
            "sequence_number": 3,
            "output_index": 0,
            "item": message,
        },
        {"type": "response.completed", "sequence_number": 4, "response": response},
    ]
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def parsed(data: bytes) -> list[dict]:
    return [orjson.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("size", [1, 7, 64, 100000])
def test_the_item_leads_the_stream_in_sequence_however_the_bytes_arrive(size: int):
    raw = upstream_stream()
    rewrite = CompactionFirst(ITEM)
    out = b"".join(rewrite.feed(raw[i : i + size]) for i in range(0, len(raw), size))
    out += rewrite.flush()
    events = parsed(out)
    assert [e["sequence_number"] for e in events] == list(range(7))
    done = [(e["output_index"], e["item"]["type"]) for e in events if e["type"].endswith(".done")]
    assert done == [(0, "compaction"), (1, "message")]
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["compaction", "message"]
    assert out.count(b"event: ") == 7


def test_a_compaction_answer_streams_its_events_in_order():
    response = {"id": "r", "status": "completed", "output": [ITEM], "usage": {}}
    events = parsed(b"".join(stream_events(response)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]


@pytest.mark.parametrize(
    ("management", "param"),
    [
        ({}, "context_management"),
        ([{"type": "other"}], "context_management[0]"),
        (
            [{"type": "compaction", "compact_threshold": 0}],
            "context_management[0].compact_threshold",
        ),
        (
            [{"type": "compaction", "compact_threshold": True}],
            "context_management[0].compact_threshold",
        ),
    ],
)
def test_a_malformed_context_management_is_a_400_naming_it(management: object, param: str):
    with pytest.raises(InvalidRequest) as caught:
        asked({"context_management": management})
    assert caught.value.param == param


def test_what_a_body_asks():
    trigger = asked({"input": [{"type": "message"}, {"type": "compaction_trigger"}]})
    assert trigger.trigger and trigger.any and not trigger.managed
    early = asked({"input": [{"type": "compaction_trigger"}, {"type": "message"}]})
    assert not early.any
    managed = asked({"context_management": [{"type": "compaction", "compact_threshold": 9}]})
    assert managed.managed and managed.threshold == 9


@pytest.mark.parametrize(
    ("base_url", "setting", "mode"),
    [
        ("https://api.openai.com/v1", "auto", "upstream"),
        ("http://127.0.0.1:8000/v1", "auto", "proxy"),
        (None, "auto", "proxy"),  # a litellm upstream
        ("https://api.openai.com/v1", "proxy", "proxy"),
        ("http://127.0.0.1:8000/v1", "upstream", "upstream"),
        ("http://127.0.0.1:8000/v1", "off", "off"),
    ],
)
def test_auto_passes_compaction_to_openai_and_answers_it_for_any_other_upstream(
    base_url: str | None, setting: str, mode: str
):
    upstream = UpstreamConfig(name="u", base_url=base_url, litellm_model=None if base_url else "x")
    route = RouteConfig(name="r", match=RouteMatch(), upstream="u", policy="p", compaction=setting)  # type: ignore[arg-type]
    assert compaction_mode(route, upstream) == mode

"""A resent body parsed from where the last one's messages end is exactly what a full parse gives.

Hostile continuations included: anything that does not continue the last
body's messages falls back to the full parse (None here), never a different
reading of the bytes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.http.resent_body import MIN_BYTES, SENTINEL, BodyPrefix, continued, extended, found

LONG = "x" * 700


def body_bytes(fields: list[tuple[str, Any]], compact: bool = True) -> bytes:
    """A JSON object with ``fields`` in order (a repeated key repeated in the bytes)."""
    sep = (",", ":") if compact else (", ", ": ")
    parts = [json.dumps(k) + sep[1] + json.dumps(v, separators=sep) for k, v in fields]
    return ("{" + sep[0].join(parts) + "}").encode()


def history(n: int, extra: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {extra}{LONG}"}
        for i in range(n)
    ]


def first_prefix(raw: bytes) -> BodyPrefix:
    prefix = found(raw, orjson.loads(raw))
    assert prefix is not None
    return prefix


def test_a_continued_body_parses_as_a_full_parse_does_and_its_messages_are_the_held_objects() -> (
    None
):
    before = history(100)
    raw1 = body_bytes([("model", "m"), ("messages", before), ("stream", False)])
    assert len(raw1) >= MIN_BYTES
    prefix = first_prefix(raw1)
    held = orjson.loads(raw1)["messages"]
    raw2 = body_bytes(
        [("model", "m"), ("messages", [*before, *history(2, "new")]), ("stream", True)]
    )
    body = continued(prefix, held, raw2)
    assert body is not None
    assert body == orjson.loads(raw2)
    assert all(a is b for a, b in zip(body["messages"], held, strict=False))
    # The next prefix covers this body's messages, from the bytes after the last one only.
    nxt = extended(prefix, raw2, 2)
    assert nxt is not None
    assert orjson.loads(raw2[: nxt.end] + b"]}")["messages"] == body["messages"]
    raw3 = raw2[: nxt.end] + b',{"role":"user","content":"third"}],"model":"n"}'
    assert continued(nxt, body["messages"], raw3) == orjson.loads(raw3)


def test_a_body_that_is_not_the_last_one_continued_is_parsed_whole() -> None:
    before = history(100)
    raw1 = body_bytes([("messages", before), ("model", "m")])
    prefix = first_prefix(raw1)
    held = orjson.loads(raw1)["messages"]
    edited = body_bytes([("messages", [*before[:-1], {"role": "user", "content": "edit"}])])
    assert continued(prefix, held, edited) is None
    # Invalid JSON after the prefix: the full parse gives the client its error.
    assert continued(prefix, held, raw1[: prefix.end] + b",{]}") is None
    # A later "messages" field would win in a full parse: refused.
    later = raw1[: prefix.end] + b'],"messages":[{"role":"user","content":"hi"}]}'
    assert continued(prefix, held, later) is None
    # Only the prefix, nothing after it.
    assert continued(prefix, held, raw1[: prefix.end]) is None


def test_fields_after_the_messages_with_arrays_of_their_own_are_passed_over() -> None:
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"required": ["a"]}}}
        for i in range(5)
    ]
    raw = body_bytes([("messages", history(100)), ("tools", tools), ("stop", ["]", "}]"])])
    prefix = first_prefix(raw)
    assert raw[prefix.end : prefix.end + 1] == b"]"
    assert orjson.loads(raw[: prefix.end] + b"]}")["messages"] == history(100)
    assert list(prefix.before) == []


def test_a_short_body_is_not_kept() -> None:
    raw = body_bytes([("messages", history(3))])
    assert found(raw, orjson.loads(raw)) is None


def test_a_field_repeated_after_the_messages_wins_as_in_a_full_parse() -> None:
    before = history(100)
    raw1 = body_bytes([("model", "a"), ("messages", before)])
    prefix = first_prefix(raw1)
    assert prefix.before == {"model": "a"}
    raw2 = raw1[: prefix.end] + b'],"model":"b"}'
    parsed = continued(prefix, orjson.loads(raw1)["messages"], raw2)
    assert parsed is not None and parsed == orjson.loads(raw2) and parsed["model"] == "b"


_text = st.text(alphabet=st.sampled_from('ab]}[{",:\\ \n\u00e9'), max_size=12)
_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": _text})


@settings(max_examples=150, deadline=None)
@given(
    lead=st.lists(st.tuples(st.sampled_from(["model", "x", "tools"]), _value), max_size=3),
    trail=st.lists(
        st.tuples(st.sampled_from(["model", "stream", "tools", "x"]), _value), max_size=3
    ),
    new=st.lists(_message, max_size=3),
    rest=st.binary(max_size=24),
    compact=st.booleans(),
)
def test_whatever_follows_the_prefix_it_parses_as_orjson_does_or_not_at_all(
    lead: list[tuple[str, Any]],
    trail: list[tuple[str, Any]],
    new: list[dict[str, Any]],
    rest: bytes,
    compact: bool,
) -> None:
    before = history(100, extra=']}\\"')
    raw1 = body_bytes([*lead, ("messages", before), *trail], compact)
    prefix = found(raw1, orjson.loads(raw1))
    if prefix is None:  # a repeated field before the messages: kept nowhere, no harm
        return
    held = orjson.loads(raw1)["messages"]
    # A well-formed continuation: new messages and other fields.
    raw2 = body_bytes([*lead, ("messages", [*before, *new]), *trail], compact)
    parsed = continued(prefix, held, raw2)
    assert parsed is not None and parsed == orjson.loads(raw2)
    # The prefix carried on over the new messages, and continued once more.
    nxt = extended(prefix, raw2, len(new))
    assert nxt is not None
    raw3 = body_bytes([*lead, ("messages", [*before, *new, *new]), *trail], compact)
    again = continued(nxt, parsed["messages"], raw3)
    assert again is not None and again == orjson.loads(raw3)
    # Any bytes at all after the prefix: the same as a full parse, or refused.
    hostile = raw1[: prefix.end] + rest
    got = continued(prefix, held, hostile)
    if got is not None:
        assert got == orjson.loads(hostile)
    assert SENTINEL not in json.dumps(got or {})

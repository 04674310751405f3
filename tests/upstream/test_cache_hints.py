"""The prompt-cache hints: the spliced prompt_cache_key and where breakpoints go."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.cache_hints import (
    MAX_BREAKPOINTS,
    is_anthropic,
    session_cache_key,
    splice_field,
    with_breakpoints,
)


@pytest.mark.parametrize(
    "raw",
    [b'{"a":1}', b'{ "a" : [1, {"b": 2}] }\n', b"{}", b"{ }", b'{"s":"}"}  \r\n'],
)
def test_splice_keeps_every_byte_and_adds_one_field(raw):
    out = splice_field(raw, "prompt_cache_key", "k-1")
    parsed = orjson.loads(out)
    assert parsed == {**orjson.loads(raw), "prompt_cache_key": "k-1"}
    close = len(raw.rstrip()) - 1
    added = out[close : len(out) - (len(raw) - close)]
    assert out[:close] + out[close + len(added) :] == raw


def test_splice_refuses_what_is_not_an_object():
    with pytest.raises(ValueError):
        splice_field(b"[1]", "k", "v")


def test_session_key_is_opaque_stable_and_per_tenant():
    assert session_cache_key("t", "s") == session_cache_key("t", "s")
    assert session_cache_key("t", "s") != session_cache_key("u", "s")
    assert "secret-session" not in session_cache_key("t", "secret-session")
    assert len(session_cache_key("t", "x" * 5000)) <= 64


def test_anthropic_detection():
    assert is_anthropic("anthropic/claude-sonnet-4-5")
    assert is_anthropic("bedrock/anthropic.claude-3-5-sonnet")
    assert is_anthropic("vertex_ai/claude-3-5-sonnet@20240620")
    assert not is_anthropic("gemini/gemini-1.5-pro")
    assert not is_anthropic("openai/gpt-4o")
    assert not is_anthropic(None)


ROLES = st.sampled_from(["system", "user", "assistant", "tool"])
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES, "content": st.one_of(st.just("text"), st.just([{"type": "text", "text": "p"}]))}
).flatmap(
    lambda m: st.booleans().map(
        lambda mark: {**m, "cache_control": {"type": "ephemeral"}} if mark else m
    )
)


@given(st.lists(MESSAGE, max_size=12))
def test_never_more_than_four_and_never_on_a_message_the_client_marked(messages):
    out, placed = with_breakpoints(messages)
    client = [i for i, m in enumerate(messages) if "cache_control" in m]
    assert not set(placed) & set(client)
    assert len(placed) + len(client) <= MAX_BREAKPOINTS or not placed
    for i, (a, b) in enumerate(zip(messages, out, strict=True)):
        if i in placed:
            assert a is not b and orjson.dumps(a) != orjson.dumps(b)
        else:
            assert a is b  # untouched: the very same object


def test_targets_are_the_stable_prefix_end_the_system_block_and_the_newest():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u0"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
    ]
    out, placed = with_breakpoints(messages)
    assert placed == [0, 4, 7]
    assert out[4]["cache_control"] == {"type": "ephemeral"}
    # A tool-call message with no text carries it on its last call.
    only_calls = [{"role": "user", "content": "u"}, messages[2]]
    out, placed = with_breakpoints([*only_calls, {"role": "user", "content": "v"}])
    assert placed == [1, 2]
    assert out[1]["tool_calls"][-1]["cache_control"] == {"type": "ephemeral"}

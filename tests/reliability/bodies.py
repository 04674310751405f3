"""Hypothesis strategies for hostile request bodies of both endpoints.

Mostly near-valid bodies (the shapes a buggy or hostile client sends, with
one field of the wrong type somewhere), some arbitrary JSON, some bytes that
are not JSON at all.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def mostly(valid: Any, bad: Any = None) -> Any:
    """``valid`` three times in four, else a value of any JSON type."""
    wrong = json_values if bad is None else bad
    return st.integers(0, 3).flatmap(lambda n: valid if n else wrong)


texts = st.text(max_size=40) | st.sampled_from(["", "ユーザー", "a\x00b", "\ud7ff" * 3, "x" * 300])
roles = st.sampled_from(["user", "assistant", "system", "tool", "developer", "function", "wizard"])
parts = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["text", "image_url", "input_text", "refusal", "weird"])
        | json_values
    },
    optional={"text": texts | json_values, "image_url": json_values},
)
contents = mostly(texts | st.none() | st.lists(mostly(parts), max_size=3))
functions = st.fixed_dictionaries(
    {}, optional={"name": texts | json_values, "arguments": texts | json_values}
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.sampled_from(["c1", "c2"]) | json_values,
            "type": st.just("function") | json_values,
            "function": functions | json_values,
            "index": json_values,
        },
    )
    | json_values,
    max_size=3,
)
messages = st.fixed_dictionaries(
    {"role": mostly(roles)},
    optional={
        "content": contents,
        "tool_calls": mostly(tool_calls),
        "tool_call_id": mostly(st.sampled_from(["c1", "c2"])),
        "name": mostly(texts),
        "function_call": mostly(functions),
    },
)
models = mostly(st.sampled_from(["gpt-4o", "gpt-4o-mini", "o3"]), json_values | st.just(""))
_optional: dict[str, Any] = {
    "stream": st.booleans() | json_values,
    "stream_options": st.just({"include_usage": True}) | json_values,
    "tools": st.lists(
        st.fixed_dictionaries({"type": st.just("function"), "function": functions}), max_size=2
    )
    | json_values,
    "tool_choice": st.sampled_from(["auto", "none"]) | json_values,
    "user": texts | json_values,
    "metadata": st.dictionaries(st.sampled_from(["session_id", "k"]), texts, max_size=2)
    | json_values,
    "max_tokens": json_values,
}
common_optional = {
    key: mostly(value.branches[0] if hasattr(value, "branches") else value)
    for key, value in _optional.items()
}
chat_bodies = st.fixed_dictionaries(
    {"model": models, "messages": mostly(st.lists(mostly(messages), max_size=5))},
    optional={**common_optional, "functions": st.lists(functions, max_size=2) | json_values},
)
items = (
    messages
    | st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                [
                    "function_call",
                    "function_call_output",
                    "reasoning",
                    "message",
                    "compaction",
                    "zzz",
                ]
            )
            | json_values
        },
        optional={
            "call_id": st.sampled_from(["c1", "c2"]) | json_values,
            "output": texts | json_values,
            "name": texts | json_values,
            "arguments": texts | json_values,
            "role": roles | json_values,
            "content": contents,
            "id": texts | json_values,
            "encrypted_content": texts,
            "summary": json_values,
        },
    )
    | json_values
)
responses_bodies = st.fixed_dictionaries(
    {"model": models, "input": mostly(texts | st.lists(mostly(items), max_size=5))},
    optional={
        **common_optional,
        "previous_response_id": st.sampled_from(["resp_nope", "resp_1"]) | json_values,
        "instructions": texts | json_values,
        "store": st.booleans() | json_values,
    },
)

# Anthropic Messages bodies (/v1/messages): content blocks of each kind the door reads,
# paired and unpaired tool_use/tool_result ids, thinking with and without signatures.
blocks = st.fixed_dictionaries(
    {
        "type": mostly(
            st.sampled_from(
                ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image"]
            ),
            st.just("zzz") | json_values,
        )
    },
    optional={
        "text": texts | json_values,
        "id": st.sampled_from(["t1", "t2"]) | json_values,
        "tool_use_id": st.sampled_from(["t1", "t2"]) | json_values,
        "name": texts | json_values,
        "input": st.just({}) | json_values,
        "content": texts | st.lists(mostly(parts), max_size=2) | json_values,
        "thinking": texts,
        "signature": texts,
        "data": texts,
        "source": st.just({"type": "base64", "media_type": "image/png", "data": "iVBORw0K"})
        | json_values,
        "cache_control": st.just({"type": "ephemeral"}) | json_values,
    },
)
anthropic_messages = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "assistant"]), roles | json_values),
        "content": mostly(texts | st.lists(mostly(blocks), max_size=3)),
    }
)
messages_bodies = st.fixed_dictionaries(
    {
        "model": models,
        "max_tokens": mostly(st.integers(1, 4096), json_values),
        "messages": mostly(st.lists(mostly(anthropic_messages), max_size=5)),
    },
    optional={
        "system": mostly(texts | st.lists(mostly(blocks), max_size=2)),
        "stream": mostly(st.booleans()),
        "tools": mostly(
            st.lists(
                st.fixed_dictionaries(
                    {"name": texts, "input_schema": st.just({"type": "object"}) | json_values}
                ),
                max_size=2,
            )
        ),
        "metadata": mostly(st.dictionaries(st.sampled_from(["user_id", "k"]), texts, max_size=2)),
        "context_management": json_values,
        "thinking": json_values,
    },
)


def encode(body: Any) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # integers over 64 bits: written by the stdlib
        import json

        return json.dumps(body).encode()


raw_garbage = st.binary(max_size=64) | st.sampled_from(
    [b"{", b"[]", b"null", b'{"model":', b"\xff\xfe", b'{"a":' * 5, b'"str"', b"1e999"]
)

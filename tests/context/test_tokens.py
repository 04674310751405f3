"""TiktokenCounter: known counts, encodings per model, the per-content cache, tools."""

from __future__ import annotations

import gc
import hashlib
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from proxy.context.tokens import (
    COUNT_BYTES,
    IMAGE_DEFAULT,
    IMAGE_LOW,
    PER_MESSAGE,
    PER_TOOL_CALL,
    REPLY_PRIMING,
    TOOLS_OVERHEAD,
    CountCache,
    TiktokenCounter,
    counter_for,
    encoding_name_for,
    load_encoding,
    render_functions,
)

ROOT = Path(__file__).resolve().parents[2]


class CountingEncoder:
    """Wraps a real encoding and records every text it is asked to encode."""

    def __init__(self, name: str = "o200k_base") -> None:
        self._inner = load_encoding(name)
        self.name = name
        self.calls: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls.append(text)
        return self._inner.encode_ordinary(text)


def tokens(text: str, encoding: str = "o200k_base") -> int:
    return len(load_encoding(encoding).encode_ordinary(text))


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "array", "items": {"type": "integer"}},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            },
            "required": ["city"],
        },
    },
}


def test_hello_world_is_two_o200k_tokens_and_six_as_a_user_message() -> None:
    assert load_encoding("o200k_base").encode_ordinary("hello world") == [24912, 2375]
    counter = TiktokenCounter("gpt-4o")
    # 3 per message + "user" (1) + "hello world" (2), as OpenAI's cookbook counts.
    assert counter.count_message({"role": "user", "content": "hello world"}) == 6


def test_a_name_costs_its_tokens_plus_one() -> None:
    counter = TiktokenCounter("gpt-4o")
    plain = counter.count_message({"role": "user", "content": "hello world"})
    named = counter.count_message({"role": "user", "content": "hello world", "name": "alice"})
    assert named == plain + tokens("alice") + 1


def test_messages_add_up_and_a_request_adds_reply_priming() -> None:
    counter = TiktokenCounter("gpt-4o")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    expected = 2 * PER_MESSAGE + sum(tokens(m["role"]) + tokens(m["content"]) for m in messages)
    assert counter.count_messages(messages) == expected
    assert counter.count_request_fixed({"messages": messages}) == REPLY_PRIMING


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("openai/gpt-4o-2024-08-06", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("azure/gpt-4.1", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5-mini", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("ft:gpt-4o-mini:acme::abc", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("azure/gpt-35-turbo", "cl100k_base"),
        ("text-davinci-003", "cl100k_base"),  # p50k is not bundled: no download
        ("llama-3-70b", "cl100k_base"),
        ("", "cl100k_base"),
    ],
)
def test_encoding_follows_the_model_family(model: str, encoding: str) -> None:
    assert encoding_name_for(model) == encoding


def test_an_unchanged_message_is_never_tokenized_twice() -> None:
    encoder = CountingEncoder()
    counter = TiktokenCounter("gpt-4o", encoding=encoder)
    message = {"role": "user", "content": "count me once", "name": "bob"}
    first = counter.count_message(message)
    assert encoder.calls == ["user", "count me once", "bob"]
    # Equal content in a new dict, keys in another order: a cache hit.
    same = {"name": "bob", "content": "count me once", "role": "user"}
    assert counter.count_message(same) == first
    assert counter.count_messages([message, same, message]) == 3 * first
    assert len(encoder.calls) == 3
    counter.count_message({**message, "content": "count me twice"})
    assert len(encoder.calls) == 6


def test_a_role_and_content_message_is_counted_once_whatever_its_key_order() -> None:
    encoder = CountingEncoder()
    counter = TiktokenCounter("gpt-4o", encoding=encoder)
    message = {"role": "user", "content": "two strings"}
    first = counter.count_all([message, {"content": "two strings", "role": "user"}])
    assert first[0] == first[1] and encoder.calls == ["user", "two strings"]
    # Another role, other content, or a third field: counted for themselves.
    others = [
        {"role": "assistant", "content": "two strings"},
        {"role": "user", "content": "two strings!"},
        {"role": "user", "content": "two strings", "name": "bob"},
        {"role": "user", "name": "two strings"},
    ]
    fresh = TiktokenCounter("gpt-4o", encoding=CountingEncoder())
    assert counter.count_all(others) == [fresh.count_message(m) for m in others]
    # Each tokenized once, text by text: role and content, the third with its name.
    assert len(encoder.calls) == 2 + 2 + 2 + 3 + 2


def test_count_all_counts_each_message_as_count_message_does() -> None:
    encoder = CountingEncoder()
    counter = TiktokenCounter("gpt-4o", encoding=encoder)
    plain = {"role": "user", "content": "plain words"}
    parts = {"role": "user", "content": [{"type": "text", "text": "plain words"}]}
    empty = {"role": "assistant", "content": None, "refusal": "no"}
    numbered = {"role": "user", "content": "plain words", "n": 1}
    messages = [plain, parts, empty, numbered, {"content": "plain words", "role": "user"}]
    fresh = TiktokenCounter("gpt-4o", encoding=CountingEncoder())
    assert counter.count_all(messages) == [fresh.count_message(m) for m in messages]
    # Each tokenized once (the reordered copy of the first is a cache hit), and the
    # message of strings is not taken for the one with a number or with parts.
    assert len(encoder.calls) == 8
    counter.scale = 1.5
    assert counter.count_all([plain]) == [math.ceil(counter.raw_message(plain) * 1.5)]


def test_scale_multiplies_counts_rounding_up_and_keeps_raw_cached() -> None:
    encoder = CountingEncoder()
    counter = TiktokenCounter("gpt-4o", encoding=encoder)
    message = {"role": "user", "content": "hello world"}
    counter.scale = 1.1
    assert counter.count_message(message) == math.ceil(6 * 1.1) == 7
    counter.scale = 1.0
    assert counter.count_message(message) == 6 and counter.raw_message(message) == 6
    assert len(encoder.calls) == 2  # "user" and "hello world", once


def test_tool_calls_count_name_arguments_and_overhead() -> None:
    counter = TiktokenCounter("gpt-4o")
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    message = {"role": "assistant", "content": None, "tool_calls": [call, call]}
    per_call = PER_TOOL_CALL + tokens("f") + tokens('{"a":1}')
    assert counter.count_message(message) == PER_MESSAGE + tokens("assistant") + 2 * per_call
    legacy = {"role": "assistant", "content": None, "function_call": call["function"]}
    assert counter.count_message(legacy) == PER_MESSAGE + tokens("assistant") + per_call


def test_tool_results_count_their_call_id_and_content() -> None:
    counter = TiktokenCounter("gpt-4o")
    message = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    assert counter.count_message(message) == (
        PER_MESSAGE + tokens("tool") + tokens("call_1") + tokens("42")
    )


def test_content_parts_count_text_and_a_fixed_estimate_per_image() -> None:
    counter = TiktokenCounter("gpt-4o")
    low = {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}}
    auto = {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
    message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, low, auto]}
    expected = PER_MESSAGE + tokens("user") + tokens("what is this?") + IMAGE_LOW + IMAGE_DEFAULT
    assert counter.count_message(message) == expected


def test_a_refusal_is_counted() -> None:
    counter = TiktokenCounter("gpt-4o")
    refusal = "I can't help with that."
    message = {"role": "assistant", "content": None, "refusal": refusal}
    assert counter.count_message(message) == PER_MESSAGE + tokens("assistant") + tokens(refusal)
    parts = {"role": "assistant", "content": [{"type": "refusal", "refusal": refusal}]}
    assert counter.count_message(parts) == counter.count_message(message)


def test_tool_definitions_are_counted_as_openai_renders_them() -> None:
    encoder = CountingEncoder()
    counter = TiktokenCounter("gpt-4o", encoding=encoder)
    rendered = render_functions([WEATHER_TOOL["function"]])
    assert rendered == (
        "namespace functions {\n\n"
        "// Weather for a city.\n"
        "type get_weather = (_: {\n"
        "// City name\n"
        "city: string,\n"
        'unit?: "c" | "f",\n'
        "days?: number[],\n"
        "where?: {\n  lat?: number,\n},\n"
        "}) => any;\n\n"
        "} // namespace functions"
    )
    expected = tokens(rendered) + TOOLS_OVERHEAD
    assert counter.count_tools([WEATHER_TOOL]) == expected
    assert counter.count_tools(None) == counter.count_tools([]) == 0
    body: dict[str, Any] = {"tools": [WEATHER_TOOL]}
    assert counter.count_request_fixed(body) == expected + REPLY_PRIMING
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert counter.count_request_fixed({**body, "tool_choice": named}) == (
        expected + REPLY_PRIMING + 7 + tokens("get_weather")
    )
    assert counter.count_request_fixed({"functions": [WEATHER_TOOL["function"]]}) == (
        expected + REPLY_PRIMING
    )
    calls = len(encoder.calls)
    counter.count_tools([WEATHER_TOOL])
    assert len(encoder.calls) == calls  # the same tools are not rendered and encoded again


def test_counter_for_shares_one_counter_per_model_and_one_cache_per_encoding() -> None:
    assert counter_for("gpt-4o") is counter_for("gpt-4o")
    a, b = counter_for("gpt-4o"), counter_for("gpt-4.1")
    assert a is not b and a._cache is b._cache
    assert counter_for("gpt-4")._cache is not a._cache


def test_the_count_cache_evicts_the_least_recently_used() -> None:
    cache = CountCache(maxsize=2)
    cache.put((1, 1), 10)
    cache.put((2, 2), 20)
    assert cache.get((1, 1)) == 10  # now the most recent
    cache.put((3, 3), 30)
    assert cache.get((2, 2)) is None and cache.get((1, 1)) == 10 and len(cache) == 2


def test_a_message_count_all_finds_in_the_cache_is_kept_as_the_most_recent() -> None:
    counter = TiktokenCounter("gpt-4o", encoding=load_encoding("o200k_base"))
    counter._cache.maxsize = 2
    old, other, new = ({"role": "user", "content": f"message {i}"} for i in range(3))
    counter.count_all([old, other])
    counter.count_all([old])  # a hit: now the most recent
    counter.count_all([new])  # evicts the least recent: other
    assert len(counter._cache) == 2
    calls: list[object] = []
    real = counter._message_tokens
    counter._message_tokens = lambda m: calls.append(m) or real(m)  # type: ignore[method-assign]
    counter.count_all([old])
    assert calls == []
    counter.count_all([other])
    assert calls == [other]


def _content_key(i: int) -> object:
    """A message's content hash (the session layer's key), held by nothing else."""
    return hashlib.blake2b(b"message %d" % i, digest_size=16).hexdigest()


def _json_key(i: int) -> object:
    """The key of a message counted without a session: (its JSON's length, hash)."""
    data = b'{"content":"message %d","role":"user"}' % i
    return len(data), hash(data)


# Entries just past the ordered dict's resizes (its tables at their emptiest), and between.
@pytest.mark.parametrize("entries", [5_462, 21_846, 30_000, 43_700])
@pytest.mark.parametrize("make_key", [_content_key, _json_key])
def test_what_the_count_cache_holds_is_within_its_estimate(entries, make_key) -> None:
    """COUNT_BYTES (what set_count_budget bounds the caches by) is not below what an
    entry really takes (tracemalloc): keys the cache alone holds, counts over 256."""
    cache = CountCache(maxsize=entries)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(entries):
            cache.put(make_key(i), 1000 + i)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == entries
    assert held <= entries * COUNT_BYTES, (held / entries, COUNT_BYTES)


def test_importing_the_counter_does_not_import_litellm() -> None:
    code = "import sys, proxy.context.tokens; sys.exit(1 if 'litellm' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()


def test_content_orjson_cannot_serialize_is_still_counted_and_cached() -> None:
    encoder = CountingEncoder()
    counter = TiktokenCounter("gpt-4o", encoding=encoder)
    message = {"role": "user", "content": [{"type": "custom", "value": 2**70}]}
    first = counter.count_message(message)
    assert first > PER_MESSAGE + tokens("user")
    calls = len(encoder.calls)
    assert counter.count_message(message) == first and len(encoder.calls) == calls


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_a_loaded_encoding_drops_its_python_ranks_and_encodes_as_tiktoken_does(name: str) -> None:
    import tiktoken
    import tiktoken_ext.openai_public as public

    encoding = load_encoding(name)
    # The Rust tokenizer keeps its own copy; the Python dict (~36 MB for both) goes.
    assert encoding._mergeable_ranks == {}  # type: ignore[attr-defined]
    fresh = tiktoken.Encoding(**getattr(public, name)())
    assert len(fresh._mergeable_ranks) > 100_000
    texts = [
        "hello world",
        "Ünïcödé ✓ 日本語のテキスト 🙂🙂",
        "def f(x):\n    return x ** 2  # comment\n\n\n",
        " ".join(str(i) for i in range(500)),
        "a" * 3000,
        "<|endoftext|> is plain text here",
    ]
    for text in texts:
        assert encoding.encode_ordinary(text) == fresh.encode_ordinary(text)

"""The per-session message cache: a pure memo of content hashes and token counts."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context import message_cache as message_cache_module
from proxy.context.message_cache import (
    MessageCache,
    entry_bytes,
    item_counter,
    message_bytes,
    message_key,
)
from proxy.context.tokens import TiktokenCounter, counter_for, load_encoding
from proxy.http.sessions import content_hash
from proxy.store.base import MessageIn, SessionRef, StoredItem

ALICE = SessionRef("tenant-a", "chat-1")
GPT4O = counter_for("gpt-4o")


def fresh(message: dict[str, Any]) -> MessageIn:
    """What the cache must return for ``message``: computed from scratch."""
    key = content_hash(message)
    return MessageIn(message, key, str(message["role"]), GPT4O.count_message(message, key))


def assert_exact(got: list[MessageIn], messages: list[dict[str, Any]]) -> None:
    assert [(m.content_hash, m.role, m.token_count, m.status) for m in got] == [
        (f.content_hash, f.role, f.token_count, f.status) for f in map(fresh, messages)
    ]
    # What would be stored is the message as sent now, byte for byte.
    assert [orjson.dumps(m.message) for m in got] == [orjson.dumps(m) for m in messages]


def assert_afresh(got: list[MessageIn], messages: list[dict[str, Any]], counter: Any) -> None:
    """``got`` is what hashing and counting ``messages`` afresh gives, stored as sent now."""
    hashes = [content_hash(m) for m in messages]
    assert [m.content_hash for m in got] == hashes
    # Counted as the proxy always counts a session's messages: by content hash.
    counts = [counter.count_message(m, h) for m, h in zip(messages, hashes, strict=True)]
    assert [m.token_count for m in got] == counts
    assert [orjson.dumps(m.message) for m in got] == [orjson.dumps(m) for m in messages]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The messages the cache hashes (cache misses), in order."""
    seen: list[dict[str, Any]] = []

    def spy(message: dict[str, Any]) -> str:
        seen.append(message)
        return content_hash(message)

    monkeypatch.setattr(message_cache_module, "content_hash", spy)
    return seen


def test_a_resent_history_is_hashed_only_for_its_new_messages(hashed):
    cache = MessageCache()
    history = [{"role": "system", "content": "be brief"}, user("hi"), assistant("hello")]
    cache.messages(ALICE, history, GPT4O)
    assert len(hashed) == 3
    hashed.clear()

    # The client resends everything (as new objects, parsed from new bytes) plus one message.
    resent = orjson.loads(orjson.dumps([*history, user("weather?")]))
    got = cache.messages(ALICE, resent, GPT4O)

    assert hashed == [user("weather?")]
    assert_exact(got, resent)


def test_a_history_that_dropped_its_oldest_turns_is_matched_by_content(hashed):
    cache = MessageCache()
    turns = [user("q1"), assistant("a1"), user("q2"), assistant("a2"), user("q3")]
    cache.messages(ALICE, turns, GPT4O)
    hashed.clear()

    window = [*turns[2:], assistant("a3"), user("q4")]
    got = cache.messages(ALICE, window, GPT4O)

    assert hashed == [assistant("a3"), user("q4")]
    assert_exact(got, window)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # Equal in Python, different JSON: never served from the cache.
        (1, 1.0),
        (1, True),
        (0, False),
        (0.0, -0.0),
        (1.0, True),
    ],
)
def test_an_edit_python_calls_equal_is_not_served_from_the_cache(hashed, before, after):
    def message(value: object) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": {"n": value}},
                }
            ],
        }

    cache = MessageCache()
    cache.messages(ALICE, [user("go"), message(before)], GPT4O)
    assert message(before) == message(after)  # what a == comparison would have trusted
    hashed.clear()

    got = cache.messages(ALICE, [user("go"), message(after)], GPT4O)

    assert hashed == [message(after)]
    assert_exact(got, [user("go"), message(after)])


def test_reordered_keys_are_a_miss_and_the_message_is_stored_as_sent_now(hashed):
    cache = MessageCache()
    cache.messages(ALICE, [{"role": "user", "content": "hi", "name": "bob"}], GPT4O)
    hashed.clear()
    reordered = {"name": "bob", "content": "hi", "role": "user"}

    got = cache.messages(ALICE, [reordered], GPT4O)

    assert hashed == [reordered]
    assert_exact(got, [reordered])


def test_another_models_tokenizer_recounts_but_keeps_the_hashes(hashed):
    cache = MessageCache()
    history = [user("Ünïcödé text, counted differently by cl100k and o200k: 日本語で答えて。")]
    cache.messages(ALICE, history, GPT4O)
    hashed.clear()
    gpt4 = counter_for("gpt-4")
    assert gpt4.encoding_name != GPT4O.encoding_name

    got = cache.messages(ALICE, history, gpt4)

    assert hashed == []
    key = content_hash(history[0])
    assert got[0].token_count == gpt4.count_message(history[0], key)
    assert got[0].token_count != GPT4O.count_message(history[0], key)
    assert got[0].content_hash == content_hash(history[0])


def test_sessions_are_bounded_least_recently_used_first():
    cache = MessageCache(max_sessions=2)
    sessions = [SessionRef("t", k) for k in ("a", "b", "c")]
    for ref in sessions:
        cache.messages(ref, [user(ref.key)], GPT4O)
    assert len(cache) == 2
    one = message_bytes(message_key(user("a")), fresh(user("a")))
    assert cache.size == 2 * one


def test_bytes_held_are_bounded(hashed):
    one = message_bytes(message_key(user("x" * 100)), fresh(user("x" * 100)))
    cache = MessageCache(max_bytes=2 * one)
    cache.messages(SessionRef("t", "a"), [user("x" * 100)], GPT4O)
    cache.messages(SessionRef("t", "b"), [user("y" * 100)], GPT4O)
    cache.messages(SessionRef("t", "c"), [user("z" * 100)], GPT4O)
    assert cache.size <= 2 * one and len(cache) == 2
    # A history bigger than the whole budget is not kept at all.
    cache.messages(SessionRef("t", "d"), [user("w" * 1000)], GPT4O)
    hashed.clear()
    cache.messages(SessionRef("t", "d"), [user("w" * 1000)], GPT4O)
    assert len(hashed) == 1


def _tool_call(i: int) -> dict[str, Any]:
    # Not all strings: keyed by its JSON (the copy orjson over-allocates).
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "x" * 900}}
        ],
    }


@pytest.mark.parametrize("make", [lambda i: user(f"{i} " + "y" * 900), _tool_call])
def test_what_the_cache_holds_is_within_its_byte_budget(make):
    """The estimate it evicts by is not below what its entries really take (tracemalloc)."""
    budget = 2 * 2**20
    cache = MessageCache(max_bytes=budget)
    # A counter of its own, remembering no counts: only the cache's holdings are measured.
    counter = TiktokenCounter("gpt-4o", encoding=load_encoding("o200k_base"))
    counter._cache.maxsize = 1
    counter.count_message(make(-1))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for s in range(40):
            # Parsed anew, as a request body is; only what the cache keeps stays alive.
            messages = orjson.loads(orjson.dumps([make(s * 100 + i) for i in range(100)]))
            cache.messages(SessionRef("t", f"s{s}"), messages, counter)
            del messages
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.size <= budget
    assert len(cache) < 40  # the budget evicted the oldest sessions
    # Within a quarter of the real size (orjson's own buffers would be ~8x the JSON).
    assert held <= cache.size * 1.25, (held, cache.size)


def test_a_resent_prefix_is_served_as_the_objects_kept():
    cache = MessageCache()
    history = [user("hi"), assistant("hello")]
    first = cache.messages(ALICE, history, GPT4O)
    resent = orjson.loads(orjson.dumps([*history, user("more")]))
    got = cache.messages(ALICE, resent, GPT4O)
    # The new copies of the old messages are not kept: the first ones are.
    assert got[0] is first[0] and got[1] is first[1]
    assert got[2].message is resent[2]


# Messages that collide under Python's == but not as JSON, and plain ones.
_values = st.sampled_from([1, 1.0, True, 0, 0.0, -0.0, False, None, "1", "", [], {}])
_messages = st.one_of(
    st.builds(user, st.sampled_from(["hi", "hello", "weather?", "Hi"])),
    st.builds(assistant, st.sampled_from(["hi", "ok", "sure"])),
    st.builds(
        lambda v, w: {"role": "user", "content": [{"type": "text", "text": "n", "n": v}], "x": w},
        _values,
        _values,
    ),
    st.builds(
        lambda v: {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": v}}}],
        },
        _values,
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_messages, max_size=6), min_size=1, max_size=6), st.booleans())
def test_whatever_a_session_sends_the_cache_answers_as_hashing_afresh_would(calls, two_models):
    cache = MessageCache()
    for i, messages in enumerate(calls):
        # Parsed anew each time, as a request body is.
        messages = orjson.loads(orjson.dumps(messages))
        counter = counter_for("gpt-4" if two_models and i % 2 else "gpt-4o")
        assert_afresh(cache.messages(ALICE, messages, counter), messages, counter)


def test_a_stored_item_is_counted_as_cached_else_as_stored_never_tokenized_again():
    """``history: server`` items (proxy/http/history_view.py counts them with this)."""
    counter = TiktokenCounter("gpt-4o", encoding=load_encoding("o200k_base"))  # nothing cached
    message = user("a stored question")
    key = content_hash(message)
    count = item_counter(counter)
    assert count(StoredItem(7, 1, None, "p", key, "user", 42, message, "complete", 0.0)) == 42
    # Counted for this tokenizer before: that count, whatever was stored.
    real = counter.count_message(message, key)
    assert count(StoredItem(7, 1, None, "p", key, "user", 42, message, "complete", 0.0)) == real
    # Nothing stored (a row from before counts were kept): counted now.
    other = user("never counted")
    item = StoredItem(8, 1, None, "p", content_hash(other), "user", None, other, "complete", 0.0)
    assert count(item) == GPT4O.count_message(other)


@pytest.mark.parametrize("edit", [False, True], ids=["resent", "resent-after-an-edit"])
def test_a_resent_history_is_held_once_not_once_per_copy_parsed(edit):
    """The keys kept share the kept messages' strings, not those of the copy just parsed."""
    cache = MessageCache()
    counter = TiktokenCounter("gpt-4o", encoding=load_encoding("o200k_base"))
    history = [user(f"{i} " + "z" * 2000) for i in range(200)]
    body = orjson.dumps(history)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        cache.messages(ALICE, orjson.loads(body), counter)
        gc.collect()
        first = tracemalloc.get_traced_memory()[0] - base
        for n in range(3):
            again = orjson.loads(body)
            if edit:  # an edited turn: the rest is found by key, not by position
                again[n] = user(f"edited {n}")
            cache.messages(ALICE, again, counter)
            del again
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert first > 200 * 2000
    assert held < 1.2 * first, (held, first)


def test_a_loop_over_more_sessions_than_fit_still_hits_on_those_held(hashed):
    """64 agents in turn over a cache that holds a share of them: that share is not
    hashed again (a plain LRU evicted each session just before its next turn)."""
    history = [user(f"{i} " + "h" * 1000) for i in range(20)]
    one = sum(message_bytes(message_key(m), fresh(m)) for m in history)
    cache = MessageCache(max_bytes=24 * one)  # ~22 sessions, less the uses' reserve
    refs = [SessionRef("t", f"agent-{i}") for i in range(64)]
    for _ in range(3):
        for ref in refs:
            cache.messages(ref, orjson.loads(orjson.dumps(history)), GPT4O)
    held = len(cache)
    assert 10 <= held < 64
    hashed.clear()
    for ref in refs:
        got = cache.messages(ref, orjson.loads(orjson.dumps(history)), GPT4O)
        assert_exact(got, history)  # held or not, exactly what hashing afresh gives
    assert len(hashed) == (64 - held) * len(history)
    assert cache.size <= cache.max_bytes


def held_estimate(cache: MessageCache) -> tuple[int, int]:
    """The size the cache's entry for ALICE says, and the sum of its messages' estimates."""
    entry = cache._entries.peek((ALICE.tenant, ALICE.key))
    assert entry is not None
    return entry.size, entry_bytes(entry)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(1, 3)), max_size=10))
def test_the_size_kept_is_the_sum_of_what_is_held_turn_after_turn(turns):
    """Resends with the last message edited, cuts and appends in any order: the
    entry's size is never off its messages' estimates."""
    cache = MessageCache()
    sent: list[dict[str, Any]] = []
    for step, (edit_last, cut, added) in enumerate(turns):
        sent = sent[: max(0, len(sent) - cut)]
        if edit_last and sent:
            sent[-1] = user(f"edited at {step}")
        sent += [user(f"turn {step} part {i}") for i in range(added)]
        cache.messages(ALICE, orjson.loads(orjson.dumps(sent)), GPT4O)
        size, estimate = held_estimate(cache)
        assert size == estimate


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_messages, min_size=1, max_size=5),
    st.lists(st.tuples(st.lists(_messages, max_size=3), st.integers(-1, 6), _messages), max_size=6),
)
def test_a_history_resent_whole_is_answered_as_hashing_afresh_would(first, turns):
    """The resent prefix matched in C (dicts, key orders, nested JSON): a message swapped
    for one Python calls equal, or its keys reordered, is never taken for the old one."""
    cache = MessageCache()
    sent = list(first)
    cache.messages(ALICE, orjson.loads(orjson.dumps(sent)), GPT4O)
    for added, at, swap in turns:
        sent = [*sent, *added]
        if 0 <= at < len(sent):
            sent[at] = swap if at % 2 else dict(reversed(list(sent[at].items())))
        messages = orjson.loads(orjson.dumps(sent))
        assert_afresh(cache.messages(ALICE, messages, GPT4O), messages, GPT4O)
        size, estimate = held_estimate(cache)
        assert size == estimate


def _long_turns(budget: int) -> tuple[MessageCache, list[bytes]]:
    """A cache of ``budget`` bytes, and three bodies of one session over 64 KiB."""
    history = [user(f"{i} " + "words " * 120) for i in range(100)]
    bodies = [orjson.dumps({"model": "m", "messages": history[: 98 + i]}) for i in range(3)]
    return MessageCache(max_bytes=budget), bodies


def _send(cache: MessageCache, raw: bytes) -> tuple[bool, int]:
    """One turn of ALICE's: whether its body was read from the kept prefix, and how many
    of its messages the cache held."""
    body = cache.resent_body(ALICE, raw)
    resent = body is not None
    if body is None:
        body = orjson.loads(raw)
    messages = body["messages"]
    lookup = cache.lookup(ALICE, messages)
    cache.messages(ALICE, messages, GPT4O, lookup=lookup, body=(raw, body))
    return resent, lookup.matched


def test_a_long_body_is_read_from_the_kept_prefix_when_the_budget_has_room_for_it():
    cache, bodies = _long_turns(64 * 2**20)
    # The first body is a miss (nothing kept), the second finds its prefix, the third uses it.
    assert [_send(cache, raw) for raw in bodies] == [(False, 0), (False, 98), (True, 99)]
    assert cache.size >= len(bodies[-1])


def test_a_prefix_never_takes_room_a_sessions_messages_need():
    # Room for the session's messages, not for its body's bytes as well.
    cache, bodies = _long_turns(150 * 2**10)
    # Each turn a hit on the messages held, none read from a prefix.
    assert [_send(cache, raw) for raw in bodies] == [(False, 0), (False, 98), (False, 99)]
    assert len(cache) == 1 and cache.size < 150 * 2**10

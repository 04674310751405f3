"""proxy/context/recall_memo.py: a memoized recall is the recall, for the request it holds for."""

from __future__ import annotations

import copy

from policies.recall import Hit, Recalled, recall
from policies.types import Decision, Message, RecallSpec
from proxy.context.recall_memo import RecallMemo, RecallResult, result_of
from proxy.store.base import SessionRef
from tests.policies.test_properties import simple_count
from tests.policies.test_recall import chat, trimmed

REF = SessionRef("t", "s")


def memoized() -> tuple[list[Message], Decision, Recalled, RecallResult]:
    """A recall of message 7 of a trimmed chat, and the memo's result of it."""
    messages = chat()
    decision = trimmed(messages, 200)
    out, got = recall(messages, decision, [Hit(7, 3.0, item_id=70)], simple_count, 400)
    result = result_of(got, out, messages, status="recalled", terms=2, candidates=1, semantic=None)
    return messages, out, got, result


def test_a_memoized_recall_gives_the_next_identical_request_what_recall_gave_it():
    messages, out, got, result = memoized()
    # The next request: the same content in new objects, decided again.
    again = copy.deepcopy(messages)
    decided = trimmed(again, 200)
    applied = result.applied(decided, again)
    assert applied is not None
    assert applied.messages == out.messages
    assert applied.tokens_after == out.tokens_after
    # The policy's own messages are the request's; the block is a copy of its own.
    at = got.position
    assert at is not None
    own = {id(m) for m in again}
    assert all(id(m) in own for j, m in enumerate(applied.messages) if j != at)
    assert applied.messages[at] is not out.messages[at]


def test_a_recalled_message_that_differs_beyond_its_hash_is_recalled_again():
    messages, _, _, result = memoized()
    # A time the block would quote is not part of a message's content hash.
    again = copy.deepcopy(messages)
    again[7]["timestamp"] = "2024-05-01T10:00:00Z"
    assert result.applied(trimmed(again, 200), again) is None


def test_the_memo_holds_one_entry_per_session_for_its_exact_key():
    memo = RecallMemo(max_sessions=2)
    messages = chat()
    decision = trimmed(messages, 200)
    spec = RecallSpec(share=0.3)
    hashes = [str(i) for i in range(len(messages))]
    key = RecallMemo.key(1, spec, 400, "gpt-4o", hashes, decision)
    result = result_of(
        recall(messages, decision, [], simple_count, 400)[1],
        decision,
        messages,
        status="none",
        terms=0,
        candidates=0,
        semantic=None,
    )
    memo.put(REF, key, result, len(hashes))
    assert memo.get(REF, RecallMemo.key(1, spec, 400, "gpt-4o", list(hashes), decision)) is result
    for other in (
        RecallMemo.key(2, spec, 400, "gpt-4o", hashes, decision),  # the items changed
        RecallMemo.key(1, spec, 300, "gpt-4o", hashes, decision),
        RecallMemo.key(1, spec, 400, "gpt-4o-mini", hashes, decision),
        RecallMemo.key(1, spec, 400, "gpt-4o", [*hashes[:-1], "x"], decision),
        RecallMemo.key(1, RecallSpec(share=0.2), 400, "gpt-4o", hashes, decision),
    ):
        assert memo.get(REF, other) is None
    memo.put(SessionRef("t", "a"), key, result, 1)
    memo.put(SessionRef("t", "b"), key, result, 1)
    assert len(memo) == 2 and memo.get(REF, key) is None

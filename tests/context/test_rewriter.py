"""proxy/context/rewriter.py: the recall reserve is taken off the budget only when it is needed."""

from __future__ import annotations

from typing import Any

from policies.types import RecallSpec, TrimSpec
from proxy.context.rewriter import Rewriter, conversation_tokens

SPEC = TrimSpec(max_tokens=1000, recall=RecallSpec(share=0.5))


def chat(turns: int, words: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in range(turns):
        out += [
            {"role": "user", "content": f"question {t} " + "word " * words},
            {"role": "assistant", "content": f"answer {t} " + "word " * words},
        ]
    return [*out, {"role": "user", "content": "and then?"}]


def rewriter() -> Rewriter:
    return Rewriter({"p": SPEC, "plain": TrimSpec(max_tokens=1000)})


def test_a_conversation_within_the_whole_budget_keeps_all_of_it():
    messages = chat(6, 40)  # about 600 tokens: over the window's 500, within the budget's 1000
    decision = rewriter().decide("p", messages, {}, "gpt-4o")
    assert decision.dropped == ()
    assert decision.extra.get("recall_budget", 0) == 0  # nothing dropped: nothing to recall


def test_a_conversation_over_the_budget_makes_room_for_the_recall_block():
    messages = chat(20, 40)
    with_recall = rewriter().decide("p", messages, {}, "gpt-4o")
    plain = rewriter().decide("plain", messages, {}, "gpt-4o")
    assert with_recall.extra["recall_budget"] == 500
    assert with_recall.tokens_after <= 500 < plain.tokens_after


def test_turns_dropped_within_the_budget_leave_recall_what_the_policy_left():
    spec = TrimSpec(max_turns=2, max_tokens=1000, recall=RecallSpec(share=0.5))
    messages = chat(6, 10)
    decision = Rewriter({"p": spec}).decide("p", messages, {}, "gpt-4o")
    assert decision.dropped
    room = decision.extra["recall_budget"]
    assert 0 < room <= 500 and decision.tokens_after + room <= 1000


def test_a_session_resending_its_request_gets_the_same_decision_from_the_memo():
    import copy

    from proxy.context.plan_memo import PlanMemo
    from proxy.context.tokens import counter_for
    from proxy.http.sessions import content_hash
    from proxy.store.base import SessionRef

    memo, ref = PlanMemo(), SessionRef("t", "s")
    rw = rewriter()
    counter = counter_for("gpt-4o")

    def decide(messages: list[dict[str, Any]], body: dict[str, Any], policy: str = "plain") -> Any:
        keys = [content_hash(m) for m in messages]
        counts = [counter.count_message(m) for m in messages]
        return rw.decide(policy, messages, body, "gpt-4o", keys, counts=counts, memo=memo, ref=ref)

    decided = []
    real = rw._decide
    rw._decide = lambda *a: decided.append(1) or real(*a)  # type: ignore[method-assign]
    messages = chat(20, 40)
    first = decide(messages, {})
    again = copy.deepcopy(messages)  # the same history, resent: new objects
    second = decide(again, {})
    assert len(decided) == 1  # the second from the memo
    assert second == rw.decide("plain", again, {}, "gpt-4o") and second.dropped
    assert all(any(m is a for a in again) for m in second.messages)  # this request's own
    assert first.messages == second.messages and first.messages[0] is not second.messages[0]
    # Anything the decision depends on, changed: decided anew.
    grown = [*again, {"role": "assistant", "content": "word " * 300}, *again[-1:]]
    assert decide(grown, {}) == rw.decide("plain", grown, {}, "gpt-4o")
    fixed = {"tools": [{"type": "function", "function": {"name": "f" * 400}}]}
    assert decide(again, fixed) == rw.decide("plain", again, fixed, "gpt-4o")
    assert decide(again, {}, "p") == rw.decide("p", again, {}, "gpt-4o")


def test_the_counts_a_session_holds_decide_whether_recall_needs_its_reserve():
    # Whether the conversation fits the whole budget is the sum of the counts given
    # (the message cache's), not a count of every message again.
    def uncounted(message: Any) -> int:
        raise AssertionError("a message was counted again")

    assert conversation_tokens(SPEC, chat(2, 1), uncounted, [3, 4, 5, 6, 7]) == 25
    assert conversation_tokens(TrimSpec(max_tokens=1000), chat(2, 1), uncounted, [1]) is None
    messages = chat(6, 40)  # about 600 tokens by tiktoken: fits the budget of 1000
    counted = [len(m["content"].split()) + 4 for m in messages]
    fits = rewriter().decide("p", messages, {}, "gpt-4o", counts=counted)
    assert fits.extra.get("recall_budget", 0) == 0
    heavy = [200] * len(messages)  # said to be 2,600 tokens: over it, the reserve is taken
    over = rewriter().decide("p", messages, {}, "gpt-4o", counts=heavy)
    assert over.extra["recall_budget"] > 0

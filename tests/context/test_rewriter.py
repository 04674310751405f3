"""proxy/context/rewriter.py: the recall reserve is taken off the budget only when it is needed."""

from __future__ import annotations

from typing import Any

from policies.types import RecallSpec, TrimSpec
from proxy.context.rewriter import Rewriter

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

"""OfflineSummaries: a summarize policy's decisions with the summaries kept in memory."""

from __future__ import annotations

from typing import Any

import pytest

from policies.summarize import plan
from policies.types import Budget, ContextTooLong, Message, SummarizeSpec
from proxy.context.offline_summaries import OfflineSummaries
from proxy.context.summarizer import SummaryFailed, SummaryOutput, SummaryRequest

SPEC = SummarizeSpec(trigger_turns=2, keep_last_turns=1, max_tokens=400)
BUDGET = Budget(limit=400, fixed=3)


def count(message: Message) -> int:
    return 4 + len(str(message.get("content") or "")) // 4


def chat(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Ticket T-{100 + t} is open. Turn {t}."})
        messages.append({"role": "assistant", "content": f"Looking at T-{100 + t}."})
    return [*messages, {"role": "user", "content": "Any news?"}]


def failing(reason: str) -> Any:
    def make(request: SummaryRequest) -> SummaryOutput:
        raise SummaryFailed(reason, "test")

    return make


def test_a_request_past_the_trigger_waits_for_a_summary_then_the_next_reuses_it():
    calls: list[tuple[SummaryRequest, SummaryOutput | None]] = []
    summaries = OfflineSummaries(SPEC, count, BUDGET, on_call=lambda r, o: calls.append((r, o)))
    first = summaries.decide(chat(2))
    assert first.extra["summary"]["status"] == "created"
    assert first.extra["summary"]["id"] == 1 and first.extra["summary"]["units"] == 2
    assert first.reason == "summarized" and "fallback" not in first.extra
    (request, output) = calls[0]
    assert "Ticket T-100 is open." in request.transcript and output is not None
    assert output.text in first.messages[1]["content"]
    # The same history plus one answered turn: still within the trigger.
    again = summaries.decide([*chat(2)[:-1], {"role": "user", "content": "And?"}])
    assert again.extra["summary"]["status"] == "reused" and again.extra["summary"]["id"] == 1
    assert (summaries.calls, summaries.waits, summaries.failed) == (1, 1, 0)


def test_within_the_trigger_nothing_is_summarized():
    summaries = OfflineSummaries(SPEC, count, BUDGET)
    decision = summaries.decide(chat(1))
    assert decision.extra["summary"] == {"status": "none"}
    assert not decision.changed and summaries.calls == 0


def test_prepare_makes_the_next_requests_summary_after_the_answer():
    summaries = OfflineSummaries(SPEC, count, BUDGET)
    # Two turns answered: the next request (a third turn) will pass the trigger.
    summaries.prepare(chat(2)[:-1])
    assert (summaries.calls, summaries.waits, len(summaries.states)) == (1, 0, 1)
    decision = summaries.decide(chat(2))
    assert decision.extra["summary"]["status"] == "reused"
    assert (summaries.calls, summaries.waits) == (1, 0)  # nobody waited
    # Within the trigger, nothing is made ahead.
    fresh = OfflineSummaries(SPEC, count, BUDGET)
    fresh.prepare(chat(1)[:-1])
    assert fresh.calls == 0


@pytest.mark.parametrize("reason", ["empty", "error", "timeout"])
def test_a_failing_summarizer_serves_the_trimming_fallback_and_keeps_nothing(reason):
    told: list[SummaryOutput | None] = []
    summaries = OfflineSummaries(
        SPEC, count, BUDGET, failing(reason), on_call=lambda r, o: told.append(o)
    )
    messages = chat(3)
    decision = summaries.decide(messages)
    assert decision.extra["fallback"] == f"summarizer_{reason}"
    assert decision.extra["summary"]["status"] == "fallback"
    backup = plan(messages, SPEC, count, BUDGET).fallback
    assert backup is not None and decision.messages == backup.messages
    assert summaries.states == [] and told == [None]
    assert (summaries.calls, summaries.waits, summaries.failed) == (1, 1, 1)
    summaries.prepare(messages[:-1])  # a failure made ahead is counted, not raised
    assert summaries.failed == 2


def test_a_summary_too_long_for_the_budget_falls_back_to_trimming():
    def verbose(request: SummaryRequest) -> SummaryOutput:
        return SummaryOutput("word " * 4000, "test")

    summaries = OfflineSummaries(SPEC, count, BUDGET, verbose)
    decision = summaries.decide(chat(3))
    assert decision.extra["fallback"] == "summary_too_long"
    assert decision.tokens_after <= 400


def test_a_newest_turn_over_the_budget_is_refused_as_the_proxy_refuses_it():
    summaries = OfflineSummaries(SPEC, count, BUDGET)
    with pytest.raises(ContextTooLong):
        summaries.decide([{"role": "user", "content": "word " * 2000}])

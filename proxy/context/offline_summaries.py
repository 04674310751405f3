"""Summarize policies offline: one conversation's summaries in memory, made on the spot.

``python -m proxy replay`` and the replay bench run a summarize policy turn
by turn with no store and no model. :class:`OfflineSummaries` plays the part
the summary service (:mod:`proxy.summaries`) plays for a session: the stored
summaries are a list, the summarizer is synchronous (by default the
deterministic extractive stand-in, ``ctxproxy/extractive``), and the
decisions are the proxy's: a stored summary reused, a new one made when a
request needs it (the request waits for it), the next one prepared after
each answer (``prefetch``), the trimming fallback when the summarizer fails
or its summary does not fit. Each decision's ``extra`` says so as the
proxy's request row does (``summary``: status, id...; ``fallback``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence

from policies.summarize import assemble, plan, prefetch
from policies.transcript import transcript
from policies.types import (
    Budget,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    SummarizeSpec,
    SummaryState,
    SummaryTask,
)
from proxy.context.summaries import SummaryOutcome
from proxy.context.summarizer import (
    ExtractiveSummarizer,
    SummaryFailed,
    SummaryOutput,
    SummaryRequest,
)

# A synchronous summarizer: raises SummaryFailed as the proxy's summarizers do.
Make = Callable[[SummaryRequest], SummaryOutput]
# Told of every summarizer call and its answer (None when it failed).
OnCall = Callable[[SummaryRequest, SummaryOutput | None], None]


def extractive(count: CountFn) -> ExtractiveSummarizer:
    """The extractive stand-in, measuring its quotes in message tokens as ``count`` does."""
    empty = count({"content": ""})
    return ExtractiveSummarizer(lambda text: count({"content": text}) - empty)


class OfflineSummaries:
    """The summaries of one conversation under one summarize policy, kept in memory."""

    def __init__(
        self,
        spec: SummarizeSpec,
        count: CountFn,
        budget: Budget,
        make: Make | None = None,
        *,
        on_call: OnCall | None = None,
    ) -> None:
        self.spec = spec
        self.count = count
        self.budget = budget
        self.make = make or extractive(count).make
        self.on_call = on_call
        self.states: list[SummaryState] = []
        # Summarizer calls, those a request waited for, and those that failed.
        self.calls = 0
        self.waits = 0
        self.failed = 0

    def decide(self, request: Sequence[Message]) -> Decision:
        """The decision for one request; raises ContextTooLong as the policy does."""
        planned = plan(request, self.spec, self.count, self.budget, self.states)
        if planned.decision is not None:
            if planned.reused is None:
                return _noted(SummaryOutcome(planned.decision, "none"))
            return _noted(SummaryOutcome(planned.decision, "reused", summary_id=planned.reused.id))
        task, backup = planned.task, planned.fallback
        assert task is not None and backup is not None  # a plan without a decision has both
        self.waits += 1
        try:
            state = self._make(request, task)
        except SummaryFailed as exc:
            return _noted(SummaryOutcome(backup, "fallback", fallback=f"summarizer_{exc.reason}"))
        try:
            decision = assemble(request, self.spec, self.count, self.budget, state)
        except ContextTooLong:
            # The summary itself does not fit the budget: trimming alone does.
            return _noted(SummaryOutcome(backup, "fallback", fallback="summary_too_long"))
        return _noted(SummaryOutcome(decision, "created", summary_id=state.id))

    def prepare(self, history: Sequence[Message]) -> None:
        """After an answer (``history`` ends with it): make the next request's summary ahead."""
        task = prefetch(history, self.spec, self.count, self.budget, self.states)
        if task is None:
            return
        # A failure is counted; the next request makes it again or falls back, as in the proxy.
        with contextlib.suppress(SummaryFailed):
            self._make(history, task)

    def _make(self, messages: Sequence[Message], task: SummaryTask) -> SummaryState:
        previous = task.previous.text if task.previous is not None else None
        request = SummaryRequest(previous, transcript(messages, task.source), task.max_tokens)
        self.calls += 1
        try:
            output = self.make(request)
        except SummaryFailed:
            self.failed += 1
            if self.on_call is not None:
                self.on_call(request, None)
            raise
        if self.on_call is not None:
            self.on_call(request, output)
        # Numbered as a store numbers them, so rows can say which summary they used.
        state = task.state(output.text, id=len(self.states) + 1)
        self.states.append(state)
        return state


def _noted(outcome: SummaryOutcome) -> Decision:
    """The outcome's decision, its ``extra`` saying what a request row's detail says."""
    decision = outcome.decision
    detail = outcome.detail(decision.extra.get("summary"))
    return dataclasses.replace(decision, extra={**decision.extra, **detail})

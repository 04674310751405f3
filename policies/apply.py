"""One entry point for every policy: dispatch on the spec's type."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from policies.mask import MaskView, mask_tool_outputs
from policies.summarize import plan
from policies.trim import trim
from policies.types import (
    Budget,
    CountFn,
    Decision,
    Message,
    NoneSpec,
    PolicySpec,
    SummarizeSpec,
    TrimSpec,
)


def apply(
    messages: Sequence[Message],
    spec: PolicySpec,
    count: CountFn,
    budget: Budget,
    costs: Sequence[int] | None = None,
) -> Decision:
    """The decision ``spec`` makes for ``messages``; raises ContextTooLong when it cannot fit.

    A spec with ``mask_tool_outputs`` decides over the masked view
    (:mod:`policies.mask`): same positions, old tool output as placeholders.
    ``costs``: what ``count`` gives for each of ``messages``, when the caller has it.
    """
    # Trimming masks at its budget crossings itself (policies.trim.masked_replay).
    mask = spec.mask_tool_outputs if isinstance(spec, NoneSpec) else None
    if mask is not None:
        view = mask_tool_outputs(messages, mask, count)
        if view.masked:
            # The view's placeholders cost less than the messages counted.
            return with_masks(_apply(view.messages, spec, count, budget), view)
    return _apply(messages, spec, count, budget, costs)


def with_masks(decision: Decision, view: MaskView) -> Decision:
    """``decision`` (made over ``view``) as a decision over the conversation as sent."""
    kept = set(decision.kept)
    return dataclasses.replace(
        decision,
        masked=tuple(m for m in view.masked if m.index in kept),
        # The conversation as sent cost its results in full.
        tokens_before=decision.tokens_before + view.saved,
    )


def _apply(
    messages: Sequence[Message],
    spec: PolicySpec,
    count: CountFn,
    budget: Budget,
    costs: Sequence[int] | None = None,
) -> Decision:
    if isinstance(spec, TrimSpec):
        return trim(messages, spec, count, budget, costs)
    if isinstance(spec, NoneSpec):
        return passthrough(messages, count, budget, costs)
    if isinstance(spec, SummarizeSpec):
        return summarize_stateless(messages, spec, count, budget)
    raise TypeError(f"unknown policy spec: {spec!r}")


def passthrough(
    messages: Sequence[Message],
    count: CountFn,
    budget: Budget,
    costs: Sequence[int] | None = None,
) -> Decision:
    """Everything forwarded as it came: no drop, no repair, no budget check.

    Counted all the same, so what a conversation costs is known (and logged)
    under every policy (``costs``: the counts, when the caller has them).
    """
    tokens = sum(map(count, messages) if costs is None else costs) + budget.fixed
    return Decision(
        messages=list(messages),
        kept=tuple(range(len(messages))),
        tokens_before=tokens,
        tokens_after=tokens,
        budget=budget.limit,
    )


def summarize_stateless(
    messages: Sequence[Message], spec: SummarizeSpec, count: CountFn, budget: Budget
) -> Decision:
    """A summarize policy with no stored summary and no summarizer at hand.

    What it forwards when no summary is needed; when one is, the trimming
    fallback, marked ``extra["summary_needed"]`` (the proxy makes summaries;
    a pure caller cannot).
    """
    planned = plan(messages, spec, count, budget)
    if planned.decision is not None:
        return planned.decision
    assert planned.fallback is not None  # a plan with a task always has its fallback
    decision = planned.fallback
    return dataclasses.replace(decision, extra={**decision.extra, "summary_needed": True})

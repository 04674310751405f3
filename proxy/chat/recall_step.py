"""The chat pipeline's recall step, and how its outcome shows in headers and the log line.

``ChatExchange.plan`` calls :func:`recall_step` after the policy decided, for
policies with a ``recall:`` block only; the Responses pipeline reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.types import Decision, Message, PolicySpec, RecallSpec
from proxy.context.recall import ERROR, NONE, RECALLED, RecallOutcome
from proxy.context.tokens import counter_for
from proxy.runtime import Runtime
from proxy.store.base import SessionRef


def spec_recall(spec: PolicySpec) -> RecallSpec | None:
    recall: RecallSpec | None = getattr(spec, "recall", None)
    return recall


async def recall_step(
    rt: Runtime,
    policy: str,
    spec: PolicySpec,
    ref: SessionRef | None,
    conversation: Sequence[Message],
    hashes: Sequence[str] | None,
    decision: Decision,
    model: str,
    sizes: Sequence[int] | None = None,
) -> tuple[Decision, RecallOutcome]:
    recall = spec_recall(spec)
    assert recall is not None  # the caller checked
    budget = decision.extra.get("recall_budget", 0)
    counter = counter_for(model)

    def count(message: Message) -> int:
        # Only the recall block is counted here: it is the one message recall makes.
        return counter.count_message(message)

    decided, outcome = await rt.recall.apply(
        policy=policy,
        spec=recall,
        budget=budget if isinstance(budget, int) else 0,
        ref=ref,
        conversation=conversation,
        hashes=hashes,
        decision=decision,
        count=count,
        sizes=sizes,
        model=model,
    )
    if ref is not None and decision.dropped and outcome.status in (RECALLED, NONE):
        # The lines later requests may quote, counted while this one waits upstream.
        rt.background.spawn(
            rt.recall.prepare(ref, conversation, decision, counter), name="recall-prepare"
        )
    return decided, outcome


def recall_headers(outcome: RecallOutcome) -> dict[str, str]:
    """``X-Context-Recall`` (the outcome), ``-Recalled`` (turns), ``-Recall-Tokens``."""
    h = {"x-context-recall": outcome.status}
    if outcome.status != ERROR:
        h["x-context-recalled"] = str(outcome.recalled.turns)
        h["x-context-recall-tokens"] = str(outcome.recalled.tokens)
    return h


def recall_log_fields(outcome: RecallOutcome) -> dict[str, Any]:
    return {
        "recall": outcome.status,
        "recalled_turns": outcome.recalled.turns,
        "recalled_messages": outcome.recalled.messages,
        "recall_tokens": outcome.recalled.tokens,
        "recall_ms": round(outcome.ms, 3),
    }

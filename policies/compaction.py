"""Compaction's choices over Responses items: what a summary covers, what stays, what folds away.

A compaction replaces a conversation by a summary of it. The proxy makes that
summary with the summarize machinery (:mod:`policies.summarize`: its answer
budget, its pinned facts, its stored summaries): :func:`fold` names the one
summary of every turn, incremental. The newest summary covering a prefix of
the conversation (stored, or the expanded compaction item's) is extended with
only the turns after it, at any item (a compaction folds every turn, so the
prefix need not end where a user turn starts). What is not a conversation
turn is never summarized as one: system and developer messages, the proxy's
own expanded summaries (:func:`policies.items.is_summary`), compaction items
and triggers. Client-held pieces:

- :func:`retained`: what ``/v1/responses/compact`` hands back besides the
  compaction item: the user messages, in order (as OpenAI's endpoint does).
- :func:`newest_turn`: where the newest turn starts, so a compaction past a
  ``compact_threshold`` folds everything before it and the turn is answered
  whole (a call with its output, reasoning with its item: units never split).
- :func:`pinned`: the system and developer messages a fold keeps in place.

Pure: no I/O, no imports from ``proxy``.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.facts import MAX_FACTS, extract, merge
from policies.items import item_layout, kind_of, recallable, role_of
from policies.summarize import Plan, allowance
from policies.transcript import message_text
from policies.types import (
    CountFn,
    Message,
    SummarizerSpec,
    SummarizeSpec,
    SummaryState,
    SummaryTask,
)
from policies.units import SYSTEM_ROLES


def compaction_spec(summarizer: SummarizerSpec) -> SummarizeSpec:
    """A summarize spec that folds every turn into one summary: the summary service's
    (its summarizer, answer budget and single flight) for :func:`fold`'s tasks."""
    return SummarizeSpec(
        trigger_turns=1,
        keep_last_turns=0,
        keep_first_turns=0,
        prefetch=False,
        summarizer=summarizer,
    )


def is_turn(item: Message) -> bool:
    """An item a summary folds in: not a system or developer message, not the proxy's
    summary, not a compaction item or trigger."""
    return recallable(item) and role_of(item) not in SYSTEM_ROLES


def fold(
    items: Sequence[Message],
    summarizer: SummarizerSpec,
    count: CountFn,
    states: Sequence[SummaryState] = (),
) -> Plan:
    """The summary of every turn of ``items``: a task, or the state to reuse (see the
    module docstring). ``states``: summaries covering a prefix of ``items``."""
    n = len(items)
    usable = [s for s in states if s.start_unit == 0 and 0 < s.covers <= n]
    # The newest: covering the most; a stored one (it has an id) over an equal item's.
    previous = max(usable, key=lambda s: (s.covers, s.id is not None), default=None)
    start = previous.covers if previous is not None else 0
    source = tuple(i for i in range(start, n) if is_turn(items[i]))
    if not source:
        return Plan(reused=previous)
    _, answer, fact_tokens = allowance(compaction_spec(summarizer), None)
    empty = count({"content": ""})
    facts = merge(
        previous.facts if previous is not None else (),
        extract(message_text(items[i]) for i in source),
        max_facts=MAX_FACTS,
        max_tokens=fact_tokens,
        count_text=lambda line: count({"content": line}) - empty,
    )
    units = sum(1 for i in source if role_of(items[i]) == "user")
    task = SummaryTask(
        start_unit=0,
        cut_unit=max(1, units),
        start=source[0],
        end=n,
        source=source,
        previous=previous,
        facts=facts,
        max_tokens=answer,
    )
    return Plan(task=task)


def retained(items: Sequence[Message]) -> list[Message]:
    """The user messages of ``items``, in order, as output items: what a compaction
    leaves to the client (an easy input message gets its type and its text part)."""
    out: list[Message] = []
    for item in items:
        if kind_of(item) != "message" or role_of(item) != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        out.append({**item, "type": "message", "content": content})
    return out


def newest_turn(items: Sequence[Message]) -> int:
    """Where the newest turn starts (0 when there is no earlier one to fold)."""
    starts = item_layout(items).starts
    return starts[-1] if starts else 0


def pinned(items: Sequence[Message]) -> list[Message]:
    """The items a fold keeps where they were: system and developer messages."""
    layout = item_layout(items)
    return [items[i] for i in layout.system if kind_of(items[i]) == "message"]

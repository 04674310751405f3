"""Compaction's choices over Responses items: what a summary covers, what stays, what folds away.

A compaction replaces a conversation by a summary of it. The proxy makes that
summary with the summarize machinery (:mod:`policies.summarize`): the spec
here asks it for one summary of every turn, none kept verbatim, so a plan
over the items plus one empty user message (the turn that follows the
compaction) has every real turn to fold in. Client-held pieces:

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

from policies.items import item_layout, kind_of, role_of
from policies.types import Message, SummarizerSpec, SummarizeSpec

# The turn after the compaction: with it last, every real turn may be summarized.
NEXT_TURN: Message = {"role": "user", "content": ""}


def compaction_spec(summarizer: SummarizerSpec) -> SummarizeSpec:
    """A summarize spec that folds every turn into one summary (and reuses one that did)."""
    return SummarizeSpec(
        trigger_turns=1,
        keep_last_turns=0,
        keep_first_turns=0,
        prefetch=False,
        summarizer=summarizer,
    )


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

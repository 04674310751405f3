"""The three context modes as built-in summarize policies, and how a request picks one.

Following the context-mode design, each mode is a budget and a share of it:

- ``concise``: the last 3 to 5 turns verbatim (summarized back to 3 when a
  sixth arrives) and a summary of at most 10% of a 2500-token budget;
- ``balanced`` (the default): the last 8 to 10 turns and an earlier-history
  summary of at most half of a 5000-token budget;
- ``full``: everything, until the conversation passes a 12000-token budget;
  then the middle is summarized (the first turn, the task statement, stays
  verbatim with the newest turns that fit).

Each mode also recalls (policies/recall.py): a share of its budget brings
back the evicted turns the newest message needs, verbatim. The shares are
the knees measured on LoCoMo (bench/recall.py's modes section;
docs/benchmarks/recall.md): past them another tenth of the budget buys little more evidence
and takes it from the verbatim turns. A conversation that fits a mode's
whole budget keeps all of it (the reserve is only taken once the policy
has to drop something: ``Budget.spare``).

A route may let the request choose (the ``X-Context-Mode`` header) and may
switch by rules on the latest user message (a regex for order numbers or
error codes selecting ``full``, say). :func:`select` applies them in that
order: header, first matching rule, the route's own policy.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.transcript import message_text
from policies.types import Message, RecallSpec, SummarizerSpec, SummarizeSpec

# The recall share of each mode's budget (bench/recall.py, modes section).
CONCISE_RECALL = 0.3
BALANCED_RECALL = 0.3
FULL_RECALL = 0.1

CONCISE = SummarizeSpec(
    trigger_turns=5,
    keep_last_turns=3,
    max_tokens=2500,
    summary_share=0.10,
    tool_output_max_tokens=400,
    summarizer=SummarizerSpec(max_tokens=250),
    recall=RecallSpec(share=CONCISE_RECALL),
)
BALANCED = SummarizeSpec(
    trigger_turns=10,
    keep_last_turns=8,
    max_tokens=5000,
    summary_share=0.5,
    tool_output_max_tokens=1000,
    summarizer=SummarizerSpec(max_tokens=600),
    recall=RecallSpec(share=BALANCED_RECALL),
)
FULL = SummarizeSpec(
    keep_last_turns=None,
    keep_first_turns=1,
    max_tokens=12000,
    low_water=0.6,
    summary_share=0.15,
    summarizer=SummarizerSpec(max_tokens=1000),
    recall=RecallSpec(share=FULL_RECALL),
)

MODES: Mapping[str, SummarizeSpec] = {"concise": CONCISE, "balanced": BALANCED, "full": FULL}
DEFAULT_MODE = "balanced"


@dataclass(frozen=True)
class ModeRule:
    """Select ``mode`` when ``pattern`` is found in the latest user message."""

    pattern: re.Pattern[str]
    mode: str
    # Named in X-Context-Mode-Rule when it fires (the config's `name`, else rules[N]).
    name: str = ""


@dataclass(frozen=True)
class ModeChoice:
    # The policy to apply: a mode's name, or the route's own policy.
    policy: str
    # The mode chosen (None: the route's policy is not a mode and nothing chose one).
    mode: str | None
    # What chose it: "header", "rule", or "route".
    by: str
    # The rule that fired (its name), when a rule chose.
    rule: str | None = None


def latest_user_text(messages: Sequence[Message]) -> str:
    """The text of the last user message (empty when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return ""


def select(
    route_policy: str,
    messages: Sequence[Message],
    *,
    requested: str | None = None,
    rules: Sequence[ModeRule] = (),
    modes: Mapping[str, object] = MODES,
) -> ModeChoice:
    """Which mode serves a request: the requested one, a rule's, else the route's policy.

    ``requested`` is the header's value when the route allows it (already
    checked to be a key of ``modes``). Rules are tried in order on the latest
    user message; the first match wins. Without either, the route's policy
    applies, and it is a mode when it names one.
    """
    if requested is not None:
        return ModeChoice(requested, requested, "header")
    if rules:
        text = latest_user_text(messages)
        for i, rule in enumerate(rules):
            if rule.pattern.search(text):
                return ModeChoice(rule.mode, rule.mode, "rule", rule.name or f"rules[{i}]")
    return ModeChoice(route_policy, route_policy if route_policy in modes else None, "route")

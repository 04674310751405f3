"""Observation masking: old tool output replaced by a one-line placeholder, in steps.

Agent loops fill the context with tool results the model has long acted on.
``mask_tool_outputs: {after_turns, min_tokens, step_tokens}`` replaces the
content of each tool result that is at least ``min_tokens`` long and sits in
a turn older than the last ``after_turns`` turns with

    [tool output of 1,284 tokens omitted: <its first line>]

The rules (property tests check each one, tests/policies/test_mask_properties.py):

- Only the ``content`` of ``tool`` messages changes. Every other key (the
  ``tool_call_id`` above all), every other message, the order and the count
  stay exactly as they came: a call and its result are never split, no id
  changes.
- Only results in turns older than the last ``after_turns`` are masked (the
  newest turn never is: ``after_turns >= 1``).
- **Steps, for the prompt cache.** Masking one more result on every turn
  would change the forwarded prefix on every request and lose the
  provider's cache each time. Instead the mask *horizon* (the turns whose
  results are masked) moves in jumps: once the results that became old
  enough but are not masked yet add up to ``step_tokens``, every one of them
  is masked at once. Between two jumps the masked set is the same, so the
  forwarded list of one request is a prefix of the next one's.
- No state: like trimming's hysteresis, the horizon is found by replaying
  the conversation's growth turn by turn with prefix sums (O(turns)), so
  every request of a session computes the horizon the previous one did,
  until the next jump.

Masking is a view: nothing stored changes, and :class:`MaskView.masked`
(``Decision.masked``) says which results were masked, so the proxy can treat
them as evicted (recallable) content.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from policies.types import CountFn, Mask, MaskSpec, Message

PLACEHOLDER = "[tool output of {tokens:,} tokens omitted: {first_line}]"
FIRST_LINE_CHARS = 80


@dataclass(frozen=True)
class MaskView:
    """The conversation as the model will see it: same length, some results masked."""

    messages: list[Message]
    masked: tuple[Mask, ...] = ()
    # Turns whose results are masked: [0, horizon).
    horizon: int = 0

    @property
    def saved(self) -> int:
        return sum(m.tokens_before - m.tokens_after for m in self.masked)


def first_line(content: object) -> str:
    """The first non-blank line of a tool result's text, shortened to a preview."""
    text = ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(
            str(part.get("text"))
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if len(line) > FIRST_LINE_CHARS:
        line = line[: FIRST_LINE_CHARS - 3].rstrip() + "..."
    return line


def placeholder(message: Message, tokens: int) -> dict[str, object]:
    """``message`` with its content replaced by the placeholder; every other key kept."""
    text = PLACEHOLDER.format(tokens=tokens, first_line=first_line(message.get("content")))
    return {**message, "content": text}


def output_placeholder(item: Message, tokens: int) -> dict[str, object]:
    """A Responses tool output item (``function_call_output``, ``custom_tool_call_output``)
    with its ``output`` replaced by the placeholder; its ``call_id`` and every other key kept."""
    text = PLACEHOLDER.format(tokens=tokens, first_line=first_line(item.get("output")))
    return {**item, "output": text}


# How a maskable element becomes its placeholder (chat: content; items: output).
Cover = Callable[[Message, int], dict[str, object]]


def horizon(turn_tokens: Sequence[int], after_turns: int, step_tokens: int) -> int:
    """Turns whose results are masked, replaying the growth one turn at a time.

    ``turn_tokens[k]``: the maskable tokens of turn ``k``. At the request with
    ``t`` turns, turns ``[0, t - after_turns)`` are old enough; the horizon
    jumps to that bound once the old-enough tokens beyond it reach
    ``step_tokens``.
    """
    prefix = [0, *accumulate(turn_tokens)]
    h = 0
    for t in range(1, len(turn_tokens) + 1):
        old = t - after_turns
        if old > h and prefix[old] - prefix[h] >= step_tokens:
            h = old
    return h


def mask_tool_outputs(messages: Sequence[Message], spec: MaskSpec, count: CountFn) -> MaskView:
    """The masked view of chat ``messages`` under ``spec`` (see the module docstring)."""
    roles = [m.get("role") for m in messages]
    users = [i for i, role in enumerate(roles) if role == "user"]
    tools = [i for i, role in enumerate(roles) if role == "tool"]
    return mask_view(messages, users, tools, spec, count, placeholder)


def mask_view(
    messages: Sequence[Message],
    starts: Sequence[int],
    maskable: Sequence[int],
    spec: MaskSpec,
    count: CountFn,
    cover: Cover,
) -> MaskView:
    """The masked view of any list: ``starts`` are where turns begin (ascending),
    ``maskable`` the elements that may be masked, ``cover`` makes a placeholder of one."""
    msgs = list(messages)
    users = list(starts)
    if len(users) <= spec.after_turns:
        return MaskView(msgs)
    # Each candidate: its index, its turn (results before the first turn
    # belong to the oldest turn), its tokens.
    candidates: list[tuple[int, int, int]] = []
    turn_tokens = [0] * len(users)
    for i in maskable:
        tokens = count(msgs[i])
        if tokens < spec.min_tokens:
            continue
        turn = max(0, bisect_right(users, i) - 1)
        candidates.append((i, turn, tokens))
        turn_tokens[turn] += tokens
    h = horizon(turn_tokens, spec.after_turns, spec.step_tokens)
    masks: list[Mask] = []
    for i, turn, tokens in candidates:
        if turn >= h:
            continue
        masked = cover(msgs[i], tokens)
        after = count(masked)
        if after >= tokens:
            continue  # a tiny result: the placeholder would not be shorter
        msgs[i] = masked
        masks.append(Mask(index=i, tokens_before=tokens, tokens_after=after))
    return MaskView(msgs, tuple(masks), h)

"""What a summarizer reads and what the upstream then sees: transcripts and summary messages.

The summarizer gets the turns it folds in as one labelled transcript, roles
kept as labels: a tool call stays "the assistant called X(...)" and its
result "tool result", never a message from the user (the OpenAI cookbook's
SummarizingSession turns tool calls and reasoning into plain user messages,
which makes the model believe the user said them). Tool results are
clipped, head and tail kept: their bulk is data, and the facts in them are
pinned separately from the full text (:mod:`policies.facts`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.facts import Fact, render
from policies.types import Message

# The summary as the upstream sees it (``placement: system`` puts it in a
# system message; ``pair`` in an assistant answer to PAIR_REQUEST).
SUMMARY_HEADER = "Summary of the earlier conversation (its turns are not repeated below):"
PAIR_REQUEST = "Summarize the conversation we had so far."

# Characters of one message in a transcript: tool results are clipped hard
# (their facts are pinned from the full text), other messages loosely.
TOOL_CHARS = 1500
MESSAGE_CHARS = 6000
_CLIP_MARK = " [...] "


def summary_content(text: str, facts: Sequence[Fact]) -> str:
    """The summary message's text: header, the summary, then its pinned facts."""
    block = render(facts)
    body = f"{SUMMARY_HEADER}\n{text.strip()}"
    return f"{body}\n\n{block}" if block else body


def summary_messages(text: str, facts: Sequence[Fact], placement: str) -> list[Message]:
    """The synthetic message(s) that stand for the summarized turns."""
    content = summary_content(text, facts)
    if placement == "pair":
        return [
            {"role": "user", "content": PAIR_REQUEST},
            {"role": "assistant", "content": content},
        ]
    return [{"role": "system", "content": content}]


def message_text(message: Message) -> str:
    """Everything a message says as plain text, unclipped (the facts are found in this)."""
    parts = [_content_text(message.get("content"))]
    for key in ("refusal", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str):
            parts.append(value)
    for call in _calls(message):
        parts.append(f"{call[0]}({call[1]})")
    return "\n".join(p for p in parts if p)


def transcript(messages: Sequence[Message], indexes: Sequence[int]) -> str:
    """The messages at ``indexes`` as a labelled transcript, one block per message."""
    blocks = []
    for i in indexes:
        block = _block(messages[i])
        if block:
            blocks.append(block)
    return "\n\n".join(blocks)


def _block(message: Message) -> str:
    role = message.get("role")
    text = _content_text(message.get("content"))
    if role == "tool" or role == "function":
        name = message.get("name") or message.get("tool_call_id") or "tool"
        return f"[tool result {name}]\n{clip(text, TOOL_CHARS)}"
    label = {"user": "user", "assistant": "assistant"}.get(str(role), str(role))
    lines = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        lines.append(f"[{label} reasoning]\n{clip(reasoning, TOOL_CHARS)}")
    if text:
        lines.append(f"[{label}]\n{clip(text, MESSAGE_CHARS)}")
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        lines.append(f"[{label} refused]\n{clip(refusal, MESSAGE_CHARS)}")
    for name, arguments in _calls(message):
        lines.append(f"[{label} called tool {name}]\n{clip(arguments, TOOL_CHARS)}")
    return "\n".join(lines)


def clip(text: str, limit: int) -> str:
    """At most about ``limit`` characters: the head and the tail, a marker between."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(_CLIP_MARK))
    head = keep - keep // 3
    tail = keep // 3
    return text[:head] + _CLIP_MARK + (text[len(text) - tail :] if tail else "")


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append(part["refusal"])
        elif isinstance(kind, str):
            # Media are not described to the summarizer, only marked.
            out.append(f"[{kind.removeprefix('input_')}]")
    return "\n".join(out)


def _calls(message: Message) -> list[tuple[str, str]]:
    """(name, arguments) of each tool or function call the message makes."""
    calls: list[Any] = []
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        calls += [c.get("function") for c in tool_calls if isinstance(c, Mapping)]
    if isinstance(message.get("function_call"), Mapping):
        calls.append(message["function_call"])
    out = []
    for call in calls:
        if isinstance(call, Mapping):
            arguments = call.get("arguments")
            text = arguments if isinstance(arguments, str) else ""
            out.append((str(call.get("name") or "?"), text))
    return out

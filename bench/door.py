"""The front door a benchmark's conversations come through: ``--door openai|anthropic``.

The benchmarks replay chat conversations through the policies. With
``--door anthropic`` each conversation is first written as an Anthropic
Messages request (``system`` apart, text blocks, ``tool_use`` blocks in the
assistant's message, ``tool_result`` blocks in the next user message, as
Claude Code sends them) and read back by the Messages door's own view
(proxy/messages/view.py), which is what the policies get on ``/v1/messages``.
What a decision forwards is then written back as Anthropic's blocks
(the door's ``anthropic_request``) and checked as Anthropic checks a request:
every ``tool_use`` answered by a ``tool_result`` in the very next user message,
every ``tool_result`` answering a ``tool_use`` of the assistant message before it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from policies.types import Message
from policies.units import find_orphans
from proxy.messages.view import ORIGIN, anthropic_request, chat_view
from proxy.messages.view import system_text as _text

DOORS = ("openai", "anthropic")


def add_door_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--door",
        choices=DOORS,
        default="openai",
        help="the front door the conversations come through (default: openai, chat messages)",
    )


def anthropic_body(conversation: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A chat conversation as an Anthropic Messages request body."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for m in conversation:
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text(m.get("content")))
            continue
        if role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id"),
                "content": _text(m.get("content")),
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "user" and _only_results(last):
                last["content"].append(result)
            else:
                messages.append({"role": "user", "content": [result]})
            continue
        blocks: list[dict[str, Any]] = []
        text = _text(m.get("content"))
        if text:
            blocks.append({"type": "text", "text": text})
        for call in m.get("tool_calls") or ():
            function = call.get("function") or {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {"raw": function.get("arguments")}
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "input": arguments if isinstance(arguments, dict) else {"value": arguments},
                }
            )
        if not blocks:
            blocks.append({"type": "text", "text": ""})
        messages.append({"role": "assistant" if role == "assistant" else "user", "content": blocks})
    body: dict[str, Any] = {"messages": messages}
    if system:
        body["system"] = "\n\n".join(system)
    return body


def _only_results(message: Mapping[str, Any]) -> bool:
    return all(b.get("type") == "tool_result" for b in message["content"])


def through(door: str, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``conversation`` as the policies get it through ``door``."""
    if door == "openai":
        return conversation
    return chat_view(anthropic_body(conversation))


def invalid(door: str, forwarded: Sequence[Message]) -> bool:
    """Whether what a decision forwards is a request the door's upstream would reject."""
    if door == "openai":
        return bool(find_orphans(forwarded))
    system = next((m[ORIGIN]["system"] for m in forwarded if _has_system(m)), None)
    _, messages = anthropic_request(forwarded, system)
    return not anthropic_paired(messages)


def _has_system(m: Message) -> bool:
    origin = m.get(ORIGIN)
    return m.get("role") == "system" and isinstance(origin, Mapping)


def anthropic_paired(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Every tool_use answered in the next user message, every tool_result by the one before."""
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        if message.get("role") == "assistant":
            calls = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
            if not calls:
                continue
            after = messages[i + 1] if i + 1 < len(messages) else None
            answered = _result_ids(after) if after is not None else set()
            if not calls <= answered:
                return False
        else:
            results = _result_ids(message)
            before = messages[i - 1] if i else None
            called = (
                {b.get("id") for b in before["content"] if b.get("type") == "tool_use"}
                if before is not None and isinstance(before.get("content"), list)
                else set()
            )
            if not results <= called:
                return False
    return True


def _result_ids(message: Mapping[str, Any]) -> set[Any]:
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return set()
    return {b.get("tool_use_id") for b in content if b.get("type") == "tool_result"}

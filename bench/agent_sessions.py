"""The sessions bench/agents.py replays: tau-bench airline and the recorded Codex session.

Each is a list of Responses items as a Responses client holds them, the number
of leading items (system, developer, environment) the client keeps across a
compaction, and its planted facts: the item holding each, the question a user
would ask about it, and the words that state it (found only in that item).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.ops.replay import load_file
from tests.agents.session import load as load_recorded
from tests.agents.session import unpack

Item = dict[str, Any]


@dataclass(frozen=True)
class Fact:
    item: int  # the session item that holds it (a tool output)
    question: str
    line: str  # the words that state it, found only in that item


@dataclass(frozen=True)
class Session:
    name: str
    items: list[Item]
    lead: int  # leading items the client keeps across compactions
    facts: list[Fact]
    tools: list[Any] = field(default_factory=list)


PLANTS = [
    ("your hotel booking reference is {code}", "What is my hotel booking reference?"),
    ("the travel desk extension for you is {code}", "What is my travel desk extension?"),
    ("your lounge access PIN is {code}", "What is my lounge access PIN?"),
]


def _code(n: int) -> str:
    return hashlib.blake2b(str(n).encode(), digest_size=4).hexdigest().upper()


def text_item(role: str, text: str) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def tau_items(messages: list[dict[str, Any]]) -> list[Item]:
    """A chat conversation as the Responses items a Responses client would hold.

    tau's logs reuse a call id for a later call; a Responses client never does,
    so each call gets its own (``<id>-<n>``), and its output the call's.
    """
    items: list[Item] = []
    current: dict[str, str] = {}
    for m in messages:
        role, content = m["role"], m.get("content")
        if role == "tool":
            call_id = current.get(m["tool_call_id"], m["tool_call_id"])
            items.append({"type": "function_call_output", "call_id": call_id, "output": content})
            continue
        if isinstance(content, str) and content:
            items.append(text_item("developer" if role == "system" else role, content))
        for call in m.get("tool_calls") or []:
            function = call["function"]
            current[call["id"]] = f"{call['id']}-{len(items)}"
            items.append(
                {
                    "type": "function_call",
                    "call_id": current[call["id"]],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


def tau_sessions(path: Path, limit: int) -> list[Session]:
    sessions = []
    for n, conversation in enumerate(load_file(path)[:limit]):
        items = tau_items(conversation.messages)
        outputs = [i for i, item in enumerate(items) if item["type"] == "function_call_output"]
        if not outputs:
            continue
        statement, question = PLANTS[n % len(PLANTS)]
        code = _code(n)
        first = outputs[0]
        planted = f"{items[first]['output']}\nnote: {statement.format(code=code)}"
        items[first] = {**items[first], "output": planted}
        fact = Fact(first, question, statement.format(code=code))
        sessions.append(Session(f"tau-{n}", items, 1, [fact]))
    return sessions


def codex_session(path: Path) -> Session:
    """The recorded Codex session's whole conversation, before any compaction took it."""
    data = load_recorded(path)
    requests = [body for _, body in unpack(data)]
    items: list[Item] = list(requests[0]["input"])
    seen = {orjson.dumps(i) for i in items}
    for body in requests[1:]:
        for item in body["input"]:
            key = orjson.dumps(item)
            if item["type"] in ("function_call", "function_call_output") and key not in seen:
                seen.add(key)
                items.append(item)
    items.append(text_item("assistant", "Done: every notes file read."))
    facts = []
    for fact in data["facts"]:
        at = next(
            i
            for i, item in enumerate(items)
            if item["type"] == "function_call_output" and fact["line"] in item["output"]
        )
        facts.append(Fact(at, fact["question"], fact["line"]))
    lead = next(i for i, item in enumerate(items) if item.get("role") not in ("developer",))
    return Session("codex", items, lead + 1, facts, data["tools"])

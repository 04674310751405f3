"""A fake Claude model scripting a coding task for the real Claude Code.

Claude Code (tests/agents/claude_code.py) sends its whole conversation on
every request. This model answers by where that conversation stands, not by
counting requests: the turn is the newest user message that is not tool
results (its last text: the prompt ``claude -p`` was given), and the step
within it is how many tool calls the assistant made since. So a request the
script does not foresee (a title or topic request, a sub-agent's, one without
tools) gets a short text of its own and never shifts the script; it is listed
in ``side_requests``.

Each turn's script is its replies in order: tool calls of Claude Code's own
tools (``Read``, ``Edit``: the names and input schemas it declares in its
first request, kept in ``tools_seen``), then the final text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.anthropic import FakeAnthropic, RecordedRequest, Reply


def prompt_of(messages: list[Any]) -> tuple[str | None, int]:
    """The turn's prompt (the last text of the newest user message without tool results)
    and the assistant's tool calls since it."""
    calls = 0
    for message in reversed(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            continue
        kinds = [b.get("type") for b in blocks if isinstance(b, Mapping)]
        if message.get("role") == "assistant":
            calls += kinds.count("tool_use")
        elif message.get("role") == "user" and "tool_result" not in kinds:
            texts = [b.get("text") for b in blocks if isinstance(b, Mapping) and "text" in b]
            return (str(texts[-1]) if texts else None), calls
    return None, calls


@dataclass
class ClaudeTask(FakeAnthropic):
    # Per prompt, the replies of its turn: tool calls, then the final text.
    turns: dict[str, list[Reply]] = field(default_factory=dict)
    tools_seen: dict[str, Any] = field(default_factory=dict)
    # Requests outside the script (answered with SIDE_TEXT).
    side_requests: list[RecordedRequest] = field(default_factory=list)

    def reply_for(self, body: dict[str, Any]) -> Reply:
        if not self.tools_seen:
            self.tools_seen = {str(t.get("name")): t for t in body.get("tools") or []}
        messages = body.get("messages")
        prompt, step = prompt_of(messages if isinstance(messages, list) else [])
        script = self.turns.get(prompt or "")
        if not body.get("tools") or script is None or step >= len(script):
            self.side_requests.append(self.requests[-1])
            return Reply(text=SIDE_TEXT)
        return script[step]

    @property
    def turn_requests(self) -> list[RecordedRequest]:
        """The scripted turns' requests to /v1/messages, in order."""
        side = {id(r) for r in self.side_requests}
        return [r for r in self.requests if r.path == "/v1/messages" and id(r) not in side]


SIDE_TEXT = "Noted."

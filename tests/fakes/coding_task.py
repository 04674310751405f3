"""A fake coding model on the Responses API, scripting a task for a real coding agent.

The agent (the Codex CLI in tests/agents/) sends its whole history every turn,
``store: false``. This model answers each turn request with the next shell
command of its script, as a ``function_call`` of the agent's own shell tool
(``exec_command``, or whichever tool name it is given), and after the last
command with a final message quoting what that command printed, so the agent's
own output shows that the tool's output came back through the proxy.

The script advances one step per turn request the fake receives, not by
counting the outputs in the input: after a compaction the agent's input no
longer holds the earlier rounds. Usage reports about four bytes of input a
token, so an agent's token-based auto-compaction fires as the history grows.

``/v1/chat/completions`` answers the proxy's summarizer calls (from a
FakeUpstream's summary replies), the way a real upstream would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.responses import Call, FakeResponses, RReply
from tests.fakes.upstream import FakeUpstream, Reply


def _output_text(item: dict[str, Any]) -> str:
    """A tool output's text: Codex sends a string; other agents a list of parts."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    return "".join(p.get("text", "") for p in output or [] if isinstance(p, dict))


def printed(item: dict[str, Any]) -> str:
    """What the command printed, from Codex's tool output (its header lines dropped)."""
    text = _output_text(item)
    head, sep, tail = text.partition("Output:\n")
    return (tail if sep else head).strip()


def is_compaction(body: dict[str, Any]) -> bool:
    """A compaction request: Codex's remote compaction v2 ends its input with this item."""
    items = body.get("input")
    return isinstance(items, list) and bool(items) and items[-1].get("type") == "compaction_trigger"


@dataclass
class CodingTask(FakeResponses):
    commands: list[str] = field(default_factory=list)
    tool: str = "exec_command"
    # The summarizer's side of the upstream; its summary replies are scripted there.
    chat: FakeUpstream = field(default_factory=FakeUpstream)
    # The first request's tool names, as the agent declared them.
    tools_seen: list[str] = field(default_factory=list)
    step: int = 0
    # With ``compaction`` set (FakeResponses' switch: it reads compaction items, as
    # OpenAI's API does), a compaction request (last input item
    # ``compaction_trigger``) is answered as OpenAI's server answers it, with one
    # opaque ``compaction`` item: for recording what the agent sends when
    # compaction is relayed. Without it such a request is refused.
    compactions: int = 0

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/chat/completions", self.chat.chat)
        return app

    @property
    def turns(self) -> list[dict[str, Any]]:
        """The JSON body of every POST /v1/responses, in order."""
        return [r.json for r in self.received if r.method == "POST" and isinstance(r.json, dict)]

    def summary(self, text: str) -> None:
        """Script the summarizer's next answer."""
        self.chat.summary_replies.append(Reply(content=text))

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if not self.tools_seen:
            self.tools_seen = [str(t.get("name") or t.get("type")) for t in body.get("tools", [])]
        self.replies = [self._next(body)]
        return await super().create(request)

    def _next(self, body: dict[str, Any]) -> RReply:
        if is_compaction(body):
            return RReply(text=None)
        if self.step < len(self.commands):
            command = self.commands[self.step]
            self.step += 1
            return RReply(text=None, calls=[Call(self.tool, json.dumps({"cmd": command}))])
        self.step += 1
        outputs = [i for i in body.get("input", []) if i.get("type") == "function_call_output"]
        last = printed(outputs[-1]) if outputs else "nothing"
        return RReply(text=f"Done. The last command printed: {last}")

    def _response(
        self, body: dict[str, Any], reply: RReply, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        response = super()._response(body, reply, items)
        if is_compaction(body):
            self.compactions += 1
            n = self.compactions
            response["output"] = [
                {"type": "compaction", "id": f"cmp_{n}", "encrypted_content": f"opaque-{n}"}
            ]
        tokens = len(orjson.dumps(items)) // 4
        usage = response["usage"]
        usage["input_tokens"] = tokens
        usage["total_tokens"] = tokens + usage["output_tokens"]
        return response

"""The real Claude Code runs a two-turn coding task through the proxy.

``claude -p`` (package-lock.json's version; tests/agents/claude_code.py) talks to the
proxy's /v1/messages as its ``ANTHROPIC_BASE_URL``. Behind the proxy a fake model
scripts the task with Claude Code's own tools: the first turn reads a long build
log, the second (``--continue``: the same session) reads calc.py and edits it, and
each ends with a final text, which Claude Code prints. The route's policy trims to a
budget with masking, so the second turn crosses the budget and the first turn's
build log reaches the model masked; the store keeps it whole.

The budget's figures: Claude Code 2.1.332's first request is about 10,900 tokens as the
proxy counts it (its system prompt and environment), the build log about 10,200 and
calc.py about 3,900: the first turn (about 21,100) fits 23,000 and the second (about
25,000) does not, with some 2,000 tokens of room either way.

The same session then runs against an OpenAI-compatible upstream (Claude Code's
``ANTHROPIC_MODEL`` set to its model): the proxy translates it through litellm, and
what reached that upstream is asserted in OpenAI's shape.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.claude_code import locked_version, require_claude, run_claude
from tests.fakes.anthropic import Reply, ToolUse
from tests.fakes.claude_task import ClaudeTask, prompt_of
from tests.fakes.upstream import FakeUpstream
from tests.fakes.upstream import Reply as Chat
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query

CHECK_LOG = "Check build.log for failures."
FIX_ADD = "Fix add in calc.py."
COUNT = "Count the steps, with a helper."
# A line of Claude Code's environment block (a system turn inside messages).
ENVIRONMENT = "Primary working directory:"
LOG_LINES = 600
# The model Claude Code asks for (ANTHROPIC_MODEL) of the OpenAI-compatible upstream.
MODEL = "gpt-4o"
# Trim to a budget; mask tool results of at least 200 tokens in turns before the newest.
POLICY = {
    "strategy": "trim",
    "max_tokens": 23000,
    "low_water": 0.9,
    "mask_tool_outputs": {"after_turns": 1, "min_tokens": 200},
}


def workspace(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    (work / "build.log").write_text(
        "".join(
            f"step {i}: compiled module_{i} in {i % 7}.{i % 10}s ok\n" for i in range(LOG_LINES)
        )
    )
    (work / "calc.py").write_text(
        "def add(a, b):\n    return a - b\n\n\n"
        + "".join(f"def times_{i}(x):\n    return x * {i}\n\n\n" for i in range(200))
    )
    return work


@pytest.fixture
def model(loop_thread: LoopThread, tmp_path: Path) -> Iterator[ClaudeTask]:
    work = tmp_path / "work"
    log, calc = str(work / "build.log"), str(work / "calc.py")
    fake = ClaudeTask(strict=True, count_input=True)
    fake.turns = {
        CHECK_LOG: [
            Reply(text="", tool_use=ToolUse("Read", {"file_path": log}, id="toolu_read_log")),
            Reply(text=f"build.log: {LOG_LINES} steps, no failures."),
        ],
        FIX_ADD: [
            Reply(
                text="",
                thinking=("add subtracts; read calc.py first.", "sig-read-calc"),
                tool_use=ToolUse("Read", {"file_path": calc}, id="toolu_read_calc"),
            ),
            Reply(
                text="",
                tool_use=ToolUse(
                    "Edit",
                    {"file_path": calc, "old_string": "return a - b", "new_string": "return a + b"},
                    id="toolu_edit_calc",
                ),
            ),
            Reply(text="Fixed add in calc.py: it now returns a + b."),
        ],
    }
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())
    assert fake.problems == [], "\n".join(fake.problems)


@pytest.fixture
def start(
    loop_thread: LoopThread, tmp_path: Path
) -> Iterator[Callable[[dict[str, Any]], ProxyServer]]:
    """``start(upstream)``: a proxy whose one route sends /v1/messages to ``upstream``
    under the trim-and-mask policy; no session configuration (it reads Claude Code's)."""
    started: list[ProxyServer] = []

    def start(upstream: dict[str, Any]) -> ProxyServer:
        route = {"match": {"path": "/v1/messages"}, "upstream": "up", "policy": "agent"}
        extra = {"upstreams": {"up": {"timeout_s": 10, **upstream}}}
        config = make_config("", tmp_path, routes=[route], policies={"agent": POLICY}, extra=extra)
        started.append(ProxyServer(loop_thread, config))
        return started[-1]

    yield start
    for proxy in started:
        proxy.stop()


def test_the_installed_claude_code_is_the_locked_version() -> None:
    out = subprocess.run(
        [str(require_claude()), "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[0] == locked_version()


def test_claude_code_reads_and_edits_a_file_through_the_proxy(
    model: ClaudeTask, start: Callable[[dict[str, Any]], ProxyServer], tmp_path: Path
) -> None:
    work = workspace(tmp_path)
    proxy = start({"base_url": f"{model.url}/v1", "api": "anthropic"})
    first = run_claude(tmp_path, proxy.url, CHECK_LOG)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_claude(tmp_path, proxy.url, FIX_ADD, resume=True)
    assert second.returncode == 0, second.stderr[-3000:]

    # What Claude Code printed, and what its tools did: the file is edited on disk.
    assert first.stdout.strip() == f"build.log: {LOG_LINES} steps, no failures."
    assert second.stdout.strip() == "Fixed add in calc.py: it now returns a + b."
    assert (work / "calc.py").read_text().startswith("def add(a, b):\n    return a + b\n")

    # What reached the upstream: one request a step, with Claude Code's own tools.
    assert model.side_requests == []
    sent = [r.json for r in model.turn_requests]
    assert [prompt_of(b["messages"])[0] for b in sent] == [CHECK_LOG] * 2 + [FIX_ADD] * 3
    assert {"Read", "Edit"} <= set(model.tools_seen)
    assert {"old_string", "new_string"} <= set(model.tools_seen["Edit"]["input_schema"]["required"])
    for body in sent:
        check_pairs(body["messages"])
        # Its environment block, a system turn after the first user message, in place.
        assert body["messages"][1]["role"] == "system"
        assert ENVIRONMENT in json.dumps(body["messages"][1]["content"])
    # The build log went whole until the second turn crossed the budget, then masked:
    # its call and result in place, ids unchanged, only the result's content replaced.
    logs = [result(b["messages"], "toolu_read_log") for b in sent[1:]]
    assert [f"step {LOG_LINES - 1}:" in str(r["content"]) for r in logs] == [
        True,
        True,
        False,
        False,
    ]
    assert all(str(r["content"]).startswith("[tool output of") for r in logs[2:])
    # The second turn's thinking block came back with its signature, untouched.
    thinking = {
        "type": "thinking",
        "thinking": "add subtracts; read calc.py first.",
        "signature": "sig-read-calc",
    }
    for body in sent[3:]:
        assert thinking in [
            b for m in body["messages"] if m["role"] == "assistant" for b in m["content"]
        ]
    edited = result(sent[-1]["messages"], "toolu_edit_calc")
    assert not edited.get("is_error")

    # What the proxy stored: one session, Claude Code's session id, a row per request;
    # the build log kept whole (masking is a view).
    proxy.drain()
    session = check_stored(tmp_path)
    assert {r.headers["x-claude-code-session-id"] for r in model.turn_requests} == {session}


def check_stored(tmp: Path) -> str:
    """One session, keyed by Claude Code's session id (the name of its transcript), a row
    per request, the last two masked; the build log stored whole. The session's key."""
    transcripts = list((tmp / "home" / ".claude" / "projects").glob("*/*.jsonl"))
    assert len(transcripts) == 1
    session = transcripts[0].stem
    db = tmp / "ctxproxy.db"
    assert [s["key"] for s in query(db, "SELECT key FROM sessions")] == [session]
    rows = query(
        db,
        "SELECT session_key, endpoint, status, tokens_before, tokens_after FROM requests"
        " ORDER BY created_at",
    )
    assert [(r["session_key"], r["endpoint"], r["status"]) for r in rows] == [
        (session, "/v1/messages", 200)
    ] * 5
    assert [r["tokens_after"] < r["tokens_before"] for r in rows] == [False] * 3 + [True] * 2
    stored = "".join(r[0] for r in query(db, "SELECT message_json FROM items"))
    assert f"step {LOG_LINES - 1}:" in stored
    return session


def blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message["content"]
    return [b for b in content if b.get("type") == kind] if isinstance(content, list) else []


def check_pairs(messages: list[dict[str, Any]]) -> None:
    """Every tool_use is answered in the very next message, and every tool_result answers
    a tool_use of the message right before it: no pair split, none orphaned."""
    for i, message in enumerate(messages):
        calls = {b["id"] for b in blocks(message, "tool_use")}
        after = messages[i + 1] if i + 1 < len(messages) else {"content": []}
        assert calls <= {b["tool_use_id"] for b in blocks(after, "tool_result")}, i
        before = messages[i - 1] if i else {"content": []}
        answered = {b["tool_use_id"] for b in blocks(message, "tool_result")}
        assert answered <= {b["id"] for b in blocks(before, "tool_use")}, i


def result(messages: list[dict[str, Any]], tool_use_id: str) -> dict[str, Any]:
    """The tool_result block answering ``tool_use_id``."""
    return next(
        b
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b.get("tool_use_id") == tool_use_id
    )


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_the_same_session_through_a_translated_openai_compatible_upstream(
    fake: tuple[FakeUpstream, AiohttpServer],
    start: Callable[[dict[str, Any]], ProxyServer],
    tmp_path: Path,
) -> None:
    upstream, server = fake
    work = workspace(tmp_path)
    log, calc = str(work / "build.log"), str(work / "calc.py")
    upstream.replies += [
        Chat(tool_calls=[call("call_read_log", "Read", {"file_path": log})]),
        Chat(content=f"build.log: {LOG_LINES} steps, no failures."),
        Chat(tool_calls=[call("call_read_calc", "Read", {"file_path": calc})]),
        Chat(
            tool_calls=[
                call(
                    "call_edit_calc",
                    "Edit",
                    {"file_path": calc, "old_string": "return a - b", "new_string": "return a + b"},
                )
            ]
        ),
        Chat(content="Fixed add in calc.py: it now returns a + b."),
    ]
    proxy = start({"base_url": f"{server.url}/v1"})
    first = run_claude(tmp_path, proxy.url, CHECK_LOG, model=MODEL)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_claude(tmp_path, proxy.url, FIX_ADD, resume=True, model=MODEL)
    assert second.returncode == 0, second.stderr[-3000:]
    assert first.stdout.strip() == f"build.log: {LOG_LINES} steps, no failures."
    assert second.stdout.strip() == "Fixed add in calc.py: it now returns a + b."
    assert (work / "calc.py").read_text().startswith("def add(a, b):\n    return a + b\n")

    # What reached the upstream: chat completions in OpenAI's shape, Claude Code's tools
    # as functions, its tool_use/tool_result blocks as tool calls and tool messages.
    sent = [r.json for r in upstream.chat_requests]
    assert [r.path for r in upstream.chat_requests] == ["/v1/chat/completions"] * 5
    assert all(b["model"] == MODEL and b["stream"] is True for b in sent)
    functions = {t["function"]["name"]: t["function"] for t in sent[0]["tools"]}
    assert {"Read", "Edit"} <= set(functions)
    assert "old_string" in functions["Edit"]["parameters"]["required"]
    for body in sent:
        check_openai_pairs(body["messages"])
        kinds = {
            p.get("type")
            for m in body["messages"]
            if isinstance(m.get("content"), list)
            for p in m["content"]
        }
        assert not kinds & {"tool_use", "tool_result", "thinking"}
        # The environment system turn reached it once (litellm makes it a user message).
        env = [m["role"] for m in body["messages"] if ENVIRONMENT in json.dumps(m)]
        assert env == ["user"]
    # The build log whole until the second turn crossed the budget, then masked.
    logs = [tool_message(b["messages"], "call_read_log")["content"] for b in sent[1:]]
    assert [f"step {LOG_LINES - 1}:" in str(c) for c in logs] == [True, True, False, False]
    assert all(str(c).startswith("[tool output of") for c in logs[2:])
    assert "updated" in str(tool_message(sent[-1]["messages"], "call_edit_calc")["content"])

    # Stored: one session, Claude Code's own (its transcript is named by it).
    proxy.drain()
    check_stored(tmp_path)


def test_a_sub_agent_is_kept_apart_from_its_parent_session(
    loop_thread: LoopThread, start: Callable[[dict[str, Any]], ProxyServer], tmp_path: Path
) -> None:
    helper = "Count the steps in build.log."
    fake = ClaudeTask(strict=True, count_input=True)
    agent = {"description": "Count log steps", "prompt": helper, "run_in_background": False}
    fake.turns = {
        COUNT: [
            Reply(text="", tool_use=ToolUse("Agent", agent, id="toolu_agent")),
            Reply(text="The helper counted 600 steps."),
        ],
        helper: [Reply(text="600 steps.")],
    }
    loop_thread.run(fake.start())
    try:
        proxy = start({"base_url": f"{fake.url}/v1", "api": "anthropic"})
        run = run_claude(tmp_path, proxy.url, COUNT, tools=("Read", "Agent"))
    finally:
        loop_thread.run(fake.stop())
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "The helper counted 600 steps."
    assert fake.problems == [] and fake.side_requests == []

    # The sub-agent's request: its own task, its parent's session id and its agent id.
    parent, child, last = fake.requests
    assert [prompt_of(r.json["messages"])[0] for r in fake.requests] == [COUNT, helper, COUNT]
    session = parent.headers["x-claude-code-session-id"]
    assert child.headers["x-claude-code-session-id"] == session
    agent_id = child.headers["x-claude-code-agent-id"]
    assert "x-claude-code-agent-id" not in parent.headers | last.headers
    # Stored as two sessions: the sub-agent's history never joins its parent's turns.
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    sub = f"{session}/agent/{agent_id}"
    rows = query(db, "SELECT session_key FROM requests ORDER BY created_at")
    assert [r["session_key"] for r in rows] == [session, sub, session]
    text = {
        key: "".join(
            r[0]
            for r in query(
                db,
                "SELECT message_json FROM items JOIN sessions ON sessions.id = items.session_id"
                " WHERE sessions.key = ?",
                key,
            )
        )
        for key in (session, sub)
    }
    assert COUNT in text[session] and COUNT not in text[sub]
    assert helper in text[sub] and "toolu_agent" not in text[sub]


def check_openai_pairs(messages: list[dict[str, Any]]) -> None:
    """Each assistant's tool calls are answered by the tool messages right after it."""
    for i, message in enumerate(messages):
        calls = [c["id"] for c in message.get("tool_calls") or []]
        answers = [m.get("tool_call_id") for m in messages[i + 1 : i + 1 + len(calls)]]
        assert answers == calls, i
        if message["role"] == "tool":
            before = messages[i - 1]
            assert before["role"] == "tool" or before.get("tool_calls"), i


def tool_message(messages: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    return next(m for m in messages if m.get("tool_call_id") == call_id)

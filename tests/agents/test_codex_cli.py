"""The real Codex CLI runs a multi-turn coding task through the proxy.

``codex exec`` (package-lock.json's version) talks to the proxy as its
``model_provider``; behind the proxy a fake model (tests/fakes/coding_task.py)
scripts the task as calls of Codex's own shell tool, which Codex runs in a
temporary folder, then a final message quoting the last command's output.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.codex import locked_version, require_codex, run_codex
from tests.fakes.coding_task import CodingTask
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query

WRITE_FIB = (
    "printf 'def fib(n):\\n    a, b = 0, 1\\n    for _ in range(n):\\n"
    "        a, b = b, a + b\\n    return a\\n\\nprint(fib(20))\\n' > fib.py"
)
COMMANDS = [WRITE_FIB, "python3 fib.py", "wc -l < fib.py && python3 fib.py"]
PROMPT = "Write fib.py printing fib(20), run it, and tell me what it printed."


@pytest.fixture
def task(loop_thread: LoopThread) -> Iterator[tuple[CodingTask, AiohttpServer]]:
    fake = CodingTask(commands=list(COMMANDS))
    server = AiohttpServer(loop_thread, fake.app())
    yield fake, server
    server.stop()


@pytest.fixture
def proxy(
    loop_thread: LoopThread, task: tuple[CodingTask, AiohttpServer], tmp_path: Path
) -> Iterator[ProxyServer]:
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default"}]
    # No session configuration: the proxy reads Codex's own session-id header.
    server = ProxyServer(loop_thread, make_config(task[1].url, tmp_path, routes=routes))
    yield server
    server.stop()


def kinds(body: dict[str, Any]) -> list[str]:
    return [str(i.get("type", "message")) for i in body["input"]]


def test_the_installed_codex_is_the_locked_version() -> None:
    out = subprocess.run(
        [str(require_codex()), "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["codex-cli", locked_version()]


def test_codex_exec_runs_a_tool_using_task_through_the_proxy(
    task: tuple[CodingTask, AiohttpServer], proxy: ProxyServer, tmp_path: Path
) -> None:
    fake, _ = task
    run = run_codex(tmp_path, proxy.url, PROMPT)
    assert run.returncode == 0, run.stderr[-3000:]

    # Codex ran every command the model asked for, in its work folder, and
    # printed the final message, which quotes what the last command printed.
    assert (tmp_path / "work" / "fib.py").exists()
    assert run.stdout.strip() == "Done. The last command printed: 7\n6765"
    assert "exec_command" in fake.tools_seen

    # What reached the upstream: one request a step, Codex's own shape (its whole
    # history, store false), each growing by the previous call and its output.
    turns = fake.turns
    assert len(turns) == len(COMMANDS) + 1
    assert all(t["store"] is False and t["stream"] is True for t in turns)
    for before, after in itertools.pairwise(turns):
        assert after["input"][: len(before["input"])] == before["input"]
        assert kinds(after)[len(before["input"]) :] == ["function_call", "function_call_output"]
    outputs = [i for i in turns[-1]["input"] if i.get("type") == "function_call_output"]
    assert "6765" in outputs[1]["output"] and "7\n6765" in outputs[2]["output"]
    assert [i["call_id"] for i in outputs] == [
        i["call_id"] for i in turns[-1]["input"] if i.get("type") == "function_call"
    ]

    # What the proxy stored: one session for Codex's thread, a row per request.
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    thread = fake.received[0].headers["thread-id"]
    assert [s["key"] for s in query(db, "SELECT key FROM sessions")] == [thread]
    rows = query(
        db, "SELECT session_key, endpoint, status, stream FROM requests ORDER BY created_at"
    )
    assert [tuple(r) for r in rows] == [(thread, "/v1/responses", 200, 1)] * len(turns)
    roles = [r["role"] for r in query(db, "SELECT role FROM items ORDER BY id")]
    assert roles.count("function_call") == roles.count("function_call_output") == len(COMMANDS)
    assert roles[-1] == "assistant"
    stored = json.loads(query(db, "SELECT message_json FROM items ORDER BY id")[-1][0])
    assert "6765" in json.dumps(stored)

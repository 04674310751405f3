"""The real Claude Code (npm ``@anthropic-ai/claude-code``, pinned in package-lock.json)
as the tests run it.

``claude -p PROMPT`` (print mode: one turn, its final text on stdout) runs in a
temporary work folder with ``ANTHROPIC_BASE_URL`` pointing at the proxy, a
dummy ``ANTHROPIC_API_KEY``, its home and config folder temporary, and
telemetry, error reporting, the auto-updater and every other non-essential
request off. Its environment holds nothing of the caller's but PATH.

Tools run without asking through ``--permission-mode acceptEdits`` and
``--allowedTools Read Edit``: ``bypassPermissions`` (and
``--dangerously-skip-permissions``) are refused when run as root, as CI often
is, while these work for any user.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agents.process import AgentRun, run_agent

REPO = Path(__file__).resolve().parents[2]
CLAUDE = REPO / "node_modules" / ".bin" / "claude"
API_KEY = "sk-ant-claude-code-test"
TOOLS = ("Read", "Edit")


def locked_version() -> str:
    lock = json.loads((REPO / "package-lock.json").read_text())
    return str(lock["packages"]["node_modules/@anthropic-ai/claude-code"]["version"])


def require_claude() -> Path:
    """The installed binary; fails (it is a test dependency, not optional) saying how to install it."""
    if not CLAUDE.exists():
        pytest.fail(f"Claude Code is not installed at {CLAUDE}: run `make node` (npm ci)")
    return CLAUDE


def run_claude(
    tmp: Path,
    proxy_url: str,
    prompt: str,
    *,
    resume: bool = False,
    model: str | None = None,
    tools: tuple[str, ...] = TOOLS,
    timeout: float = 120,
) -> AgentRun:
    """``claude -p PROMPT`` in ``tmp/work`` with its home in ``tmp/home``.

    ``resume``: ``--continue``, the folder's latest conversation's next turn (the same
    session id). ``model``: ``ANTHROPIC_MODEL`` (its own default model otherwise).
    ``tools``: the tools it may use without asking (``Agent``: it may start sub-agents).
    """
    claude = require_claude()
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": proxy_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "NO_COLOR": "1",
    }
    if model is not None:
        env["ANTHROPIC_MODEL"] = model
    args = ["-p", prompt, "--permission-mode", "acceptEdits", "--allowedTools", *tools]
    if resume:
        args.append("--continue")
    return run_agent([str(claude), *args], work, env, timeout)

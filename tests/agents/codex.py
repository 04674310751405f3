"""The real Codex CLI (npm ``@openai/codex``, pinned in package-lock.json) as the tests run it.

``codex exec`` runs non-interactively in a temporary HOME whose config.toml
points a ``model_provider`` at the proxy (``wire_api = "responses"``, named
"OpenAI" as remote compaction requires), with commands run without approval or
sandbox in a temporary work folder, and analytics, OpenTelemetry export and
update checks off. Its environment holds nothing of the caller's but PATH.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agents.process import AgentRun, run_agent

REPO = Path(__file__).resolve().parents[2]
CODEX = REPO / "node_modules" / ".bin" / "codex"
API_KEY = "sk-codex-test"


def locked_version() -> str:
    lock = json.loads((REPO / "package-lock.json").read_text())
    return str(lock["packages"]["node_modules/@openai/codex"]["version"])


def require_codex() -> Path:
    """The installed binary; fails (it is a test dependency, not optional) saying how to install it."""
    if not CODEX.exists():
        pytest.fail(f"the Codex CLI is not installed at {CODEX}: run `make node` (npm ci)")
    return CODEX


def config_toml(proxy_url: str, *, auto_compact_tokens: int | None = None) -> str:
    lines = [
        'model = "gpt-5.1-codex"',
        'model_provider = "ctxproxy"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "check_for_update_on_startup = false",
    ]
    if auto_compact_tokens is not None:
        lines.append(f"model_auto_compact_token_limit = {auto_compact_tokens}")
    lines += [
        "",
        "[model_providers.ctxproxy]",
        'name = "OpenAI"',
        f'base_url = "{proxy_url}/v1"',
        'wire_api = "responses"',
        'env_key = "CTXPROXY_API_KEY"',
        "",
        # Nothing beyond 127.0.0.1: no plugin catalog sync (github.com, chatgpt.com),
        # no connector apps, no update check, no analytics or OpenTelemetry export.
        "[features]",
        "plugins = false",
        "remote_plugin = false",
        "apps = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[otel]",
        'exporter = "none"',
    ]
    return "\n".join(lines) + "\n"


def run_codex(
    tmp: Path,
    proxy_url: str,
    prompt: str,
    *,
    auto_compact_tokens: int | None = None,
    resume: bool = False,
    timeout: float = 120,
) -> AgentRun:
    """``codex exec PROMPT`` in ``tmp/work`` with its home in ``tmp/home``.

    ``resume``: ``codex exec resume --last PROMPT``, the same thread's next turn.
    """
    codex = require_codex()
    home = tmp / "home"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        config_toml(proxy_url, auto_compact_tokens=auto_compact_tokens)
    )
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "CTXPROXY_API_KEY": API_KEY,
        "NO_COLOR": "1",
    }
    if resume:
        args = ["exec", "resume", "--last", "--skip-git-repo-check", prompt]
    else:
        args = ["exec", "--skip-git-repo-check", "--color", "never", "-C", str(work), prompt]
    return run_agent([str(codex), *args], work, env, timeout)

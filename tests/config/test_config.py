"""Config: parsed once into typed objects; every error names the path and the bad value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.types import NoneSpec, TrimSpec
from proxy.config.loader import load_config, parse_config
from proxy.config.model import AgentSessions
from proxy.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "upstreams": {"default": {"base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"match": {"path": "/v1/chat/completions"}, "upstream": "default"}],
        "policies": {"last3": {"strategy": "trim", "max_turns": 3}},
    }
    data.update(over)
    return data


def test_example_config_loads_without_any_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = load_config(REPO / "config.example.yaml")
    assert config.upstreams["openai"].api_key is None
    assert config.store.path == str(REPO / "data" / "ctxproxy.db")  # the file's folder, not the cwd
    assert isinstance(config.policies["passthrough"], NoneSpec)
    assert config.policies["fit"] == TrimSpec(
        max_tokens=6000, context_fraction=0.75, low_water=0.7, tool_output_max_tokens=1500
    )
    assert config.server.port == 8080


def test_contract_example_from_the_issue_parses():
    text = """
session:
  header: X-Session-Id
store:
  path: ./data/ctxproxy.db
upstreams:
  default:
    base_url: https://api.openai.com/v1
    timeout_s: 600
routes:
  - match: {path: /v1/chat/completions, model: "gpt-4o*"}
    upstream: default
    policy: passthrough
policies:
  passthrough: {strategy: none}
"""
    config = parse_config(yaml.safe_load(text))
    assert config.routes[0].match.model == "gpt-4o*"
    assert config.upstreams["default"].timeout_s == 600


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (base(extra=1), "extra: unknown key"),
        (base(policies={"p": {"strategy": "trim", "max_turns": -1}}), "policies.p.max_turns: must be >= 1, got -1"),
        (base(policies={"p": {"strategy": "trim", "max_turns": "3"}}), "policies.p.max_turns: must be an integer, got '3'"),
        (base(policies={"p": {"strategy": "trim", "low_water": 1.5, "max_tokens": 10}}), "policies.p.low_water: must be > 0.0 and <= 1.0, got 1.5"),
        (base(policies={"p": {"strategy": "trim", "max_turn": 3}}), "policies.p.max_turn: unknown key"),
        (base(policies={"p": {"strategy": "magic"}}), "policies.p.strategy: must be one of"),
        (base(policies={"p": {"strategy": "trim"}}), "policies.p: a trim policy needs"),
        (base(routes=[{"upstream": "nope"}]), "routes[0].upstream: names no configured upstream: 'nope'"),
        (base(routes=[{"upstream": "default", "policy": "ghost"}]), "routes[0].policy: names no configured policy: 'ghost'"),
        (base(routes=[{"upstream": "default", "history": "both"}]), "routes[0].history: must be client or server, got 'both'"),
        (base(routes=[{"upstream": "default", "match": {"modle": "x"}}]), "routes[0].match.modle: unknown key"),
        (base(routes=[]), "routes: must be a non-empty list"),
        (base(upstreams={"u": {"base_url": "ftp://x"}}), "upstreams.u.base_url: must be an http(s) URL"),
        (base(upstreams={"u": {}}), "upstreams.u: needs exactly one of base_url or litellm_model"),
        (base(upstreams={"default": {"base_url": "http://x", "timeout_s": "slow"}}), "upstreams.default.timeout_s: must be a number, got 'slow'"),
        (base(upstreams={"default": {"base_url": "http://x", "api_key": "os.environ/CTX_SURELY_UNSET"}}), "upstreams.default.api_key: environment variable CTX_SURELY_UNSET is not set"),
        (base(session={"header": 5}), "session.header: must be a string, got 5"),
        (base(session={"fallbacks": ["body.nope"]}), "session.fallbacks[0]: must be"),
        (base(session={"agents": {"codex": "yes"}}), "session.agents.codex: must be true or false, got 'yes'"),
        (base(session={"agents": {"cursor": True}}), "session.agents.cursor: unknown key"),
        (base(session={"agents": 5}), "session.agents: must be a mapping or true/false, got 5"),
        (base(server={"port": 0}), "server.port: must be >= 1, got 0"),
        (base(logging={"level": "loud"}), "logging.level: must be"),
        ([1, 2], "must be a mapping"),
    ],
)  # fmt: skip
def test_bad_config_names_the_path_and_value(data, message):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_env_reference_is_resolved(monkeypatch):
    monkeypatch.setenv("CTX_TEST_UPSTREAM_KEY", "sk-env")
    config = parse_config(
        base(
            upstreams={
                "default": {"base_url": "http://x", "api_key": "os.environ/CTX_TEST_UPSTREAM_KEY"}
            }
        )
    )
    assert config.upstreams["default"].api_key == "sk-env"
    assert "sk-env" not in repr(config.upstreams["default"])


def test_check_command_accepts_the_example_and_rejects_a_bad_file(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--config", str(REPO / "config.example.yaml")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(base(policies={"support": {"strategy": "trim", "max_turns": -1}}))
    )
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--config", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode != 0
    assert "policies.support.max_turns: must be >= 1, got -1" in out.stderr


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def test_agent_sessions_are_on_by_default_and_each_switches_off():
    assert parse_config(base()).session.agents == AgentSessions()
    one_off = parse_config(base(session={"agents": {"claude_code": False}})).session.agents
    assert one_off == AgentSessions(codex=True, claude_code=False, prompt_cache_key=True)
    none = parse_config(base(session={"agents": False})).session.agents
    assert none == AgentSessions(codex=False, claude_code=False, prompt_cache_key=False)

"""A config says what is wrong, all at once: every problem named by its path and bad value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.config.loader import load_config, parse_config
from proxy.errors import ConfigError, ConfigErrors

REPO = Path(__file__).resolve().parents[2]


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "upstreams": {"default": {"base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"match": {"path": "/v1/chat/completions"}, "upstream": "default"}],
        "policies": {"last3": {"strategy": "trim", "max_turns": 3}},
    }
    data.update(over)
    return data


def errors_of(data: Any) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        parse_config(data)
    return [str(e) for e in info.value.errors]


def test_every_problem_of_a_file_is_reported_at_once():
    errors = errors_of(
        base(
            server={"port": 99999, "max_body_bytes": "big"},
            upstreams={
                "default": {"base_url": "ftp://x"},
                "b": {"base_url": "http://x", "timeout_s": -1},
            },
            policies={"p": {"strategy": "trim", "max_turns": 0}, "q": {"strategy": "magic"}},
            routes=[{"upstream": "nope"}, {"upstream": "default", "history": "both"}],
            logging={"level": "loud"},
            extra=1,
        )
    )
    assert errors[0].startswith("extra: unknown key (allowed: admin, ")
    assert errors[1:] == [
        "upstreams.default.base_url: must be an http(s) URL, got 'ftp://x'",
        "upstreams.b.timeout_s: must be > 0.0, got -1",
        "policies.p.max_turns: must be >= 1, got 0",
        "policies.q.strategy: must be one of none, trim, summarize; got 'magic'",
        "routes[0].upstream: names no configured upstream: 'nope'",
        "routes[1].history: must be client or server, got 'both'",
        "logging.level: must be debug, info, warning or error, got 'loud'",
        "server.port: must be <= 65535, got 99999",
        "server.max_body_bytes: must be an integer, got 'big'",
    ]


def test_the_message_lists_each_problem_on_its_own_line():
    with pytest.raises(ConfigError) as info:
        parse_config(base(server={"port": 0, "host": 5}))
    assert str(info.value) == (
        "2 problems:\n  server.host: must be a string, got 5\n  server.port: must be >= 1, got 0"
    )


def test_one_problem_reads_as_that_problem_alone():
    with pytest.raises(ConfigError) as info:
        parse_config(base(server={"port": 70000}))
    assert str(info.value) == "server.port: must be <= 65535, got 70000"


def test_a_follow_on_complaint_is_not_reported_twice():
    # max_turns is bad, so the trim policy has no limit left: one problem, not two.
    errors = errors_of(base(policies={"p": {"strategy": "trim", "max_turns": "3"}}))
    assert errors == ["policies.p.max_turns: must be an integer, got '3'"]
    # A reference to an upstream that has its own problem is not a second problem.
    errors = errors_of(base(upstreams={"default": {"base_url": "ftp://x"}}))
    assert errors == ["upstreams.default.base_url: must be an http(s) URL, got 'ftp://x'"]


def test_every_unknown_key_is_named():
    errors = errors_of(base(server={"prot": 1, "hots": "x"}))
    assert [e.split(":")[0] for e in errors] == ["server.hots", "server.prot"]


@pytest.mark.parametrize(
    ("port", "ok"), [(1, True), (65535, True), (0, False), (65536, False), (99999, False)]
)
def test_port_range_is_validated(port, ok):
    if ok:
        assert parse_config(base(server={"port": port})).server.port == port
    else:
        with pytest.raises(ConfigError, match=r"^server\.port: must be"):
            parse_config(base(server={"port": port}))


def test_duplicate_yaml_keys_are_rejected_with_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstreams:\n"
        "  default: {base_url: 'http://127.0.0.1:9/v1'}\n"
        "routes:\n"
        "  - upstream: default\n"
        "    policy: passthrough\n"
        "    policy: last3\n"
        "policies:\n"
        "  last3: {strategy: trim, max_turns: 3}\n"
        "server: {port: 8080}\n"
        "server: {port: 8081}\n"
        "logging: {level: loud}\n"
    )
    with pytest.raises(ConfigErrors) as info:
        load_config(path)
    assert [str(e) for e in info.value.errors] == [
        "routes[0].policy: duplicate key (line 6; first written on line 5)",
        "server: duplicate key (line 10; first written on line 9)",
        # ... and the rest of the file is still checked.
        "logging.level: must be debug, info, warning or error, got 'loud'",
    ]


def test_env_references_resolve_in_every_string_value(monkeypatch):
    monkeypatch.setenv("CTX_TEST_ORG", "org-123")
    monkeypatch.setenv("CTX_TEST_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CTX_TEST_PORT", "9090")
    monkeypatch.setenv("CTX_TEST_HEADER", "X-Tenant-Session")
    config = parse_config(
        base(
            upstreams={
                "default": {
                    "base_url": "os.environ/CTX_TEST_BASE",
                    "headers": {"OpenAI-Organization": "os.environ/CTX_TEST_ORG"},
                }
            },
            server={"port": "os.environ/CTX_TEST_PORT"},
            session={"header": "os.environ/CTX_TEST_HEADER"},
        )
    )
    assert config.upstreams["default"].base_url == "http://127.0.0.1:9/v1"
    assert config.upstreams["default"].headers == {"OpenAI-Organization": "org-123"}
    assert config.server.port == 9090
    assert config.session.header == "X-Tenant-Session"


def test_unset_env_references_are_each_named(monkeypatch):
    monkeypatch.delenv("CTX_NOPE_A", raising=False)
    monkeypatch.delenv("CTX_NOPE_B", raising=False)
    errors = errors_of(
        base(
            upstreams={
                "default": {
                    "base_url": "os.environ/CTX_NOPE_A",
                    "headers": {"X-Org": "os.environ/CTX_NOPE_B"},
                }
            }
        )
    )
    assert errors == [
        "upstreams.default.base_url: environment variable CTX_NOPE_A is not set",
        "upstreams.default.headers.X-Org: environment variable CTX_NOPE_B is not set",
    ]


def test_relative_paths_are_taken_from_the_config_files_folder(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "prompts").mkdir(parents=True)
    (conf / "prompts" / "p.md").write_text("Summarize.")
    (conf / "c.yaml").write_text(
        "upstreams: {default: {base_url: 'http://127.0.0.1:9/v1'}}\n"
        "routes: [{upstream: default, policy: s}]\n"
        "store: {path: db/ctx.db}\n"
        "policies:\n"
        "  s: {strategy: summarize, trigger: {turns: 4}, summarizer: {prompt_file: prompts/p.md}}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config("../conf/c.yaml")
    assert config.store.path == str(conf / "db" / "ctx.db")
    assert config.policies["s"].summarizer.prompt == "Summarize."  # type: ignore[union-attr]


def test_default_store_path_is_also_the_config_files(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "upstreams: {default: {base_url: 'http://127.0.0.1:9/v1'}}\nroutes: [{upstream: default}]\n"
    )
    assert load_config(tmp_path / "c.yaml").store.path == str(tmp_path / "data" / "ctxproxy.db")


def test_check_prints_every_problem_and_exits_non_zero(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "upstreams: {default: {base_url: 'http://127.0.0.1:9/v1', timeout_s: slow}}\n"
        "routes: [{upstream: default, policy: ghost}]\n"
        "server: {port: 99999}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--config", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"config error: {bad}: 3 problems",
        "  upstreams.default.timeout_s: must be a number, got 'slow'",
        "  routes[0].policy: names no configured policy: 'ghost'",
        "  server.port: must be <= 65535, got 99999",
    ]

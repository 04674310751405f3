"""`python -m proxy sessions ...` over the proxy's store, and `python -m proxy replay`."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml

from proxy import cli
from proxy.__main__ import main as proxy_main
from proxy.replay import conversations_from, replay
from proxy.rewriter import Rewriter
from proxy.sessions import tenant_of
from tests.harness import query
from tests.shared_data import shared_file

ADMIN_KEY = "adm-cli"
TRIM = {
    "policies": {"last1": {"strategy": "trim", "max_turns": 1}},
    "routes": [
        {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "last1"}
    ],
}


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def talk(proxy: Any, session: str, turns: int) -> None:
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-cli",
        max_retries=0,
        default_headers={"X-Session-Id": session},
    )
    messages: list[Any] = [{"role": "system", "content": "be brief"}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"{session} question {t}"})
        reply = c.chat.completions.create(model="gpt-4o", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    proxy.drain()


@pytest.fixture
def populated(start_proxy, monkeypatch):
    monkeypatch.setenv("CTX_ADMIN_KEY", ADMIN_KEY)
    proxy = start_proxy(extra={"admin": {"api_key": "os.environ/CTX_ADMIN_KEY"}}, **TRIM)
    for n, session in enumerate(("alpha", "beta", "gamma")):
        talk(proxy, session, n + 1)
    return proxy, str(proxy.config.store.path)


def admin(proxy: Any, path: str) -> Any:
    r = httpx.get(f"{proxy.url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200
    return r.json() if "export" not in path else r.content


def test_sessions_list_shows_newest_first_with_paging(populated):
    proxy, db = populated
    code, out, _ = run("sessions", "list", "--db", db)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["last", "activity", "tenant", "session"]
    keys = [line.split()[2] for line in lines[1:4]]
    assert keys == ["gamma", "beta", "alpha"]
    assert lines[1].split()[1] == tenant_of("sk-cli")
    assert lines[1].split()[3:5] == ["3", "7"]  # turns, messages
    code, out, _ = run("sessions", "list", "--db", db, "--limit", "1", "--offset", "1", "--json")
    page = json.loads(out)
    assert [s["key"] for s in page["data"]] == ["beta"] and page["has_more"] is True
    assert page == admin(proxy, "/admin/sessions?limit=1&offset=1")


def test_sessions_show_prints_history_and_each_requests_decision(populated):
    proxy, db = populated
    tenant = tenant_of("sk-cli")
    code, out, _ = run("sessions", "show", tenant, "gamma", "--db", db)
    assert code == 0
    assert "3 turns, 7 messages, 3 requests" in out
    assert "gamma question 0" in out and "echo: gamma question 2" in out
    assert out.count("max_turns") == 2  # requests 2 and 3 dropped older turns
    assert "summaries: none" in out
    code, out, _ = run("sessions", "show", tenant, "gamma", "--db", db, "--json")
    shown = json.loads(out)
    api = admin(proxy, f"/admin/sessions/{tenant}/gamma")
    assert shown == {**api, "calibration": []}


def test_sessions_work_from_the_config_file_too(populated, tmp_path):
    _, db = populated
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "store": {"path": db},
                "upstreams": {"d": {"base_url": "http://127.0.0.1:9/v1"}},
                "routes": [{"upstream": "d"}],
            }
        )
    )
    code, out, _ = run("sessions", "list", "--config", str(config))
    assert code == 0 and "alpha" in out
    code, _, err = run("sessions", "list", "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "config error" in err


def test_sessions_delete_removes_every_row_of_the_session(populated):
    _, db = populated
    tenant = tenant_of("sk-cli")
    code, out, _ = run("sessions", "delete", tenant, "beta", "--db", db)
    assert (code, out.strip()) == (0, f"deleted session 'beta' of tenant {tenant}")
    assert sorted(r["key"] for r in query(Path(db), "SELECT key FROM sessions")) == [
        "alpha",
        "gamma",
    ]
    assert query(Path(db), "SELECT COUNT(*) FROM requests WHERE session_key = 'beta'")[0][0] == 0
    assert query(Path(db), "SELECT COUNT(*) FROM items")[0][0] == 3 + 7
    code, _, err = run("sessions", "delete", tenant, "beta", "--db", db)
    assert code == 1 and "no session 'beta'" in err
    code, _, err = run("sessions", "show", tenant, "beta", "--db", db)
    assert code == 1 and "no session" in err


def test_sessions_export_writes_the_admin_apis_json_lines(populated, tmp_path):
    proxy, db = populated
    tenant = tenant_of("sk-cli")
    target = tmp_path / "alpha.jsonl"
    assert run("sessions", "export", tenant, "alpha", "--db", db, "-o", str(target))[0] == 0
    assert target.read_bytes() == admin(proxy, f"/admin/sessions/{tenant}/alpha/export")
    code, out, _ = run("sessions", "export", tenant, "alpha", "--db", db)
    assert code == 0 and out.encode() == target.read_bytes()
    # And an export replays like any conversation.
    code, out, _ = run(
        "replay", str(target), "--config", str(write_config(tmp_path)), "--policy", "last1"
    )
    assert code == 0 and out.startswith("# alpha (1/1): 3 messages")


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "replay.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "store": {"path": str(tmp_path / "unused.db")},
                "upstreams": {"d": {"base_url": "http://127.0.0.1:9/v1"}},
                "routes": [{"upstream": "d", "policy": "last1"}],
                "policies": {
                    "last1": {"strategy": "trim", "max_turns": 1},
                    "fit": {"strategy": "trim", "max_tokens": 1500, "tool_output_max_tokens": 200},
                },
            }
        )
    )
    return path


CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "1"},
    {"role": "user", "content": "two"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "three"},
]


def test_replay_prints_one_row_per_turn(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT))
    code, out, err = run(
        "replay", str(chat), "--config", str(write_config(tmp_path)), "--policy", "last1"
    )
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "# chat (1/1): 6 messages, policy last1, model gpt-4o"
    assert lines[1].split()[:3] == ["turn", "msgs", "sent"]
    rows = [line.split() for line in lines[2:5]]
    # turn, messages before, sent, ..., turns dropped, clipped, summary, prefix, stable, reason
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "2", "2"), ("2", "4", "2"), ("3", "6", "2")]
    assert [r[6] for r in rows] == ["0", "1", "2"]
    assert [r[9:] for r in rows] == [
        ["-", "-"],
        ["1/2", "yes", "max_turns"],
        ["1/2", "yes", "max_turns"],
    ]
    assert lines[5].startswith("3 turns, 0 refused; tokens sent")


def test_replay_jsonl_matches_the_rewriters_decisions(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT))
    config = write_config(tmp_path)
    code, out, _ = run("replay", str(chat), "--config", str(config), "--policy", "last1", "--jsonl")
    assert code == 0
    rows = [orjson.loads(line) for line in out.splitlines()]
    from proxy.config import load_config

    rewriter = Rewriter(load_config(config).policies)
    expected = list(replay(CHAT, lambda m: rewriter.decide("last1", m, {}, "gpt-4o")))
    assert rows == [{"conversation": "chat", **r.as_dict()} for r in expected]
    assert [r["tokens_after"] < r["tokens_before"] for r in rows] == [False, True, True]


def test_replay_of_a_tau_conversation_clips_and_trims(tmp_path):
    tau = shared_file("tau-airline-dev.json")
    code, out, _ = run(
        "replay",
        str(tau),
        "--config",
        str(write_config(tmp_path)),
        "--policy",
        "fit",
        "--index",
        "3",
    )
    assert code == 0
    task = json.loads(tau.read_text())[3]
    assert out.startswith(f"# task {task['task_id']} (1/1): {len(task['traj'])} messages")
    users = sum(1 for m in task["traj"] if m["role"] == "user")
    assert f"{users} turns, 0 refused" in out


def test_long_replays_show_progress_on_stderr(tmp_path):
    locomo = shared_file("locomo-dev.json")
    config = str(write_config(tmp_path))
    code, out, err = run(
        "replay", str(locomo), "--config", config, "--policy", "fit", "--index", "0"
    )
    assert code == 0
    conversation = conversations_from(json.loads(locomo.read_text()))[0]
    turns = sum(1 for m in conversation.messages if m["role"] == "user")
    assert err.splitlines()[-2] == f"replaying: {turns}/{turns} turns (100%)"
    assert err.splitlines()[-1].startswith(f"replayed {turns} turns in ")
    assert out.count("\n") == turns + 4  # title, header, one row per turn, totals, blank
    assert (
        run(
            "replay",
            str(locomo),
            "--config",
            config,
            "--policy",
            "fit",
            "--index",
            "0",
            "--no-progress",
        )[2]
        == ""
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "no policy 'nope'"),
        (["--policy", "last1", "--index", "5"], "--index must be 0..0"),
    ],
)
def test_replay_refuses_bad_arguments(tmp_path, args, message):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT))
    code, _, err = run("replay", str(chat), "--config", str(write_config(tmp_path)), *args)
    assert code == 2 and message in err


def test_replay_refuses_a_file_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"not": "a message"}]))
    code, _, err = run(
        "replay", str(bad), "--config", str(write_config(tmp_path)), "--policy", "last1"
    )
    assert code == 2 and "cannot replay" in err


def test_python_dash_m_proxy_dispatches_to_the_cli(populated, capsys):
    _, db = populated
    assert proxy_main(["sessions", "list", "--db", db, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["data"]) == 3

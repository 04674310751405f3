"""`python -m proxy sessions ...` over the proxy's store (replay: tests/ops/test_replay_cli.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from proxy.__main__ import main as proxy_main
from proxy.http.sessions import tenant_of
from proxy.ops import cli
from tests.harness import query
from tests.ops.test_admin import SUMMARIZE, summarized_session
from tests.ops.test_replay_cli import write_config

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


def test_sessions_list_finds_a_session_by_part_of_its_id(populated):
    proxy, db = populated
    code, out, _ = run("sessions", "list", "--db", db, "--session", "mm", "--json")
    assert code == 0
    page = json.loads(out)
    assert [s["key"] for s in page["data"]] == ["gamma"]
    assert page == admin(proxy, "/admin/sessions?session=mm")


def test_sessions_request_prints_what_it_forwarded_item_by_item(populated):
    proxy, db = populated
    tenant = tenant_of("sk-cli")
    last = admin(proxy, f"/admin/sessions/{tenant}/gamma")["requests"][-1]
    code, out, _ = run("sessions", "request", last["id"], "--db", db, "--json")
    assert code == 0
    assert json.loads(out) == admin(proxy, f"/admin/requests/{last['id']}/context")
    code, out, _ = run("sessions", "request", last["id"], "--db", db)
    assert code == 0
    lines = out.splitlines()
    split = last["tokens"]["split"]
    assert lines[1].split()[:2] == ["sent", str(last["tokens"]["before"])]
    assert f"dropped {split['sent']['dropped']}" in lines[1]
    assert lines[2].split()[:2] == ["forwarded", str(last["tokens"]["after"])]
    assert lines[4].split()[:2] == ["pos", "fate"]
    rows = [line.split() for line in lines[5:]]
    assert [r[1] for r in rows] == ["kept"] + ["dropped"] * 4 + ["kept"]
    assert rows[1][2] == "(max_turns)" and rows[1][-3:] == ["gamma", "question", "0"]
    assert run("sessions", "request", "nope", "--db", db)[0] == 1


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


def test_sessions_show_prints_each_summary_and_what_each_request_summarized(
    start_proxy, monkeypatch
):
    monkeypatch.setenv("CTX_ADMIN_KEY", ADMIN_KEY)
    proxy = start_proxy(extra={"admin": {"api_key": "os.environ/CTX_ADMIN_KEY"}}, **SUMMARIZE)
    summarized_session(proxy, "folded")
    db, tenant = str(proxy.config.store.path), tenant_of("sk-a")
    api = admin(proxy, f"/admin/sessions/{tenant}/folded")
    (summary,) = api["summaries"]
    created, reused = (r["id"] for r in api["requests"][2:])
    code, out, _ = run("sessions", "show", tenant, "folded", "--db", db)
    assert code == 0
    lines = out.splitlines()
    at = lines.index("summaries: 1")
    assert lines[at + 1].startswith(
        f"  #{summary['id']} covers up to item {summary['covers_item_id']}; ctxproxy/extractive, "
        f"prompt {summary['prompt_hash']}, "
    )
    assert lines[at + 2] == f"    usage: -; forwarded by: {created}, {reused}"
    assert lines[at + 3] == "    | - user: Order #4410 is late."
    assert "    pinned facts: id Order #4410; id Order #4411" in lines
    tokens = api["requests"][2]["summarized"]["tokens"]
    used = [line.strip() for line in lines if line.strip().startswith("summary ")]
    assert used[0].startswith(f"summary created #{summary['id']}: 2 turns (4 messages) in {tokens}")
    assert used[0].split(", waited ")[1].endswith(" ms")
    assert used[1] == f"summary reused #{summary['id']}: 2 turns (4 messages) in {tokens} tokens"
    assert len(used) == 2  # requests that needed no summary say nothing
    code, out, _ = run("sessions", "show", tenant, "folded", "--db", db, "--json")
    assert json.loads(out) == {**api, "calibration": []}


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
    code, out, _ = run("sessions", "purge", "--db", db)
    assert (code, out.splitlines()[1:]) == (0, ["VACUUM", "wal_checkpoint(TRUNCATE)"])
    assert b"beta" not in Path(db).read_bytes()


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


def test_sessions_show_says_why_a_request_fell_back():
    used = {"status": "fallback", "summary_id": None, "turns": None, "wait_ms": 2000.0}
    request = {"summarized": {**used, "indexes": []}, "fallback": "summarizer_timeout"}
    assert cli.summary_use(request) == "summary fallback (summarizer_timeout), waited 2000.0 ms"
    assert cli.summary_use({"summarized": None, "fallback": None}) == ""


def test_python_dash_m_proxy_dispatches_to_the_cli(populated, capsys):
    _, db = populated
    assert proxy_main(["sessions", "list", "--db", db, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["data"]) == 3

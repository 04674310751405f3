"""The command line as people use it: `ctxproxy --help`, read-only commands, sessions by id."""

from __future__ import annotations

import io
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.__main__ import COMMANDS
from proxy.http.sessions import tenant_of
from proxy.ops import cli

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def say(proxy: Any, key: str, session: str) -> None:
    openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key=key,
        max_retries=0,
        default_headers={"X-Session-Id": session},
    ).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hello"}])


@pytest.fixture
def two_tenants(start_proxy):
    proxy = start_proxy()
    say(proxy, "sk-one", "shared")
    say(proxy, "sk-two", "shared")
    say(proxy, "sk-one", "only-mine")
    proxy.drain()
    return str(proxy.config.store.path)


def test_help_lists_every_subcommand():
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0
    assert COMMANDS == ("serve", "check", "schema", "sessions", "replay")
    for command in COMMANDS:
        assert f"\n    {command} " in out.stdout, command


def test_the_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'ctxproxy = "proxy.__main__:console"' in text


@pytest.mark.parametrize(
    "args",
    [
        ("sessions", "list"),
        ("sessions", "show", "some-session"),
        ("sessions", "export", "t", "some-session"),
        ("sessions", "delete", "t", "some-session"),
    ],
)
def test_a_mistyped_db_is_an_error_and_no_file_is_created(tmp_path, args):
    typo = tmp_path / "typo.db"
    code, _, err = run(*args, "--db", str(typo))
    assert code == 2
    assert err == f"error: no database at {str(typo)!r} (check --db)\n"
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_ours_is_named_and_left_alone(tmp_path):
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    before = other.read_bytes()
    code, _, err = run("sessions", "list", "--db", str(other))
    assert code == 2
    assert "is not a ctxproxy database" in err
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_an_older_schema_is_not_migrated_by_a_read(two_tenants):
    con = sqlite3.connect(two_tenants)
    con.execute(
        "DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)"
    )
    con.commit()
    con.close()
    code, _, err = run("sessions", "list", "--db", two_tenants)
    assert code == 2
    assert "start the proxy on it once to migrate it" in err


def test_reads_leave_the_database_unchanged(two_tenants):
    before = Path(two_tenants).read_bytes()
    assert run("sessions", "list", "--db", two_tenants)[0] == 0
    assert run("sessions", "show", "only-mine", "--db", two_tenants)[0] == 0
    assert Path(two_tenants).read_bytes() == before


def test_show_finds_an_unambiguous_session_without_its_tenant(two_tenants):
    code, out, err = run("sessions", "show", "only-mine", "--db", two_tenants)
    assert (code, err) == (0, "")
    assert out.startswith(f"session 'only-mine' of tenant {tenant_of('sk-one')}\n")
    code, out, _ = run("sessions", "export", "only-mine", "--db", two_tenants)
    assert code == 0 and '"only-mine"' in out


def test_an_ambiguous_session_id_says_how_to_name_the_tenant(two_tenants):
    code, out, err = run("sessions", "show", "shared", "--db", two_tenants)
    assert (code, out) == (1, "")
    one, two = sorted([tenant_of("sk-one"), tenant_of("sk-two")])
    assert "session 'shared' exists under 2 tenants: " in err
    assert one in err and two in err
    assert "name one: sessions show TENANT shared" in err
    code, out, _ = run("sessions", "show", tenant_of("sk-two"), "shared", "--db", two_tenants)
    assert code == 0 and f"of tenant {tenant_of('sk-two')}" in out


def test_an_unknown_session_id_is_named(two_tenants):
    code, _, err = run("sessions", "show", "nobody", "--db", two_tenants)
    assert (code, err) == (1, "no session 'nobody' under any tenant\n")


def test_delete_by_id_alone_when_unambiguous(two_tenants):
    code, out, _ = run("sessions", "delete", "only-mine", "--db", two_tenants)
    assert code == 0 and out == f"deleted session 'only-mine' of tenant {tenant_of('sk-one')}\n"
    assert run("sessions", "show", "only-mine", "--db", two_tenants)[0] == 1


def test_config_store_path_is_relative_to_the_config_file(two_tenants, tmp_path, monkeypatch):
    # The config sits beside the database's folder; the shell is somewhere else.
    conf, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    conf.mkdir()
    elsewhere.mkdir()
    assert Path(two_tenants) == tmp_path / "ctxproxy.db"
    (conf / "c.yaml").write_text(
        # An unset secret elsewhere in the file does not stop a session command.
        "store: {path: ../ctxproxy.db}\nupstreams: {u: {base_url: 'http://127.0.0.1:9', api_key: os.environ/CTX_UNSET_KEY}}\n"
    )
    monkeypatch.chdir(elsewhere)
    code, out, err = run("sessions", "list", "--config", "../conf/c.yaml")
    assert (code, err) == (0, "")
    assert "only-mine" in out
    code, _, err = run("sessions", "list", "--config", str(tmp_path / "absent.yaml"))
    assert code == 2 and "cannot read config file" in err

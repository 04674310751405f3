"""The store and coordination sections: backend selection, shared-store rules, `proxy check`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config.loader import parse_config
from proxy.errors import ConfigError
from proxy.ops.check import describe, redact
from proxy.runtime import build_store_for
from proxy.store.backends import backend_name
from proxy.store.postgres import PostgresStore
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore
from tests.config.test_config import base

PG = "postgresql://ctx:secret@db.internal:5432/ctxproxy"


def test_sqlite_stays_the_default_store() -> None:
    config = parse_config(base())
    assert (config.store.url, config.store.path) == (None, "./data/ctxproxy.db")
    assert isinstance(build_store_for(config), SqliteStore)
    assert config.coordination.redis_url is None


def test_a_postgresql_url_selects_the_postgresql_store_with_its_pool_and_schema() -> None:
    config = parse_config(
        base(
            store={"url": PG, "pool_size": 4, "schema": "ctx"},
            coordination={"redis_url": "redis://127.0.0.1:6379/0"},
        )
    )
    store = build_store_for(config)
    assert isinstance(store, PostgresStore)
    assert (store.url, store.pool_size, store.schema) == (PG, 4, "ctx")
    assert backend_name("postgres://x/y") == "postgresql"


def test_a_redis_url_selects_the_redis_store_with_the_session_ttl() -> None:
    config = parse_config(
        base(
            store={"url": "redis://127.0.0.1:6379/1"},
            session={"ttl": "2h"},
            coordination={"redis_url": "redis://127.0.0.1:6379/0"},
        )
    )
    store = build_store_for(config)
    assert isinstance(store, RedisStore)
    assert (store.url, store.ttl_s) == ("redis://127.0.0.1:6379/1", 7200.0)


def test_the_store_url_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_DB", PG)
    config = parse_config(
        base(store={"url": "os.environ/CTX_DB"}, coordination={"single_instance": True})
    )
    assert config.store.url == PG
    assert "secret" not in repr(config.store)


@pytest.mark.parametrize(
    ("section", "path", "message"),
    [
        ({"store": {"url": "mysql://x/y"}}, "store.url", "scheme must be one of"),
        ({"store": {"url": PG, "path": "x.db"}}, "store", "not both"),
        (
            {"store": {"url": PG, "pool_size": 0}, "coordination": {"single_instance": True}},
            "store.pool_size",
            ">= 1",
        ),
        ({"store": {"url": PG, "schema": "Bad-Name"}}, "store.schema", "identifier"),
        ({"store": {"schema": "ctx"}}, "store.schema", "postgresql"),
        ({"store": {"url": PG}}, "coordination.redis_url", "is required with a shared store"),
        ({"coordination": {"redis_url": "http://x"}}, "coordination.redis_url", "scheme"),
        ({"coordination": {"lock_lease": "0.5s"}}, "coordination.lock_lease", "at least 1s"),
        (
            {"coordination": {"single_instance": "yes"}},
            "coordination.single_instance",
            "true or false",
        ),
        ({"coordination": {"key_prefix": "a b"}}, "coordination.key_prefix", "must be"),
        ({"coordination": {"nope": 1}}, "coordination.nope", "unknown key"),
    ],
)
def test_bad_store_or_coordination_names_the_path(
    section: dict[str, Any], path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(base(**section))
    assert str(info.value).startswith(path) and message in str(info.value)
    assert "secret" not in str(info.value)


def test_check_names_backend_and_coordination_without_the_password() -> None:
    config = parse_config(
        base(
            store={"url": PG},
            coordination={"redis_url": "redis://:hunter2@cache:6379/0", "lock_lease": "20s"},
        )
    )
    text = "\n".join(describe(config))
    assert "store: postgresql at postgresql://ctx:***@db.internal:5432/ctxproxy, pool 10" in text
    assert "coordination: redis at redis://:***@cache:6379/0" in text and "lease 20s" in text
    assert "secret" not in text and "hunter2" not in text
    assert redact("redis://cache:6379/0") == "redis://cache:6379/0"


def _check(tmp_path: Path, data: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_command_refuses_a_shared_store_without_coordination(tmp_path: Path) -> None:
    refused = _check(tmp_path, base(store={"url": PG}))
    assert refused.returncode == 2
    assert "coordination.redis_url: is required with a shared store" in refused.stderr

    single = _check(tmp_path, base(store={"url": PG}, coordination={"single_instance": True}))
    assert single.returncode == 0, single.stderr
    assert "coordination: in-process (single_instance: true" in single.stdout

    shared = _check(
        tmp_path, base(store={"url": PG}, coordination={"redis_url": "redis://r:6379/0"})
    )
    assert shared.returncode == 0, shared.stderr
    assert "store: postgresql" in shared.stdout and "coordination: redis" in shared.stdout


def test_the_compose_files_proxy_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "compose.yaml").read_text())
    env = compose["services"]["proxy-a"]["environment"]
    monkeypatch.setenv("CTXPROXY_DATABASE_URL", env["CTXPROXY_DATABASE_URL"])
    monkeypatch.setenv("CTXPROXY_REDIS_URL", env["CTXPROXY_REDIS_URL"])
    config = parse_config(yaml.safe_load(compose["configs"]["ctxproxy"]["content"]))
    assert backend_name(config.store.url) == "postgresql"
    assert config.coordination.redis_url == "redis://redis:6379/0"
    assert compose["services"]["proxy-b"]["ports"] != compose["services"]["proxy-a"]["ports"]


def test_a_redis_store_takes_a_key_prefix_and_only_a_redis_store_does() -> None:
    redis_store = {"url": "redis://cache:6379/1", "key_prefix": "team-a:store"}
    config = parse_config(base(store=redis_store, coordination={"single_instance": True}))
    assert config.store.key_prefix == "team-a:store"
    assert parse_config(base()).store.key_prefix == "ctxproxy:store"
    for store, message in (
        ({"url": PG, "key_prefix": "x"}, "applies to a redis:// store only"),
        ({"url": "redis://cache:6379/1", "key_prefix": "a b"}, "must be 1-64 of"),
    ):
        with pytest.raises(ConfigError, match=message) as info:
            parse_config(base(store=store, coordination={"single_instance": True}))
        assert str(info.value).startswith("store.key_prefix")


def test_check_says_how_recall_works_on_the_redis_store() -> None:
    config = parse_config(
        base(store={"url": "redis://cache:6379/1"}, coordination={"single_instance": True})
    )
    text = "\n".join(describe(config))
    assert "store: redis at redis://cache:6379/1 (shared)" in text
    assert "limit (redis): recall: no full-text engine in Redis" in text

"""`python -m proxy sessions ...` on a shared store: the config's store.url (PostgreSQL)."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
import yaml

from proxy.ops import cli
from proxy.store.postgres import PURGED_TABLES
from tests.servers import require_postgres, require_redis
from tests.stores import ALICE, ScratchPostgresStore, msg, req


async def test_sessions_list_show_and_delete_read_the_postgresql_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ScratchPostgresStore(require_postgres(), pool_size=2)
    await store.open()
    try:
        await store.record_exchange(ALICE, [msg("user", "hi")], msg("assistant", "hello"), req())
        monkeypatch.setenv("CTX_TEST_DB", require_postgres())
        config = tmp_path / "c.yaml"
        config.write_text(
            yaml.safe_dump({"store": {"url": "os.environ/CTX_TEST_DB", "schema": store.schema}})
        )

        def run(*argv: str) -> tuple[int, str, str]:
            out, err = io.StringIO(), io.StringIO()
            # The CLI runs its own event loop: in a thread of its own, as from a shell.
            with ThreadPoolExecutor(1) as pool:
                code = pool.submit(cli.main, list(argv), out, err).result(60)
            return code, out.getvalue(), err.getvalue()

        code, out, err = run("sessions", "list", "--config", str(config), "--json")
        assert code == 0, err
        assert [s["key"] for s in orjson.loads(out)["data"]] == [ALICE.key]
        code, out, _ = run(
            "sessions", "show", ALICE.tenant, ALICE.key, "--config", str(config), "--json"
        )
        assert code == 0 and [
            m["content"] for m in (h["message"] for h in orjson.loads(out)["history"])
        ] == ["hi", "hello"]
        code, _, _ = run("sessions", "delete", ALICE.tenant, ALICE.key, "--config", str(config))
        assert code == 0 and await store.get_session(ALICE) is None
        # The dead tuples' bytes: gone once purged (tests/reliability/test_deletion_purge.py).
        code, out, err = run("sessions", "purge", "--config", str(config))
        assert code == 0, err
        assert out.splitlines() == [f"VACUUM (FULL) {store.schema}.{t}" for t in PURGED_TABLES]
    finally:
        await store.close()


async def test_sessions_purge_on_redis_says_there_is_nothing_to_purge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTX_TEST_REDIS", require_redis())
    config = tmp_path / "c.yaml"
    prefix = f"ctxtest:purge:{tmp_path.name}"
    config.write_text(
        yaml.safe_dump({"store": {"url": "os.environ/CTX_TEST_REDIS", "key_prefix": prefix}})
    )
    out, err = io.StringIO(), io.StringIO()
    with ThreadPoolExecutor(1) as pool:
        code = pool.submit(cli.main, ["sessions", "purge", "--config", str(config)], out, err)
        assert code.result(60) == 0, err.getvalue()
    assert out.getvalue() == "nothing to purge (docs/operations/deletion.md)\n"

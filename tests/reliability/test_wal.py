"""WAL hygiene: after a burst of writes and a second of quiet, the WAL is empty again."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.harness import query, wait_until
from tests.reliability.report import figure

# Exchanges in the soak: a few hundred in `make test`, more through `make reliability`.
SOAK = int(os.environ.get("RELIABILITY_SOAK", "300"))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_the_wal_is_truncated_once_the_proxy_is_idle(reliable_proxy, tmp_path):
    proxy = reliable_proxy()
    db = tmp_path / "ctxproxy.db"
    wal = tmp_path / "ctxproxy.db-wal"
    text = "lorem ipsum dolor sit amet " * 800  # about 21 KB per message

    def turn(n: int) -> int:
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": f"{n} {text}"}]},
            headers={"authorization": "Bearer sk-soak", "x-session-id": f"soak-{n % 20}"},
            timeout=30,
        )
        return response.status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(turn, range(SOAK)))
    assert statuses == [200] * SOAK
    proxy.drain()
    peak = _size(wal)
    assert peak > 0
    wait_until(lambda: _size(wal) == 0, timeout=10)
    items = query(db, "SELECT count(*) AS n FROM items")[0]["n"]
    assert items == 2 * SOAK
    figure(
        "WAL after a soak",
        f"{SOAK} exchanges: db {_size(db) / 2**20:.1f} MiB, WAL peak {peak / 2**20:.1f} MiB, "
        f"WAL idle {_size(wal)} B",
    )
    # Still writable afterwards, and the WAL grows back only as needed.
    assert turn(SOAK) == 200
    proxy.drain()
    time.sleep(0.1)
    assert query(db, "PRAGMA integrity_check")[0][0] == "ok"

"""The real PostgreSQL and Redis the multi-instance tests run against (never mocked).

A server that is not up makes the test FAIL with the command that starts it;
nothing here skips. Each test run works under its own PostgreSQL schemas and
Redis key prefix (``RUN``), removed afterwards.
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest

POSTGRES_URL = os.environ.get("CTXPROXY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CTXPROXY_TEST_REDIS", "redis://127.0.0.1:6379/0")

# This run's name: its schemas are ctxtest_<RUN>_<n>, its Redis keys ctxtest:<RUN>:...
RUN = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"

_CLUSTER = "$(ls /etc/postgresql)"  # the one installed version
START_POSTGRES = f"pg_ctlcluster --skip-systemctl-redirect {_CLUSTER} main start"
START_REDIS = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no'
    " --dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def require_postgres() -> str:
    if not _reachable(5432):
        pytest.fail(
            "PostgreSQL is not reachable on 127.0.0.1:5432 (the PostgreSQL store's tests need "
            f"it; database `test`, trust auth). Start it with: {START_POSTGRES}",
            pytrace=False,
        )
    return POSTGRES_URL


def require_redis() -> str:
    if not _reachable(6379):
        pytest.fail(
            "Redis is not reachable on 127.0.0.1:6379 (the coordination tests need it). "
            f"Start it with: {START_REDIS}",
            pytrace=False,
        )
    return REDIS_URL

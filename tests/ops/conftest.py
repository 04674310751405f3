"""Fixtures of the operator tests: a proxy with the admin API enabled."""

from __future__ import annotations

import pytest

from tests.ops.test_admin import ADMIN, ADMIN_KEY


@pytest.fixture
def admin_proxy(start_proxy, monkeypatch):
    """``start_proxy`` with ``admin.api_key`` set (to ``ADMIN_KEY``)."""
    monkeypatch.setenv("CTX_ADMIN_KEY", ADMIN_KEY)
    return lambda **kw: start_proxy(extra={**ADMIN, **kw.pop("extra", {})}, **kw)

"""/healthz says the process is up; /readyz says the store answers and the process is not draining."""

from __future__ import annotations

import httpx


def test_healthz_and_readyz_answer_once_started(start_proxy):
    proxy = start_proxy()
    assert httpx.get(f"{proxy.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{proxy.url}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "store": "ok"}


def test_readyz_is_503_when_the_store_fails(start_proxy, monkeypatch):
    proxy = start_proxy()
    store = proxy.runtime.store

    async def broken(*args: object) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(store, "get_session", broken)
    ready = httpx.get(f"{proxy.url}/readyz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "unavailable"
    assert "disk I/O error" in ready.json()["store"]
    assert httpx.get(f"{proxy.url}/healthz").status_code == 200  # the process itself is up


def test_readyz_is_503_while_draining(start_proxy):
    proxy = start_proxy()
    proxy.app.state.lifecycle.draining = True
    ready = httpx.get(f"{proxy.url}/readyz")
    assert ready.status_code == 503 and ready.json() == {"status": "draining"}

"""/healthz says the process is up; /readyz says the store answers and the process is not draining."""

from __future__ import annotations

import httpx

from tests.harness import wait_until


def test_healthz_and_readyz_answer_once_started(start_proxy):
    proxy = start_proxy()
    assert httpx.get(f"{proxy.url}/healthz").json() == {"status": "ok"}
    # Ready once the token encodings are loaded (in a thread, just after start).
    wait_until(lambda: httpx.get(f"{proxy.url}/readyz").status_code == 200, timeout=30)
    assert httpx.get(f"{proxy.url}/readyz").json() == {"status": "ready", "store": "ok"}


def test_readyz_is_503_when_the_store_fails(start_proxy, monkeypatch):
    proxy = start_proxy()
    wait_until(lambda: proxy.app.state.lifecycle.started, timeout=30)
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


def test_requests_before_the_warm_up_wait_for_it_while_health_answers(fake, start_proxy):
    import asyncio
    import threading

    upstream, _ = fake
    proxy = start_proxy()
    lifecycle = proxy.app.state.lifecycle
    wait_until(lambda: lifecycle.started, timeout=30)  # the real warm-up is over
    lifecycle.started = False
    lifecycle.ready = asyncio.Event()
    answers: list[int] = []
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    thread = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{proxy.url}/v1/chat/completions", json=body).status_code
        )
    )
    thread.start()
    assert httpx.get(f"{proxy.url}/healthz").status_code == 200
    assert httpx.get(f"{proxy.url}/readyz").json() == {"status": "starting"}
    thread.join(0.3)
    assert answers == [] and upstream.received == []  # held at the gate
    proxy.loop.loop.call_soon_threadsafe(lifecycle.set_started)
    thread.join(10)
    assert answers == [200]

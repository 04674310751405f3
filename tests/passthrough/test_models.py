"""GET /v1/models merges every OpenAI-compatible upstream's list; a failing one is skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.endpoints import FakeEndpoints
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config


@pytest.fixture
def fleet(loop_thread: LoopThread) -> Iterator[list[tuple[FakeEndpoints, AiohttpServer]]]:
    fakes = [
        FakeEndpoints(models=["a", "shared"]),
        FakeEndpoints(models=["shared", "b"]),
        FakeEndpoints(),
    ]
    servers = [(f, AiohttpServer(loop_thread, f.app())) for f in fakes]
    yield servers
    for _, server in servers:
        server.stop()


def proxy_for(loop_thread: LoopThread, tmp_path: Path, upstreams: dict[str, Any]) -> ProxyServer:
    config = make_config(
        "http://unused",
        tmp_path,
        extra={"upstreams": upstreams},
        routes=[{"match": {"path": "/v1/chat/completions"}, "upstream": next(iter(upstreams))}],
    )
    return ProxyServer(loop_thread, config)


def test_lists_are_merged_first_wins_and_a_failing_upstream_is_skipped(
    fleet, loop_thread, tmp_path
):
    (a, sa), (b, sb), (c, sc) = fleet
    c.models_status = 500
    upstreams = {
        "one": {"base_url": f"{sa.url}/v1"},
        "two": {"base_url": f"{sb.url}/v1", "api_key": "sk-two"},
        "down": {"base_url": f"{sc.url}/v1"},
        "gone": {"base_url": "http://127.0.0.1:9/v1"},
        "claude": {"litellm_model": "anthropic/claude-sonnet-4-5", "api_key": "k"},
    }
    proxy = proxy_for(loop_thread, tmp_path, upstreams)
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-client", max_retries=0)
        raw = client.models.with_raw_response.list()
        listed = raw.parse()
        assert [(m.id, m.owned_by) for m in listed.data] == [
            ("a", "fake"),
            ("shared", "fake"),
            ("b", "fake"),
        ]
        assert raw.headers["x-ctxproxy-models-skipped"] == "down,gone"
        # Each upstream got its own credentials: the client's key, or the configured one.
        assert a.received[-1].headers["Authorization"] == "Bearer sk-client"
        assert b.received[-1].headers["Authorization"] == "Bearer sk-two"
        # Retrieval: the first upstream that has it.
        assert client.models.retrieve("b").id == "b"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nobody-has-it")
    finally:
        proxy.stop()


def test_first_upstream_down_no_longer_breaks_the_list(fleet, loop_thread, tmp_path):
    (_a, _sa), (_b, sb), _ = fleet
    upstreams = {"gone": {"base_url": "http://127.0.0.1:9/v1"}, "two": {"base_url": f"{sb.url}/v1"}}
    proxy = proxy_for(loop_thread, tmp_path, upstreams)
    try:
        response = httpx.get(f"{proxy.url}/v1/models")
    finally:
        proxy.stop()
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["shared", "b"]


def test_all_failing_is_a_502_naming_each(fleet, loop_thread, tmp_path):
    (a, sa), _, _ = fleet
    a.models_status = 503
    upstreams = {"one": {"base_url": f"{sa.url}/v1"}, "gone": {"base_url": "http://127.0.0.1:9/v1"}}
    proxy = proxy_for(loop_thread, tmp_path, upstreams)
    try:
        response = httpx.get(f"{proxy.url}/v1/models")
    finally:
        proxy.stop()
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "upstream_error"
    assert "one: status 503" in error["message"] and "gone:" in error["message"]


def test_every_upstream_refusing_the_key_relays_that_refusal(fleet, loop_thread, tmp_path):
    (a, sa), (b, sb), _ = fleet
    a.models_status = b.models_status = 401
    upstreams = {"one": {"base_url": f"{sa.url}/v1"}, "two": {"base_url": f"{sb.url}/v1"}}
    proxy = proxy_for(loop_thread, tmp_path, upstreams)
    try:
        response = httpx.get(f"{proxy.url}/v1/models")
    finally:
        proxy.stop()
    assert response.status_code == 401  # not a 502: the key is the problem, and it says so


def test_the_same_upstream_configured_twice_is_asked_once(fleet, loop_thread, tmp_path):
    (a, sa), _, _ = fleet
    upstreams = {"one": {"base_url": f"{sa.url}/v1"}, "again": {"base_url": f"{sa.url}/v1/"}}
    proxy = proxy_for(loop_thread, tmp_path, upstreams)
    try:
        assert [m["id"] for m in httpx.get(f"{proxy.url}/v1/models").json()["data"]] == [
            "a",
            "shared",
        ]
    finally:
        proxy.stop()
    assert len(a.received) == 1

"""Config reload (SIGHUP): validated first; a bad file changes nothing; in-flight requests finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from structlog.testing import capture_logs

from proxy.config.loader import load_config, parse_config
from proxy.ops.reload import Reloader
from proxy.runtime import Runtime
from proxy.store.memory import MemoryStore
from proxy.upstream.base import UpstreamRequest, UpstreamResponse
from tests.fakes.upstream import Reply
from tests.harness import ProxyServer, free_port, wait_until
from tests.telemetry.test_metrics import parse, value

REPO = Path(__file__).resolve().parents[2]


def config_data(
    upstream_url: str, tmp_path: Path, policy: str = "last1", **over: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "store": {"path": str(tmp_path / "r.db")},
        "upstreams": {"default": {"base_url": f"{upstream_url}/v1", "timeout_s": 5}},
        "routes": [
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": policy}
        ],
        "policies": {
            "last1": {"strategy": "trim", "max_turns": 1},
            "last2": {"strategy": "trim", "max_turns": 2},
        },
    }
    data.update(over)
    return data


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def policy_of(url: str) -> str:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{url}/v1/context/preview", content=orjson.dumps(body), timeout=5)
    assert r.status_code == 200, r.text
    return str(r.json()["policy"])


@pytest.fixture
def served(loop_thread, fake, tmp_path):
    """A proxy started from a config file, and a Reloader for that file."""
    path = write(tmp_path / "config.yaml", config_data(fake[1].url, tmp_path))
    proxy = ProxyServer(loop_thread, load_config(path))
    yield proxy, path, Reloader(proxy.runtime, str(path))
    proxy.stop()


def test_a_valid_file_replaces_policies_and_routes(served, fake, tmp_path):
    proxy, path, reloader = served
    assert policy_of(proxy.url) == "last1"
    write(path, config_data(fake[1].url, tmp_path, policy="last2"))
    assert proxy.loop.run(reloader.reload()) is True
    assert policy_of(proxy.url) == "last2"
    samples = parse(httpx.get(f"{proxy.url}/metrics").text)
    assert value(samples, "ctxproxy_config_reloads_total", result="ok") == 1


@pytest.mark.parametrize(
    "bad",
    [
        "routes: [unclosed",
        {"upstreams": {}, "routes": []},
        "policies-typo: 1",
    ],
)
def test_an_invalid_file_is_rejected_and_the_old_config_stays(served, fake, tmp_path, bad):
    proxy, path, reloader = served
    old = proxy.runtime.config
    if isinstance(bad, dict):
        bad = config_data(fake[1].url, tmp_path, policy="last2", **bad)
    write(path, bad)
    with capture_logs() as logs:
        assert proxy.loop.run(reloader.reload()) is False
    assert proxy.runtime.config is old
    assert policy_of(proxy.url) == "last1"
    [line] = [entry for entry in logs if entry["event"] == "config_reload_rejected"]
    assert line["log_level"] == "error" and line["path"] == str(path) and line["error"]
    samples = parse(httpx.get(f"{proxy.url}/metrics").text)
    assert value(samples, "ctxproxy_config_reloads_total", result="rejected") == 1
    assert value(samples, "ctxproxy_config_reloads_total", result="ok") == 0


def test_a_missing_environment_variable_rejects_the_reload(served, fake, tmp_path, monkeypatch):
    proxy, path, reloader = served
    monkeypatch.delenv("CTX_RELOAD_KEY", raising=False)
    data = config_data(
        fake[1].url, tmp_path, policy="last2", admin={"api_key": "os.environ/CTX_RELOAD_KEY"}
    )
    write(path, data)
    assert proxy.loop.run(reloader.reload()) is False
    assert policy_of(proxy.url) == "last1"


def test_server_and_store_changes_wait_for_a_restart(served, fake, tmp_path):
    proxy, path, reloader = served
    data = config_data(fake[1].url, tmp_path, policy="last2", server={"port": 1})
    data["store"] = {"path": str(tmp_path / "elsewhere.db")}
    write(path, data)
    with capture_logs() as logs:
        assert proxy.loop.run(reloader.reload()) is True
    config = proxy.runtime.config
    assert config.store.path == str(tmp_path / "r.db") and config.server.port != 1
    assert policy_of(proxy.url) == "last2"
    [line] = [entry for entry in logs if entry["event"] == "config_reload_needs_restart"]
    assert line["sections"] == ["server", "store"]


def test_a_stream_in_flight_finishes_on_the_upstream_it_started_with(served, fake, tmp_path):
    proxy, path, reloader = served
    upstream, _ = fake
    upstream.replies.append(Reply(content="slow and steady wins", chunk_delay=0.05))
    old = proxy.runtime.upstreams["default"]
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    data = config_data(fake[1].url, tmp_path)
    data["upstreams"]["default"]["timeout_s"] = 7  # a changed upstream: rebuilt
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", content=orjson.dumps(body)) as r:
        chunks = r.iter_bytes()
        received = next(chunks)
        write(path, data)
        assert proxy.loop.run(reloader.reload()) is True
        assert proxy.runtime.upstreams["default"] is not old
        assert [u for _, u in proxy.runtime._retired] == [old]
        received += b"".join(chunks)
    assert received == upstream.last_response and b"[DONE]" in received
    proxy.drain()
    wait_until(lambda: not proxy.runtime._retired)


class RecordingUpstream:
    def __init__(self) -> None:
        self.closed = 0

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        raise AssertionError("not called")

    async def close(self) -> None:
        self.closed += 1


async def test_unchanged_upstreams_are_kept_and_replaced_ones_close_after_their_requests(tmp_path):
    data = config_data("http://127.0.0.1:9", tmp_path)
    data["upstreams"]["spare"] = {"base_url": "http://127.0.0.1:9/v2"}
    default, spare = RecordingUpstream(), RecordingUpstream()
    rt = Runtime(
        config=parse_config(data),
        store=MemoryStore(),
        upstreams={"default": default, "spare": spare},
    )
    view = rt.pin()
    data["upstreams"]["default"]["timeout_s"] = 9
    rt.reload(parse_config(data))
    assert rt.upstreams["spare"] is spare and rt.upstreams["default"] is not default
    assert view.upstreams["default"] is default  # the request keeps what it started with
    later = rt.pin()
    assert later.upstreams["default"] is rt.upstreams["default"]
    await rt.background.drain()
    assert default.closed == 0
    view.release()
    view.release()  # twice is harmless
    await rt.background.drain()
    assert (default.closed, spare.closed) == (1, 0)
    later.release()
    await rt.close()
    assert spare.closed == 1


def test_sighup_reloads_a_running_server(fake, tmp_path):
    port = free_port()
    path = write(tmp_path / "config.yaml", config_data(fake[1].url, tmp_path))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--config", str(path), "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    reader = threading.Thread(
        target=lambda: output.extend(iter(process.stdout.readline, "")), daemon=True
    )
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: "proxy_started" in "".join(output), timeout=30)
        assert policy_of(url) == "last1"
        write(path, "routes: [unclosed")
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: "config_reload_rejected" in "".join(output), timeout=10)
        assert policy_of(url) == "last1"
        write(path, config_data(fake[1].url, tmp_path, policy="last2"))
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: "config_reloaded" in "".join(output), timeout=10)
        assert policy_of(url) == "last2"
        assert process.poll() is None
    finally:
        process.terminate()
        process.wait(10)
    rejected = next(line for line in output if "config_reload_rejected" in line)
    assert orjson.loads(rejected)["level"] == "error"

"""`python -m proxy` as operators run it: JSON lines only, started after bind, drain, stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from tests.harness import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, port: int, **store: Any) -> Path:
    data = {
        "server": {"port": port},
        "store": {"path": str(tmp_path / "ctxproxy.db"), **store},
        "logging": {"format": "json"},
        "upstreams": {"down": {"base_url": "http://127.0.0.1:9/v1", "timeout_s": 2}},
        "routes": [{"match": {"path": "/v1/*"}, "upstream": "down"}],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Running:
    def __init__(self, config: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--config", str(config), *args],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        assert self.process.stdout is not None
        stdout = self.process.stdout
        self.reader = threading.Thread(
            target=lambda: self.lines.extend(iter(stdout.readline, "")), daemon=True
        )
        self.reader.start()

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.lines if line.strip()]

    def wait(self) -> int:
        code = self.process.wait(30)
        self.reader.join(5)
        return code


def test_every_line_is_json_started_after_bind_drains_on_sigterm_and_says_stopped(tmp_path):
    port = free_port()
    proxy = Running(write_config(tmp_path, port), "--drain-s", "3")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: any("proxy_started" in line for line in proxy.lines), timeout=30)
        # Ready once the encodings are loaded, a moment after the socket is bound.
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=30)
        # A 5xx is logged at warning, naming the upstream and its host.
        failed = httpx.post(f"{url}/v1/embeddings", json={"model": "m", "input": "x"})
        assert failed.status_code == 502
        assert "'down' (127.0.0.1:9)" in failed.json()["error"]["message"]
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 502
        proxy.process.send_signal(signal.SIGTERM)
        wait_until(lambda: any("proxy_draining" in line for line in proxy.lines), timeout=10)
        # Draining: not ready, but still serving.
        assert httpx.get(f"{url}/readyz").status_code == 503
        assert httpx.get(f"{url}/healthz").status_code == 200
    finally:
        if proxy.process.poll() is None:
            proxy.process.send_signal(signal.SIGTERM)
        proxy.wait()
    events = proxy.events()  # every line parses: uvicorn's own included
    names = [e["event"] for e in events]
    started = next(e for e in events if e["event"] == "proxy_started")
    assert started["url"] == f"http://127.0.0.1:{port}" and started["port"] == port
    assert any(e.get("logger") == "uvicorn.error" for e in events)
    # Started after uvicorn bound the socket, never before.
    running = next(i for i, e in enumerate(events) if str(e["event"]).startswith("Uvicorn running"))
    assert names.index("proxy_started") > running
    completed = [e for e in events if e["event"] == "request_completed"]
    assert [e["level"] for e in completed if e["status"] == 502] == ["warning", "warning"]
    assert names[-1] == "proxy_stopped"
    assert events[-1]["signal"] == "SIGTERM"


def test_port_in_use_fails_with_one_error_and_no_started_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proxy = Running(write_config(tmp_path, port))
        code = proxy.wait()
    assert code != 0
    events = proxy.events()
    assert "proxy_started" not in [e["event"] for e in events]
    errors = [e for e in events if e["level"] == "error"]
    assert any("address already in use" in str(e["event"]) for e in errors)


def test_a_bad_store_path_is_one_clear_line(tmp_path):
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_text("hello")
    for path in ("/proc/no-such-dir/ctxproxy.db", str(not_a_db)):
        config = write_config(tmp_path, free_port(), path=path)
        out = subprocess.run(
            [sys.executable, "-m", "proxy", "--config", str(config)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2
        lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
        assert len(lines) == 1, lines  # no traceback
        event = orjson.loads(lines[0])
        assert event["event"] == "store_open_failed" and event["path"] == path
        assert event["level"] == "error" and event["error"]

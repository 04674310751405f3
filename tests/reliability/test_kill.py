"""kill -9 under load: every exchange a client saw complete on a history: server route is stored.

A real proxy process (``python -m proxy``) on a SQLite file, clients streaming
and not, killed with SIGKILL mid-load, five rounds on the same file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import yaml

from tests.harness import free_port, query
from tests.reliability.report import figure

ROUNDS = 5
LOAD_S = float(os.environ.get("RELIABILITY_KILL_LOAD_S", "1.5"))
CLIENTS = 8


def _start(config: Path, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--config", str(config), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the proxy did not start")


def _client(port: int, name: str, stop: threading.Event, seen: list[tuple[str, str]]) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"authorization": "Bearer sk-kill", "x-session-id": name}
    n = 0
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            n += 1
            text = f"{name} turn {n} {time.monotonic_ns()}"
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
            try:
                if n % 2:
                    response = client.post(url, content=orjson.dumps(body), headers=headers)
                    complete = response.status_code == 200 and b"echo:" in response.content
                else:
                    body["stream"] = True
                    with client.stream(
                        "POST", url, content=orjson.dumps(body), headers=headers
                    ) as response:
                        data = b"".join(response.iter_bytes())
                    complete = response.status_code == 200 and b"data: [DONE]" in data
            except httpx.HTTPError:
                return  # the proxy is gone
            if complete:
                seen.append((name, text))


def test_kill_9_under_load_loses_no_exchange_a_client_saw_complete(loop_thread, fake, tmp_path):
    _, upstream_server = fake
    port = free_port()
    db = tmp_path / "kill.db"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "store": {"path": str(db)},
                "logging": {"level": "warning"},
                "upstreams": {"fake": {"base_url": f"{upstream_server.url}/v1"}},
                "routes": [
                    {
                        "match": {"path": "/v1/chat/completions"},
                        "upstream": "fake",
                        "policy": "passthrough",
                        "history": "server",
                    }
                ],
            }
        )
    )
    seen: list[tuple[str, str]] = []
    for round_ in range(ROUNDS):
        process = _start(config, port)
        # One request through first: the fake upstream's tokenizer loads on its first call.
        warm = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "warm"}]},
            timeout=30,
        )
        assert warm.status_code == 200
        stop = threading.Event()
        threads = [
            threading.Thread(target=_client, args=(port, f"r{round_}c{c}", stop, seen))
            for c in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        time.sleep(LOAD_S)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        stop.set()
        for t in threads:
            t.join(15)
        assert query(db, "PRAGMA integrity_check")[0][0] == "ok"
    stored = {
        (row["key"], row["message_json"])
        for row in query(
            db,
            "SELECT s.key, i.message_json FROM items i JOIN sessions s ON s.id = i.session_id",
        )
    }
    texts = {(key, orjson.loads(raw).get("content")) for key, raw in stored}
    lost = [
        (name, text)
        for name, text in seen
        if (name, text) not in texts or (name, f"echo: {text}") not in texts
    ]
    figure(
        "exchanges lost after kill -9", f"{len(lost)} of {len(seen)} seen complete ({ROUNDS} kills)"
    )
    assert len(seen) > ROUNDS * CLIENTS
    assert lost == []

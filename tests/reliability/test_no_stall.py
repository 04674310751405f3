"""One huge message must not stall the other requests: tokens are counted off the loop."""

from __future__ import annotations

import os
import threading
import time

import httpx
import orjson

from proxy.context.tokens import LONG_PIECE, count_long, load_encoding
from tests.reliability.report import figure

# 4 MiB in `make test`; `make reliability` sends the 24 MiB.
BIG_CHARS = int(os.environ.get("RELIABILITY_BIG_MIB", "4")) * 1024 * 1024


def test_a_huge_single_word_message_leaves_other_requests_responsive(reliable_proxy, both):
    proxy = reliable_proxy(server={"max_body_bytes": 64 * 1024 * 1024})
    word = "x" * BIG_CHARS
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": word}]})
    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                started = time.perf_counter()
                assert client.get(proxy.url + "/healthz").status_code == 200
                probes.append(time.perf_counter() - started)
                time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.1)
    started = time.perf_counter()
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json", "x-session-id": "big", "x-app": "trim"},
        timeout=120,
    )
    big_s = time.perf_counter() - started
    done.set()
    prober.join()
    assert response.status_code == 200, response.text[:300]
    worst = max(probes)
    figure("probe max latency during a large tokenization", round(worst * 1000, 1), "ms")
    figure("large request (single word)", f"{BIG_CHARS // 2**20} MiB in {big_s:.2f} s")
    # Before: the probe waited for the whole count (28 s for 24 MiB). Now it
    # must stay a small fraction of the large request's time.
    assert len(probes) >= 5
    assert worst < max(0.25 * big_s, 0.2), (worst, big_s)
    assert int(response.headers["x-context-tokens-before"]) > BIG_CHARS // 8


def test_long_texts_are_counted_in_pieces_as_one_pass_would_count_them():
    encoding = load_encoding("o200k_base")
    text = " ".join(f"word{n} and some more text, punctuated." for n in range(6000))
    assert len(text) > 4 * LONG_PIECE
    assert count_long(encoding, text) == len(encoding.encode_ordinary(text))

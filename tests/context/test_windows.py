"""proxy/context/windows.py: a local model's context window, from config or its server."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from proxy.config.loader import parse_config
from tests.harness import make_config

# Unknown to litellm's model map: only config or the server can say its window.
LOCAL = "my-local-gemma"


def long_chat(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} " + "word " * 40})
        messages.append({"role": "assistant", "content": f"answer {t} " + "word " * 40})
    return [*messages, {"role": "user", "content": "and now?"}]


def half_window(server_url: str, tmp_path: Any, **upstream: Any) -> Any:
    config = make_config(
        server_url,
        tmp_path,
        policies={"half": {"strategy": "trim", "context_fraction": 0.5}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "half"}
        ],
    )
    import dataclasses

    local = dataclasses.replace(config.upstreams["default"], **upstream)
    return dataclasses.replace(config, upstreams={"default": local})


@pytest.mark.parametrize(
    ("fact", "asked"),
    [
        ({"n_ctx": 1000}, "/props"),  # llama.cpp
        ({"max_model_len": 1000}, "/v1/models"),  # vLLM (one model served)
        ({"num_ctx": 1000}, "/api/show"),  # Ollama
    ],
)
def test_context_fraction_uses_the_window_the_server_says(fake, start_proxy, tmp_path, fact, asked):
    upstream, server = fake
    for key, value in fact.items():
        setattr(upstream, key, value)
    if "max_model_len" in fact:
        upstream.served_model = LOCAL  # vLLM serves the name it was started with
    proxy = start_proxy(config=half_window(server.url, tmp_path))
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    for _ in range(2):
        raw = c.chat.completions.with_raw_response.create(model=LOCAL, messages=long_chat(12))
        assert int(raw.headers["x-context-tokens-before"]) > 1000
        assert 0 < int(raw.headers["x-context-tokens-after"]) <= 500
    # Asked once, then remembered.
    assert [r.path for r in upstream.received].count(asked) == 1


def test_a_configured_window_wins_and_the_server_is_not_asked(fake, start_proxy, tmp_path):
    upstream, server = fake
    upstream.n_ctx = 100_000
    proxy = start_proxy(
        config=half_window(server.url, tmp_path, context_windows={LOCAL: 1000}, context_window=9)
    )
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(model=LOCAL, messages=long_chat(12))
    assert 0 < int(raw.headers["x-context-tokens-after"]) <= 500
    assert "/props" not in [r.path for r in upstream.received]


def test_a_server_that_says_nothing_leaves_the_budget_unset(fake, start_proxy, tmp_path):
    upstream, server = fake
    proxy = start_proxy(config=half_window(server.url, tmp_path))
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(model=LOCAL, messages=long_chat(12))
    assert raw.headers["x-context-tokens-after"] == raw.headers["x-context-tokens-before"]
    c.chat.completions.create(model=LOCAL, messages=long_chat(1))
    # Not asked again on every request.
    assert [r.path for r in upstream.received].count("/props") == 1


def test_context_windows_config_is_checked_with_its_path():
    data = {
        "upstreams": {"u": {"base_url": "http://h/v1", "context_windows": {"m": 0}}},
        "routes": [{"upstream": "u"}],
    }
    with pytest.raises(Exception, match=r"upstreams\.u\.context_windows\.m: must be >= 1"):
        parse_config(data)

"""The proxy in front of a real llama.cpp server (llama-cpp-python, Gemma 3 270M, n_ctx 4096).

What the fakes cannot be: a real tokenizer and chat template, a real context
limit, real usage (and none in streams), a real model writing summaries. The
answers of a 270M model are barely sentences; the tests check what the proxy
does with them. Answers are kept short (``max_tokens``): the suite's CPUs are few.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.config.loader import parse_config
from proxy.context.summary_check import check_summary
from tests.harness import query
from tests.llama_server import N_CTX, LlamaServer

ANSWER_TOKENS = 8


def config(server: LlamaServer, tmp_path: Path, policy: dict[str, Any]) -> Any:
    return parse_config(
        {
            "store": {"path": str(tmp_path / "ctxproxy.db")},
            "upstreams": {
                "llama": {
                    "base_url": server.base_url,
                    "timeout_s": 900,
                    # llama-cpp-python's gemma format drops every system message.
                    "system_messages": "none",
                    "context_window": N_CTX,
                    "responses": "bridge",
                }
            },
            "routes": [
                {"match": {"path": "/v1/chat/completions"}, "upstream": "llama", "policy": "p"},
                {"match": {"path": "/v1/responses"}, "upstream": "llama", "policy": "passthrough"},
            ],
            "policies": {"p": policy},
        }
    )


def client(proxy: Any, session: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-local",
        max_retries=0,
        # A loaded 2-core machine evaluates a few hundred tokens a minute at worst.
        timeout=900,
        default_headers={"x-session-id": session},
    )


def history(turns: int) -> list[dict[str, Any]]:
    """A long chat: each turn ~120 Gemma tokens."""
    out: list[dict[str, Any]] = []
    for t in range(turns):
        topic = f"Item {t}: the shipment of {t * 7 + 3} blue crates to warehouse {t % 5}"
        out.append({"role": "user", "content": f"{topic}. " + "Please note the details. " * 8})
        out.append({"role": "assistant", "content": f"Noted item {t}. " + "Understood. " * 10})
    return out


def test_plain_and_streamed_answers_are_relayed_stored_and_calibrate(
    llama_server, start_proxy, tmp_path
):
    proxy = start_proxy(config=config(llama_server, tmp_path, {"strategy": "none"}))
    c = client(proxy, "plain")
    question = [{"role": "user", "content": "What is the capital of France?"}]
    answer = c.chat.completions.create(model="gemma", messages=question, max_tokens=ANSWER_TOKENS)
    text = answer.choices[0].message.content
    assert text and answer.usage is not None and answer.usage.prompt_tokens > 0

    c2 = client(proxy, "streamed")
    chunks = list(
        c2.chat.completions.create(
            model="gemma", messages=question, max_tokens=ANSWER_TOKENS, stream=True
        )
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed
    # llama-cpp-python sends no usage in a stream, even when asked.
    assert all(ch.usage is None for ch in chunks)
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    replies = [
        json.loads(r["message_json"])["content"]
        for r in query(db, "SELECT message_json FROM items WHERE role = 'assistant' ORDER BY id")
    ]
    assert replies == [text, streamed]
    # The first answer's usage seeded calibration; the server's own tokenizer counted
    # the streamed answer (/extras/tokenize/count), a second sample.
    proxy.loop.run(proxy.runtime.background.drain())
    [entry] = proxy.runtime.calibration.snapshot()
    assert entry["upstream"] == "llama" and entry["applied"]
    assert entry["samples"] == (2 if len(streamed) >= 40 else 1)
    assert 0.5 < entry["factor"] < 2.0


def test_a_history_past_n_ctx_is_answered_through_a_trim_and_calibration_holds_the_budget(
    llama_server, start_proxy, tmp_path
):
    messages = [*history(56), {"role": "user", "content": "Which items went to warehouse 2?"}]
    direct = httpx.post(
        f"{llama_server.base_url}/chat/completions",
        json={"model": "gemma", "messages": messages, "max_tokens": ANSWER_TOKENS},
        timeout=300,
    )
    assert direct.status_code == 400
    assert direct.json()["error"]["code"] == "context_length_exceeded"

    budget = 1200
    proxy = start_proxy(
        config=config(llama_server, tmp_path, {"strategy": "trim", "max_tokens": budget})
    )
    c = client(proxy, "long")
    first = c.chat.completions.with_raw_response.create(
        model="gemma", messages=messages[-9:], max_tokens=ANSWER_TOKENS
    )
    assert first.parse().usage.prompt_tokens > 0
    proxy.drain()
    # Calibrated from that first answer: a name never sent before, the same server.
    raw = c.chat.completions.with_raw_response.create(
        model="another-name", messages=messages, max_tokens=ANSWER_TOKENS
    )
    answer = raw.parse()
    assert int(raw.headers["x-context-turns-dropped"]) > 0
    assert answer.usage is not None and answer.usage.prompt_tokens <= budget
    assert int(raw.headers["x-context-tokens-before"]) > budget
    # It echoed both names back; it lists one model: every name is calibrated as that one.
    proxy.drain()
    proxy.loop.run(proxy.runtime.background.drain())
    calibration = proxy.runtime.calibration
    assert not calibration.ambiguous("llama")
    assert calibration.factor("a-third-name", "llama") != 1.0


def test_the_real_model_summary_is_stored_only_when_it_is_one(llama_server, start_proxy, tmp_path):
    policy = {
        "strategy": "summarize",
        "trigger": {"turns": 4},
        "keep_last_turns": 2,
        "prefetch": False,
        "summarizer": {"max_tokens": 64, "timeout_s": 600},
    }
    proxy = start_proxy(config=config(llama_server, tmp_path, policy))
    messages = [*history(5), {"role": "user", "content": "Summarize where we are."}]
    raw = client(proxy, "sum").chat.completions.with_raw_response.create(
        model="gemma", messages=messages, max_tokens=ANSWER_TOKENS
    )
    assert raw.http_response.status_code == 200
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    stored = query(db, "SELECT text FROM summaries")
    outcome = raw.headers["x-context-summary"]
    if outcome == "created":
        [summary] = stored
        transcript = "\n".join(m["content"] for m in messages[:-5])
        assert check_summary(summary["text"], transcript, "stop").reason is None
    else:
        # What a 270M model writes is often its input again, or runs out of tokens.
        assert outcome == "fallback"
        assert raw.headers["x-context-fallback"] in ("summarizer_echo", "summarizer_cut_off")
        assert stored == []
        assert int(raw.headers["x-context-turns-dropped"]) > 0


def test_a_responses_chain_through_the_bridge(llama_server, start_proxy, tmp_path):
    """Each chained turn replays the stored answer: as a string, which the server takes."""
    proxy = start_proxy(config=config(llama_server, tmp_path, {"strategy": "none"}))
    c = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-local", max_retries=0, timeout=300)
    previous = None
    for turn in ("My name is Ada.", "I live in Oslo.", "What is my name?"):
        chained = {"previous_response_id": previous} if previous else {}
        response = c.responses.create(
            model="gemma", input=turn, max_output_tokens=ANSWER_TOKENS, **chained
        )
        assert response.status in ("completed", "incomplete")
        previous = response.id
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT status, error FROM requests")
    assert [(r["status"], r["error"]) for r in rows] == [(200, None)] * 3


def test_tools_are_relayed_though_the_gemma_format_ignores_them(
    llama_server, start_proxy, tmp_path
):
    """llama-cpp-python's gemma chat format renders no tool definitions, so this model
    never calls one: a tool-carrying request and a tool result turn are relayed, and
    the stored history keeps the call and its result."""
    proxy = start_proxy(config=config(llama_server, tmp_path, {"strategy": "none"}))
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
    ]
    raw = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "gemma", "messages": messages, "tools": [weather], "max_tokens": 8},
        headers={"authorization": "Bearer sk-local", "x-session-id": "tools"},
        timeout=300,
    )
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT status, upstream_status, error FROM requests")
    assert [(r["status"], r["upstream_status"]) for r in rows] == [(raw.status_code,) * 2]
    if raw.status_code != 200:
        # The gemma format has no tool role: the server's 500 is named in the row.
        assert raw.status_code == 500 and rows[0]["error"]
        pytest.xfail("llama-cpp-python's gemma format cannot render a tool message")
    stored = [
        json.loads(r["message_json"])
        for r in query(tmp_path / "ctxproxy.db", "SELECT message_json FROM items ORDER BY id")
    ]
    assert stored[1]["tool_calls"] == [call] and stored[2]["content"] == "4 degrees, rain"

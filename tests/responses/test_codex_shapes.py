"""A Codex-shaped session through a trim + mask + recall route, end to end.

Codex resends its whole history every turn (``store: false``, no
``previous_response_id``), with reasoning carried as ``encrypted_content``,
namespaced and custom tool calls, web searches and item types the proxy has
never seen. The fake upstream records what reached it; every request is
checked: no call without its output (by ``call_id``), every reasoning item
right before the item it came with, every item the policy did not mask
forwarded exactly as Codex sent it, Codex's top-level fields untouched. An
early command output, trimmed away, comes back by recall when asked about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from policies.recall import BLOCK_OPEN
from tests import codex_items as codex
from tests.fakes.responses import FakeResponses
from tests.harness import AiohttpServer, ProxyServer, make_config, query

POLICY = {
    "codex": {
        "strategy": "trim",
        "max_tokens": 6000,
        "low_water": 0.6,
        "mask_tool_outputs": {"after_turns": 2, "min_tokens": 64, "step_tokens": 0},
        "recall": {"max_tokens": 900, "neighbors": 0},
    }
}
ROUTES = [{"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "codex"}]
FACT = "config/db.toml: DATABASE_PORT = 54329 (the staging database listens there)"
QUESTION = "Which port does config/db.toml set for the staging database?"
TURNS = 12


@pytest.fixture
def proxy(start_proxy, responses_upstream: tuple[FakeResponses, AiohttpServer], tmp_path: Path):
    url = responses_upstream[1].url
    return start_proxy(config=make_config(url, tmp_path, policies=POLICY, routes=ROUTES))


def send(
    proxy: ProxyServer, items: list[dict[str, Any]], window: int, *, stream: bool = False
) -> httpx.Response:
    answer = httpx.post(
        f"{proxy.url}/v1/responses",
        json=codex.body(items, stream=stream),
        headers={"authorization": "Bearer sk-codex", **codex.headers(window)},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer


def as_codex_resends(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's output items as Codex puts them in its next request (no ids, text only)."""
    return [
        codex.assistant("".join(p["text"] for p in o["content"]))
        for o in output
        if o["type"] == "message"
    ]


def check_forwarded(sent: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, int]:
    """What one request carried upstream, against the history Codex sent; counts of what
    the proxy changed (masked outputs, the recall block)."""
    for key in ("include", "client_metadata", "store", "tools", "reasoning", "prompt_cache_key"):
        assert sent[key] == codex.body(history)[key], key
    assert set(sent) == set(codex.body(history))  # no field added or lost
    items = sent["input"]
    assert not codex.pairing_problems(items)
    masked = recalled = 0
    for k, item in enumerate(items):
        if item in history:
            if item["type"] == "reasoning":
                follower = history[history.index(item) + 1]
                assert items[k + 1] == follower, "reasoning split from its item"
            continue
        if isinstance(item.get("content"), str) and BLOCK_OPEN in item["content"]:
            recalled += 1
            continue
        # Otherwise only a masked tool output: the original with the placeholder as output.
        originals = [h for h in history if h.get("call_id") == item.get("call_id")]
        original = next(h for h in originals if h["type"] == item["type"])
        assert {**item, "output": None} == {**original, "output": None}
        assert item["output"].startswith("[tool output of ")
        masked += 1
    return {"masked": masked, "recalled": recalled}


def test_a_codex_session_keeps_its_pairs_whole_through_trim_mask_and_recall(
    proxy, responses_upstream, tmp_path
):
    fake, _ = responses_upstream
    history: list[dict[str, Any]] = [codex.developer("<permissions instructions>sandboxed")]
    seen = {"masked": 0, "dropped": 0}
    for t in range(1, TURNS + 1):
        # Turn 1's listing is short enough to come back whole within the recall budget.
        history += codex.turn(t, FACT, lines=12) if t == 1 else codex.turn(t)
        answer = send(proxy, history, window=t // 5)
        proxy.drain()
        changed = check_forwarded(fake.last, history)
        seen["masked"] = max(seen["masked"], changed["masked"])
        seen["dropped"] = max(seen["dropped"], int(answer.headers["x-context-turns-dropped"]))
        assert int(answer.headers.get("x-context-tool-outputs-masked", "0")) == changed["masked"]
        history += as_codex_resends(answer.json()["output"])
    assert seen["masked"] > 0 and seen["dropped"] > 0

    # Unknown items and web searches of the kept turns reached the upstream as they came.
    kinds = [i.get("type") for i in fake.last["input"]]
    assert "future_item" in kinds and "web_search_call" in kinds and "custom_tool_call" in kinds
    assert codex.unknown(TURNS) in fake.last["input"]

    # The question: turn 1's command output was trimmed away; recall brings the whole
    # unit back (reasoning, the call and its output), quoted before the question.
    history.append(codex.user(QUESTION))
    answer = send(proxy, history, window=3, stream=True)  # as Codex asks: streamed
    proxy.drain()
    assert "event: response.completed" in answer.text
    assert answer.headers["x-context-recall"] == "recalled"
    assert answer.headers["x-session-id"] == codex.THREAD
    items = fake.last["input"]
    assert check_forwarded(fake.last, history)["recalled"] == 1
    assert not any(i.get("call_id") == "call_exec_1" for i in items)  # not as items
    block = next(i for i in items if BLOCK_OPEN in str(i.get("content")))
    assert items.index(block) == len(items) - 2
    lines = [json.loads(line) for line in block["content"].splitlines() if line.startswith("{")]
    quoted = {line["role"]: line for line in lines if line.get("call_id") == "call_exec_1"}
    assert FACT in quoted["function_call_output"]["text"]
    assert "ls -la src/module_1" in quoted["function_call"]["text"]
    assert items[-1] == codex.user(QUESTION)

    # One session across the windows; Codex's items stored whole, encrypted reasoning too.
    sessions = query(tmp_path / "ctxproxy.db", "SELECT key FROM sessions")
    assert [s["key"] for s in sessions] == [codex.THREAD]
    stored = query(tmp_path / "ctxproxy.db", "SELECT role, message_json FROM items ORDER BY id")
    roles = [r["role"] for r in stored]
    assert roles.count("custom_tool_call") == TURNS == roles.count("custom_tool_call_output")
    assert roles.count("future_item") == TURNS
    first_reasoning = next(
        json.loads(r["message_json"]) for r in stored if r["role"] == "reasoning"
    )
    assert first_reasoning == codex.reasoning("Listing module 1", 10)
